// The cpu backend's tile kernels alone (avx512 set), on an interior tile pair of issue 2's problem
// (13x13 windows, D = 64, 32 queries per tile, the second line's key rows the first's shifted by
// one, Q / O rows 1 KB apart as in the caller's heads-last tensors): the pair as two single calls
// (A) and as one paired call (B), alternating in blocks of 50 calls, each block next to a
// register-only FMA loop of the same moment. Prints each's median % of that peak (the tile's
// useful FLOPs: 4 * T * 169 * 64 forward, 2.5x that backward) and the median B/A. With
// POLL=<bytes>, a buffer of that size is swept before every call (4 MB evicts the L2: what the
// kernels lose when their panels are not in L2).
//   g++ -O3 -std=c++17 -Iinclude -Isrc tools/experiments/cpu_tile_bench.cpp -o /tmp/fna_tile_bench
//   /tmp/fna_tile_bench [blocks = 20] [0: forward, 1: backward]
#include <x86intrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/tile.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
#define FNA_CPU_ISA avx512
#define FNA_CPU_VW 16
#include "cpu/kernels_impl.h"
#pragma GCC pop_options

namespace {

using namespace fna::cpu;

// FMAs per TSC tick of 10 independent AVX-512 FMA chains (registers zeroed first: no denormals).
#define PEAK_FMA(N) "vfmadd231ps %%zmm1, %%zmm2, %%zmm" #N "\n\t"
__attribute__((target("avx512f"))) double fma_per_tick() {
  asm volatile("vxorps %%zmm1, %%zmm1, %%zmm1\n\tvxorps %%zmm2, %%zmm2, %%zmm2\n\t"
               "vxorps %%zmm3, %%zmm3, %%zmm3\n\tvmovaps %%zmm3, %%zmm4\n\tvmovaps %%zmm3, %%zmm5\n\t"
               "vmovaps %%zmm3, %%zmm6\n\tvmovaps %%zmm3, %%zmm7\n\tvmovaps %%zmm3, %%zmm8\n\t"
               "vmovaps %%zmm3, %%zmm9\n\tvmovaps %%zmm3, %%zmm10\n\tvmovaps %%zmm3, %%zmm11\n\t"
               "vmovaps %%zmm3, %%zmm12" ::: "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
               "xmm9", "xmm10", "xmm11", "xmm12");
  const unsigned long long t0 = __rdtsc();
  for (int k = 0; k < 20000; ++k)
    asm volatile(PEAK_FMA(3) PEAK_FMA(4) PEAK_FMA(5) PEAK_FMA(6) PEAK_FMA(7) PEAK_FMA(8) PEAK_FMA(9) PEAK_FMA(10)
                     PEAK_FMA(11) PEAK_FMA(12) ::: "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                 "xmm10", "xmm11", "xmm12");
  return 200000.0 / static_cast<double>(__rdtsc() - t0);
}
#undef PEAK_FMA

float* floats(size_t n) {
  float* p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const bool bwd = argc > 2 && std::atoi(argv[2]) != 0;
  const size_t poll_n = (std::getenv("POLL") ? std::atol(std::getenv("POLL")) : 0) / sizeof(float);
  constexpr int K = 13, D = 64, T = 32, R = 13, pitch = 144, tokens = 128, row = 256, i0 = 32, u0 = i0 - K / 2;
  TileShape s;
  s.T = T;
  s.R = R;
  s.M = T + K - 1;
  s.D = s.Dp = s.Dv = s.Dvp = D;
  for (int t = 0; t < T; ++t) s.col_begin[t] = t, s.col_count[t] = K;
  // R + 1 key rows (the pair's union), each a ring slot of four panels: K^T, V, K, V^T; dK, dV.
  const size_t slot = size_t(4) * D * pitch;
  float* ring = floats((R + 1) * slot);
  float* acc = floats(size_t(2) * (R + 1) * pitch * D);
  std::vector<const float*> kt(R + 1), vr(R + 1), kr(R + 1), vt(R + 1);
  std::vector<float*> dk(R + 1), dv(R + 1);
  for (int r = 0; r <= R; ++r) {
    float* b = ring + r * slot;
    kt[r] = b + u0;
    vr[r] = b + D * pitch + u0 * D;
    kr[r] = b + 2 * D * pitch + u0 * D;
    vt[r] = b + 3 * D * pitch + u0;
    dk[r] = acc + size_t(r) * pitch * D + u0 * D;
    dv[r] = acc + size_t(R + 1 + r) * pitch * D + u0 * D;
  }
  ForwardTile ft[2];
  BackwardTile bt[2];
  for (int k = 0; k < 2; ++k) {  // tile k: line k, rows k .. k + R - 1 of the union
    float* q = floats(size_t(tokens) * row) + i0 * row;
    float* o = floats(size_t(tokens) * row) + i0 * row;
    float* d_o = floats(size_t(tokens) * row) + i0 * row;
    float* dq = floats(size_t(tokens) * row) + i0 * row;
    float* lse = floats(T);
    for (int t = 0; t < T; ++t) lse[t] = 3.f;
    ForwardTile& f = ft[k];
    f.s = s;
    f.pitch = pitch;
    f.scale_log2 = 0.125f * 1.4426950f;
    f.q_pitch = f.o_pitch = row;
    f.q = q;
    f.o = o;
    f.kt_rows = kt.data() + k;
    f.v_rows = vr.data() + k;
    f.add_k = f.add_v = nullptr;
    f.lse = floats(T);
    f.scratch = floats(size_t(T) * R * 32 + T);
    BackwardTile& b = bt[k];
    b.s = s;
    b.pitch = pitch;
    b.scale = 0.125f;
    b.scale_log2 = 0.125f * 1.4426950f;
    b.q_pitch = b.do_pitch = b.o_pitch = b.dq_pitch = row;
    b.q = q;
    b.d_o = d_o;
    b.o = o;
    b.dq = dq;
    b.delta = floats(T);
    b.lse2 = lse;
    b.kt_rows = kt.data() + k;
    b.k_rows = kr.data() + k;
    b.vt_rows = vt.data() + k;
    b.dk_rows = dk.data() + k;
    b.dv_rows = dv.data() + k;
    b.add_k = b.add_v = nullptr;
    b.d_add_k = b.d_add_v = nullptr;
    b.p = floats(size_t(T) * R * 32);
    b.ds = floats(size_t(T) * R * 32);
    b.p_add = b.ds_add = nullptr;
  }
  float* poll = floats(poll_n + 1);
  const double fmas = 2.0 * T * K * K * D * (bwd ? 2.5 : 1.0) * 4 / 32;  // the pair's, in 16-lane FMAs
  std::vector<double> eff[2], ratio;
  for (int blk = 0; blk < blocks; ++blk) {
    double ticks[2];
    for (int v = 0; v < 2; ++v) {
      const double peak = fma_per_tick();
      std::vector<double> t;
      for (int i = 0; i < 50; ++i) {
        for (size_t j = 0; j < poll_n; j += 16) poll[j] += 1.f;
        const unsigned long long t0 = __rdtsc();
        if (v == 0) {
          for (int k = 0; k < 2; ++k) bwd ? avx512::backward_tiles(&bt[k], 1) : avx512::forward_tiles(&ft[k], 1);
        } else {
          bwd ? avx512::backward_tiles(bt, 2) : avx512::forward_tiles(ft, 2);
        }
        t.push_back(static_cast<double>(__rdtsc() - t0));
      }
      ticks[v] = median(t);
      eff[v].push_back(fmas / ticks[v] / peak);
    }
    ratio.push_back(ticks[1] / ticks[0]);
  }
  std::printf("%s pair: singles %.1f%%, paired %.1f%% of the FMA peak; paired / singles %.3f (median of %d blocks)\n",
              bwd ? "backward" : "forward", 100 * median(eff[0]), 100 * median(eff[1]), median(ratio), blocks);
}
