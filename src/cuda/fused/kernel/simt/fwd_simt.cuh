// The SIMT forward: neighborhood attention on the CUDA cores (FFMA), one query per thread,
// computing exactly the needed pairs.
//
// For small windows and head dims the tensor-core kernels multiply mostly masked pairs: a
// 64-query tile of 7x7 windows visits about 4x the 49 neighbors per query, a 256-query tile about
// 10x, and their per-tile fixed costs (copies, barriers, the mask) dominate at head dim 32. Here a
// CTA owns a query tile (QT, shaped like the grid) of one (batch, head, dilation group), copies the
// union of its queries' windows (the halo) into shared memory once with cp.async while each
// thread loads its query row into registers (pre-scaled by scale * log2(e)), and then every thread
// walks its own window, 8 keys at a time: 8 dot products (float32 FMAs on K rows widened from
// shared memory), the chunk's max, one rescale of O, exp2 on the SFU and O += p V. The window walk
// is the definition's (nbr::window per axis, row-major over the window box, last axis fastest),
// so dilation (one CTA per group), stride and causal windows need nothing more. Every thread's
// window has its own size only where an axis is causal; elsewhere the walk is warp-uniform.
//
// Shared memory: K and V rows of the halo, row-major over its box, each row kD 16-bit elements
// and 16 bytes of padding (simt_plan.h), zero-filled past D / D_v. Lanes of a warp are
// consecutive queries on the last axis, so at one window offset they read consecutive halo rows:
// with the odd number of 16-byte chunks per row a quarter warp's eight 16-byte loads hit eight
// distinct bank groups; queries that share a key (stride, clamped borders) read it by broadcast.
// 16-bit only, no additional keys (the plan checks). A relative positional bias (kBias) is read
// per key from the head's table in global memory (its entry stepped with the walk).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/fwd_common.cuh"
#include "cuda/fused/kernel/common/simt_plan.h"

namespace fna {
namespace fused {

// Two 16-bit elements widened to float32.
__device__ __forceinline__ float2 simt_widen(uint32_t w, mma::BF16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 simt_widen(uint32_t w, mma::F16) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

template <int kD, int kThreads>
struct SimtTraits {
  static constexpr int kChunks = kD / 8;           // 16-byte chunks of a row
  static constexpr int kPitch = simt_row_bytes(kD) / 2;  // elements per shared row
  static constexpr int kKeys = kSimtKeys;          // keys per softmax step
  // At most simt_registers(kD) registers a thread (128 at head dim 32, 255 at 64).
  static constexpr int kMinBlocks = 65536 / (simt_registers(kD) * kThreads) > 0
                                        ? 65536 / (simt_registers(kD) * kThreads)
                                        : 1;
};

template <class T, int kD, int kRank, class QT, bool kBias>
__global__ void __launch_bounds__(QT::kSize, (SimtTraits<kD, QT::kSize>::kMinBlocks))
    fna_fwd_simt_kernel(const FwdParams p, int halo_cap) {
  using Tr = SimtTraits<kD, QT::kSize>;
  using Elem = typename T::type;
  constexpr int kChunks = Tr::kChunks, kPitch = Tr::kPitch, kC = Tr::kKeys;
  constexpr int kFirst = kAxes - kRank;  // axes below it are lifted (coordinate 0)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sK = reinterpret_cast<Elem*>(smem_raw);
  Elem* sV = sK + size_t(halo_cap) * kPitch;

  FwdTile ft;
  if (!fwd_tile<QT>(p, blockIdx.x, ft)) return;
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int hkv = ft.h / p.heads_per_kv;

  // The halo: the union of the tile's windows on each axis.
  nbr::Range u[kAxes];
  int hn[kAxes];
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    u[ax] = nbr::tile_union(geo.axis[ax], gr.len[ax], ft.qo[ax],
                            min(ft.qo[ax] + QT::ext(ax), gr.len[ax]));
    hn[ax] = u[ax].size();
  }
  const int rows = hn[0] * hn[1] * hn[2];

  // Copies: one 16-byte chunk per thread and step, zero-filled past the head dims.
  const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
  const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];
  for (int i = threadIdx.x; i < rows * kChunks; i += QT::kSize) {
    const int row = i / kChunks, ch = i % kChunks;
    int c[kAxes];
    c[2] = row % hn[2] + u[2].begin;
    const int r12 = row / hn[2];
    c[1] = r12 % hn[1] + u[1].begin;
    c[0] = r12 / hn[1] + u[0].begin;
    const bool kin = ch * 8 < p.dim, vin = ch * 8 < p.dim_v;
    mma::cp_async_16(mma::smem_u32(sK + row * kPitch + ch * 8),
                kin ? gK + token_offset<kFirst>(geo, gr, c, p.k_stride) + ch * 8 : gK, kin);
    mma::cp_async_16(mma::smem_u32(sV + row * kPitch + ch * 8),
                vin ? gV + token_offset<kFirst>(geo, gr, c, p.v_stride) + ch * 8 : gV, vin);
  }
  mma::cp_async_commit();

