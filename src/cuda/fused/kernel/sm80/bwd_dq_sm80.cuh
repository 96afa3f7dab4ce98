// dQ kernel of the fused backward, deterministic: a CTA owns one multi-dimensional query tile of
// one (batch, head, dilation group) and visits the key/value tiles covering the union of its
// windows (like the forward), then the additional keys, recomputing S, P, dP and dS; dQ stays in
// registers and is written once. Each warp owns 16 queries. kBias: the call has a relative
// positional bias (p.rpb), added to the logits of neighborhood pairs as the forward adds it.
#pragma once

#include <cuda_runtime.h>

#include "cuda/fused/kernel/common/bwd_mma.cuh"
#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

template <typename T, int kD, int kWarps, int kKV>
struct DqTraits {
  using E = typename Elem<T>::type;
  static constexpr bool kF32 = Elem<T>::kF32;
  static constexpr int kQ = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDh = kD * int(sizeof(E)) / 2;  // a row in 16-bit units (Swizzled<kDh>)
  static constexpr int kChunks = kDh / 8;
  static constexpr size_t kSmem = size_t(2 * kQ + 4 * kKV) * kD * sizeof(E) +
                                  kKV * sizeof(uint32_t) + kQ * kAxes * sizeof(int2);
};

template <typename T, int kD, int kWarps, int kKV, bool kBias = false>
__global__ void __launch_bounds__(32 * kWarps, 2) dq_kernel(const Params p) {
  using Tr = DqTraits<T, kD, kWarps, kKV>;
  using E = typename Tr::E;
  constexpr bool kF32 = Tr::kF32;
  constexpr int kDh = Tr::kDh;
  constexpr int kQ = Tr::kQ, kThreads = Tr::kThreads, kChunks = Tr::kChunks;
  constexpr int kNB = kKV / 8;  // n8 blocks of keys
  constexpr int kDB = kD / 8;   // n8 blocks of the head dim

  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sdO = sQ + kQ * kD;
  E* sK = sdO + kQ * kD;      // [2][kKV][kD]
  E* sV = sK + 2 * kKV * kD;  // [2][kKV][kD]
  uint32_t* s_koff = reinterpret_cast<uint32_t*>(sV + 2 * kKV * kD);
  int2* s_qwin = reinterpret_cast<int2*>(s_koff + kKV);  // [kQ][kAxes]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  unsigned y = grid_row();  // unsigned divisions: rows may pass 2^31 (fold_rows)
  if (y >= unsigned(p.batch) * unsigned(p.heads) * unsigned(p.groups))
    return;  // the row fold's padding
  const int group = int(y % unsigned(p.groups));
  y /= unsigned(p.groups);
  const int h = int(y % unsigned(p.heads));
  const int b = int(y / unsigned(p.heads));
  const int hkv = h / p.heads_per_kv;
  const Group G = Group::of(p.geo, group, p.dil);
  int q0[kAxes];
  {
    const int x = blockIdx.x;
    for (int a = 0; a < kAxes; ++a) {
      q0[a] = (p.tile0[a] + x / p.tdiv[a] % p.tiles[a]) * p.tq[a];
      if (q0[a] >= G.len[a]) return;
    }
  }

  // ---- the query tile, once; its windows for the mask --------------------------------------------
  const E* gQ = static_cast<const E*>(p.q);
  const E* gdO = static_cast<const E*>(p.d_o);
  for (int idx = tid; idx < kQ * kChunks; idx += kThreads) {
    const int row = idx / kChunks, c = idx % kChunks;
    const uint32_t off = pack_offsets(p.tq, row);
    int i[kAxes], x[kAxes];
    for (int a = 0; a < kAxes; ++a) i[a] = q0[a] + unpack_offset(off, a);
    const bool valid = query_global(p, G, i, x);
    const int so = Swizzled<kDh>::offset(row, c) * 2 / int(sizeof(E));
    load_chunk(sQ + so, valid ? gQ + tok_offset(p.sq, b, x, h) : nullptr, c, p.dim, p.aligned, gQ);
    load_chunk(sdO + so, valid ? gdO + tok_offset(p.sdo, b, x, h) : nullptr, c, p.dim_v,
               p.aligned, gdO);
    if (c == 0) {
      for (int a = 0; a < kAxes; ++a) {
        const nbr::Range r = valid ? nbr::window(p.geo.axis[a], G.len[a], i[a]) : nbr::Range{0, 0};
        s_qwin[row * kAxes + a] = make_int2(r.begin, r.end);
      }
    }
  }
  cp_async_commit();
  if (tid < kKV) s_koff[tid] = pack_offsets(p.tkv, tid);

  // Statistics of this thread's two query rows.
  const int wrow = warp * 16;
  float lse2[2], dsum[2];
  int qb[2] = {0, 0};  // bias: the rows' table offsets (sum of coordinate x table stride)
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + (lane >> 2) + half * 8;
    const uint32_t off = pack_offsets(p.tq, row);
    int i[kAxes], x[kAxes];
    for (int a = 0; a < kAxes; ++a) i[a] = q0[a] + unpack_offset(off, a);
    if constexpr (kBias)
      for (int a = 0; a < kAxes; ++a) qb[half] += i[a] * p.rpb_stride[1 + a];
    float2 st = make_float2(INFINITY, 0.f);
    if (query_global(p, G, i, x))
      st = p.stats[(int64_t(b) * p.tokens + token_index(p, x)) * p.heads + h];
    lse2[half] = st.x;
    dsum[half] = st.y;
  }

  // Key tiles to visit: the union of the tile's windows, per axis, then the additional keys.
  nbr::Range kr[kAxes];
  int nk[kAxes];
  bool q_inside = true;
  int n_nbr = 1;
  nbr::Range meet[kAxes];
  for (int a = 0; a < kAxes; ++a) {
    const int q1 = min(q0[a] + p.tq[a], G.len[a]);
    q_inside = q_inside && q0[a] + p.tq[a] <= G.len[a];
    kr[a] = nbr::tile_union(p.geo.axis[a], G.len[a], q0[a], q1);
    meet[a] = nbr::tile_intersection(p.geo.axis[a], G.len[a], q0[a], q1);
    nk[a] = (kr[a].size() + p.tkv[a] - 1) / p.tkv[a];
    n_nbr *= nk[a];
  }
  const int n_add = (p.num_add + kKV - 1) / kKV;
  const int n_iter = n_nbr + n_add;

  auto tile_origin = [&](int it, int* k0) {
    for (int a = kAxes - 1; a >= 0; --a) {
      k0[a] = kr[a].begin + (it % nk[a]) * p.tkv[a];
      it /= nk[a];
    }
  };

  const E* gK = static_cast<const E*>(p.k);
  const E* gV = static_cast<const E*>(p.v);
  const E* gaK = static_cast<const E*>(p.add_k);
  const E* gaV = static_cast<const E*>(p.add_v);
  auto load_kv_tile = [&](int it, int buf) {
    E* dK_ = sK + buf * kKV * kD;
    E* dV_ = sV + buf * kKV * kD;
    int k0[kAxes];
    if (it < n_nbr) tile_origin(it, k0);
    for (int idx = tid; idx < kKV * kChunks; idx += kThreads) {
      const int row = idx / kChunks, c = idx % kChunks;
      bool valid;
      const E *srcK, *srcV;
      if (it < n_nbr) {
        const uint32_t off = s_koff[row];
        int i[kAxes], x[kAxes];
        for (int a = 0; a < kAxes; ++a) i[a] = k0[a] + unpack_offset(off, a);
        valid = to_global(p, G, i, x);
        srcK = gK + tok_offset(p.sk, b, x, hkv);
        srcV = gV + tok_offset(p.sv, b, x, hkv);
      } else {
        const int64_t n = int64_t(it - n_nbr) * kKV + row;
        valid = n < p.num_add;
        srcK = gaK + b * p.sak.b + n * p.sak.n + hkv * p.sak.h;
        srcV = gaV + b * p.sav.b + n * p.sav.n + hkv * p.sav.h;
      }
      const int so = Swizzled<kDh>::offset(row, c) * 2 / int(sizeof(E));
      load_chunk(dK_ + so, valid ? srcK : nullptr, c, p.dim, p.aligned, gQ);
      load_chunk(dV_ + so, valid ? srcV : nullptr, c, p.dim_v, p.aligned, gQ);
    }
    cp_async_commit();
  };

  float acc[kDB][4];