  // This thread's query, pre-scaled, while the copies fly.
  int qc[kAxes];
  QT::coord(threadIdx.x, qc);
  bool valid = true;
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    qc[ax] += ft.qo[ax];
    valid = valid && qc[ax] < gr.len[ax];
  }
  float q[kD];
  if (valid) {
    const Elem* gq = static_cast<const Elem*>(p.q) + ft.b * p.q_stride[0] + ft.h * p.q_stride[4] +
                     token_offset<kFirst>(geo, gr, qc, p.q_stride);
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      uint4 w = make_uint4(0, 0, 0, 0);
      if (ch * 8 < p.dim) w = *reinterpret_cast<const uint4*>(gq + ch * 8);
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = simt_widen(ws[e], T{});
        q[ch * 8 + 2 * e] = f.x * p.scale_log2;
        q[ch * 8 + 2 * e + 1] = f.y * p.scale_log2;
      }
    }
  }
  // The window, relative to the halo.
  int wn[kAxes], ws[kAxes];
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    const nbr::Range w = nbr::window(geo.axis[ax], gr.len[ax], valid ? qc[ax] : ft.qo[ax]);
    ws[ax] = w.begin - u[ax].begin;
    wn[ax] = w.size();
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  if (!valid) return;

  const int total = wn[0] * wn[1] * wn[2];
  int row = (ws[0] * hn[1] + ws[1]) * hn[2] + ws[2];
  int c1 = 0, c2 = 0;  // position inside the window on axes 1 and 2
  const int step1 = hn[2] - wn[2], step0 = (hn[1] - wn[1]) * hn[2];
  // kBias: the table entry of the walk's key (nbr::bias_index per axis: key - query + K - 1),
  // stepped with the walk (unit stride on the last axis), and the head's table.
  const float* tab = kBias ? p.rpb + ft.h * p.rpb_stride[0] : nullptr;
  int bias = 0, bstep1 = 0, bstep0 = 0;
  if constexpr (kBias) {
#pragma unroll
    for (int ax = kFirst; ax < kAxes; ++ax)
      bias += (ws[ax] + u[ax].begin - qc[ax] + geo.axis[ax].kernel - 1) * p.rpb_stride[1 + ax];
    bstep1 = p.rpb_stride[1 + 1] - wn[2];
    bstep0 = p.rpb_stride[1 + 0] - wn[1] * p.rpb_stride[1 + 1];
  }
  float m = -INFINITY, l = 0.f;
  float acc[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d) acc[d] = 0.f;

  for (int t0 = 0; t0 < total; t0 += kC) {
    // The chunk's rows (past the window's end: its first row, masked) and bias entries.
    int r[kC], bi[kC];
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      r[j] = j == 0 || t0 + j < total ? row : r[0];
      bi[j] = bias;
      if (t0 + j < total) {
        ++row;
        ++bias;
        if (++c2 == wn[2]) {
          c2 = 0;
          row += step1;
          bias += bstep1;
          if (++c1 == wn[1]) {
            c1 = 0;
            row += step0;
            bias += bstep0;
          }
        }
      }
    }
    float s[kC];
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const uint4* kr = reinterpret_cast<const uint4*>(sK + r[j] * kPitch);
      float a = 0.f;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        const uint4 w = kr[ch];
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = simt_widen(wv[e], T{});
          a = fmaf(q[ch * 8 + 2 * e], f.x, a);
          a = fmaf(q[ch * 8 + 2 * e + 1], f.y, a);
        }
      }
      if constexpr (kBias) {
        if (t0 + j < total) a = fmaf(__ldg(tab + bi[j]), 1.4426950408889634f, a);
      }
      s[j] = t0 + j < total ? a : -INFINITY;
    }
    float mc = s[0];
#pragma unroll
    for (int j = 1; j < kC; ++j) mc = fmaxf(mc, s[j]);
    const float mn = fmaxf(m, mc);
    const float alpha = mma::fast_exp2(m - mn);  // 0 on the first chunk (m = -inf)
    m = mn;
    l *= alpha;
#pragma unroll
    for (int d = 0; d < kD; ++d) acc[d] *= alpha;
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const float pj = mma::fast_exp2(s[j] - mn);
      l += pj;
      const uint4* vr = reinterpret_cast<const uint4*>(sV + r[j] * kPitch);
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        const uint4 w = vr[ch];
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = simt_widen(wv[e], T{});
          acc[ch * 8 + 2 * e] = fmaf(pj, f.x, acc[ch * 8 + 2 * e]);
          acc[ch * 8 + 2 * e + 1] = fmaf(pj, f.y, acc[ch * 8 + 2 * e + 1]);
        }
      }
    }
  }

  // Epilogue: O / l, LSE = ln(sum exp(scale * s)).
  const float inv = 1.f / l;
  Elem* go = static_cast<Elem*>(p.o) + ft.b * p.o_stride[0] + ft.h * p.o_stride[4] +
             token_offset<kFirst>(geo, gr, qc, p.o_stride);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    if (ch * 8 >= p.dim_v) break;
    uint4 w;
    w.x = mma::pack2<T>(acc[ch * 8 + 0] * inv, acc[ch * 8 + 1] * inv);
    w.y = mma::pack2<T>(acc[ch * 8 + 2] * inv, acc[ch * 8 + 3] * inv);
    w.z = mma::pack2<T>(acc[ch * 8 + 4] * inv, acc[ch * 8 + 5] * inv);
    w.w = mma::pack2<T>(acc[ch * 8 + 6] * inv, acc[ch * 8 + 7] * inv);
    *reinterpret_cast<uint4*>(go + ch * 8) = w;
  }
  if (p.lse != nullptr) {
    float* lse = p.lse + ft.b * p.lse_stride[0] + ft.h * p.lse_stride[4] +
                 token_offset<kFirst>(geo, gr, qc, p.lse_stride);
    *lse = (m + log2f(l)) * 0.69314718055994531f;
  }
}

template <class T, int kD, int kRank, class QT>
cudaError_t launch_fwd_simt(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  auto kernel = p.rpb != nullptr ? fna_fwd_simt_kernel<T, kD, kRank, QT, true>
                                 : fna_fwd_simt_kernel<T, kD, kRank, QT, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, QT::kSize, l.smem, stream>>>(p, l.halo_cap);
  return cudaGetLastError();
}

template <class T, int kD, int kRank, class QT>
size_t fwd_simt_smem_bytes() {
  return size_t(2) * QT::kSize * simt_row_bytes(kD);  // a lower bound: the tile's own rows
}

// Instantiates one row of configs/forward.h's SIMT table (the build's generated files expand it).
#define FNA_FWD_SIMT_INSTANTIATE(R, D, Q0, Q1, Q2, DT)                                          \
  template cudaError_t launch_fwd_simt<mma::DT, D, R, Tile<Q0, Q1, Q2>>(                        \
      const FwdParams&, const FwdLaunch&, cudaStream_t);                                         \
  template size_t fwd_simt_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>>();

}  // namespace fused
}  // namespace fna