#pragma unroll
  for (int n = 0; n < kDB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

  const uint32_t baseQ = smem_u32(sQ), baseO = smem_u32(sdO);
  __syncthreads();  // s_koff
  if (n_iter > 0) load_kv_tile(0, 0);
  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < n_iter) load_kv_tile(it + 1, buf ^ 1);
    const uint32_t baseK = smem_u32(sK + buf * kKV * kD), baseV = smem_u32(sV + buf * kKV * kD);

    // Mask policy of this tile: none inside every window, the windows on border tiles, the
    // count on the last additional tile.
    int k0[kAxes] = {0, 0, 0};
    bool masked;
    int add_left = 0;
    if (it < n_nbr) {
      tile_origin(it, k0);
      masked = !q_inside;
      for (int a = 0; a < kAxes; ++a)
        masked = masked || k0[a] < meet[a].begin || k0[a] + p.tkv[a] > meet[a].end ||
                 k0[a] + p.tkv[a] > G.len[a];
    } else {
      add_left = p.num_add - (it - n_nbr) * kKV;
      masked = add_left < kKV;
    }

    float s[kNB][4], dp[kNB][4];
#pragma unroll
    for (int n = 0; n < kNB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f, dp[n][e] = 0.f;
    // Bias: the table of head h and the tile's key origin (offset K - 1 per axis).
    const float* tab = kBias && it < n_nbr ? p.rpb + int64_t(h) * p.rpb_stride[0] : nullptr;
    int kbase = 0;
    if constexpr (kBias)
      for (int a = 0; a < kAxes; ++a)
        kbase += (k0[a] + p.geo.axis[a].kernel - 1) * p.rpb_stride[1 + a];

    // kd counts 16-bit units: a k16 step of 16-bit data, a k8 step of float32 (TF32 mma).
#pragma unroll
    for (int kd = 0; kd < kDh; kd += 16) {
      uint32_t a[4], bb[4];
      if constexpr (kF32) {
        uint32_t ab[4], as[4], b[4], bs[4];
        load_a<kDh>(a, baseQ, wrow, kd, lane);
        tf32_frag<T>(a, ab, as);
#pragma unroll
        for (int n = 0; n < kNB; n += 2) {
          load_b_nk<kDh>(bb, baseK, n * 8, kd, lane);
          tf32_frag<T>(bb, b, bs);
          mma_tf32<T, (kD >= 128)>(s[n], ab, as, b[0], b[1], bs[0], bs[1]);
          mma_tf32<T, (kD >= 128)>(s[n + 1], ab, as, b[2], b[3], bs[2], bs[3]);
        }
        load_a<kDh>(a, baseO, wrow, kd, lane);
        tf32_frag<T>(a, ab, as);
#pragma unroll
        for (int n = 0; n < kNB; n += 2) {
          load_b_nk<kDh>(bb, baseV, n * 8, kd, lane);
          tf32_frag<T>(bb, b, bs);
          mma_tf32<T, (kD >= 128)>(dp[n], ab, as, b[0], b[1], bs[0], bs[1]);
          mma_tf32<T, (kD >= 128)>(dp[n + 1], ab, as, b[2], b[3], bs[2], bs[3]);
        }
      } else {
      load_a<kD>(a, baseQ, wrow, kd, lane);
#pragma unroll
      for (int n = 0; n < kNB; n += 2) {
        load_b_nk<kD>(bb, baseK, n * 8, kd, lane);
        mma16816<T>(s[n], a, bb[0], bb[1]);
        mma16816<T>(s[n + 1], a, bb[2], bb[3]);
      }
      load_a<kD>(a, baseO, wrow, kd, lane);
#pragma unroll
      for (int n = 0; n < kNB; n += 2) {
        load_b_nk<kD>(bb, baseV, n * 8, kd, lane);
        mma16816<T>(dp[n], a, bb[0], bb[1]);
        mma16816<T>(dp[n + 1], a, bb[2], bb[3]);
      }
      }  // 16-bit
    }

#pragma unroll
    for (int n = 0; n < kNB; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1;
        float x = s[n][e] * p.scale_log2 - lse2[half];
        if (masked) {
          const int col = n * 8 + 2 * (lane & 3) + (e & 1);
          bool in;
          if (it < n_nbr) {
            const int row = wrow + (lane >> 2) + half * 8;
            const uint32_t off = s_koff[col];
            in = true;
#pragma unroll
            for (int a = 0; a < kAxes; ++a) {
              const int kj = k0[a] + unpack_offset(off, a);
              const int2 w = s_qwin[row * kAxes + a];
              in = in && kj >= w.x && kj < w.y;
            }
          } else {
            in = col < add_left;
          }
          if (!in) x = -INFINITY;
        }
        if constexpr (kBias) {
          // (pairs masked out, or rows without a query, read nothing: x is -inf)
          if (tab != nullptr && x != -INFINITY) {
            const uint32_t off = s_koff[n * 8 + 2 * (lane & 3) + (e & 1)];
            int kc = kbase;
#pragma unroll
            for (int a = 0; a < kAxes; ++a) kc += unpack_offset(off, a) * p.rpb_stride[1 + a];
            x = fmaf(__ldg(tab + (kc - qb[half])), 1.4426950408889634f, x);
          }
        }
        const float pe = mma::fast_exp2(x);
        dp[n][e] = pe * (dp[n][e] - dsum[half]);
      }
    }

    // dQ += dS K: dS's C layout is the A layout; K is read [key][d] = [k][n].
    if constexpr (kF32) {
      // One k8 step per n8 block of keys, keys permuted inside it (bwd_mma.cuh).
      const float* fK = sK + buf * kKV * kD;
#pragma unroll
      for (int kk = 0; kk < kNB; ++kk) {
        uint32_t ad[4], ads[4];
        c_to_a<T>(dp[kk], ad, ads);
#pragma unroll
        for (int n = 0; n < kDB; ++n) {
          uint32_t b0, b1, bs0, bs1;
          load_b_kn_f32<T, kD>(b0, b1, bs0, bs1, fK, kk * 8, n * 8, lane);
          mma_tf32<T, true>(acc[n], ad, ads, b0, b1, bs0, bs1);
        }
      }
    } else {
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) {
      uint32_t ad[4], bb[4];
      ad[0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
      ad[1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
      ad[2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      ad[3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < kDB; n += 2) {
        load_b_kn<kD>(bb, baseK, kk * 16, n * 8, lane);
        mma16816<T>(acc[n], ad, bb[0], bb[1]);
        mma16816<T>(acc[n + 1], ad, bb[2], bb[3]);
      }
    }
    }  // 16-bit
  }

  // ---- epilogue ---------------------------------------------------------------------------------
  E* gdQ = static_cast<E*>(p.dq);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + (lane >> 2) + half * 8;
    const uint32_t off = pack_offsets(p.tq, row);
    int i[kAxes], x[kAxes];
    for (int a = 0; a < kAxes; ++a) i[a] = q0[a] + unpack_offset(off, a);
    if (!query_global(p, G, i, x)) continue;
    const int64_t o = tok_offset(p.sdq, b, x, h);
#pragma unroll
    for (int n = 0; n < kDB; ++n) {
      const int col = n * 8 + 2 * (lane & 3);
      store_pair(gdQ + o, col, p.dim, acc[n][2 * half] * p.scale, acc[n][2 * half + 1] * p.scale,
                 p.aligned);
    }
  }
}

}  // namespace bwd
}  // namespace fna
