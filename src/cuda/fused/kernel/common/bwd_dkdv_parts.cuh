// The pieces of the dK / dV kernels shared by the mma.sync kernel (bwd_dkdv_sm80.cuh) and the Hopper
// ones (bwd_dkdv_sm90*.cuh): the traits, which tile a CTA owns, and the atomic dQ block
// (bwd_dkdv_sm80.cuh describes the algorithm).
#pragma once


#include <cuda_runtime.h>

#include "cuda/fused/kernel/common/bwd_mma.cuh"
#include "cuda/fused/kernel/common/bwd_ktile.cuh"
#include "cuda/fused/kernel/common/bwd_params.cuh"
#include "cuda/fused/kernel/common/bwd_qtiles.cuh"

namespace fna {
namespace bwd {

constexpr int kPassBoth = 0, kPassDv = 1, kPassDk = 2;

template <typename T, int kD, int kWarps, int kQ, int kQSub, bool kAtomicDq>
struct DkdvTraits {
  using E = typename Elem<T>::type;
  static constexpr bool kF32 = Elem<T>::kF32;
  static constexpr int kKV = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDh = kD * int(sizeof(E)) / 2;  // a row in 16-bit units (Swizzled<kDh>)
  static constexpr int kChunks = kDh / 8;              // 16-byte chunks per row
  static constexpr int kTile = kD * int(sizeof(E));    // bytes of one row
  static constexpr size_t kSmemK = size_t(kKV) * kTile;
  static constexpr size_t kSmemQ = size_t(kQ) * kTile;
  // dS^T staged for dQ += dS K (atomic-dQ mode), two slots; rows padded by 16 bytes so the 8
  // rows of one transposing ldmatrix phase hit 8 different bank groups; float32: by 4 floats, so
  // that the 32-bit loads of rows 2t (t = lane % 4) and columns g (lane / 4) are conflict-free.
  static constexpr int kDsStride = kQSub + (kF32 ? 4 : 8);
  static constexpr size_t kSmemDs = kAtomicDq ? 2 * size_t(kKV) * kDsStride * sizeof(E) : 0;
  static constexpr size_t kSmem = 2 * kSmemK + 4 * kSmemQ + kSmemDs + 2 * kQ * sizeof(float2) +
                                  kQ * sizeof(uint32_t) + kKV * kAxes * sizeof(int2) +
                                  2 * kQ * sizeof(int64_t) + 2 * sizeof(int);
  static_assert(kQ % kQSub == 0 && kQSub % 16 == 0, "query sub-tile must divide the tile");
};

// The key tile a dK / dV CTA owns: batch, kv head, dilation group and origin (neighborhood
// mode), or the first additional token (additional mode, tiles of kKV tokens). False when the
// tile starts past a shorter group's end (group 0 sets the grid) or the row is the fold's padding.
__device__ __forceinline__ bool dkdv_tile_of(const Params& p, bool additional, int kKV, int& b,
                                             int& hkv, int (&kv0)[kAxes], Group& G,
                                             int64_t& n0) {
  unsigned y = grid_row();  // unsigned divisions: no sign corrections
  if (y >= unsigned(p.batch) * unsigned(p.heads_kv) * unsigned(additional ? 1 : p.groups))
    return false;  // the row fold's padding
  if (!additional) {
    const int group = int(y % unsigned(p.groups));
    y /= unsigned(p.groups);
    hkv = int(y % unsigned(p.heads_kv));
    b = int(y / unsigned(p.heads_kv));
    G = Group::of(p.geo, group, p.dil);
    const int x = blockIdx.x;
    for (int a = 0; a < kAxes; ++a) {
      kv0[a] = (x / p.tdiv[a] % p.tiles[a]) * p.tkv[a];
      if (kv0[a] >= G.len[a]) return false;  // this group is shorter than group 0 on this axis
    }
  } else {
    hkv = int(y % unsigned(p.heads_kv));
    b = int(y / unsigned(p.heads_kv));
    n0 = int64_t(blockIdx.x) * kKV;
    for (int a = 0; a < kAxes; ++a) G.g[a] = 0, G.len[a] = p.geo.axis[a].length;
  }
  return true;
}

// dQ[qs .. qs + kQSub) += dS K over this CTA's keys, added into p.dq_accum (float32, unscaled,
// [B, N, H, dq_row]). dS^T sits in shared memory as [key][query]; warps split the output into
// 16-query x 32-column blocks.
template <typename T, int kD, int kWarps, int kKV, int kQSub, int kDsStride>
__device__ __forceinline__ void atomic_dq_block(const Params& p,
                                                const typename Elem<T>::type* ds, uint32_t baseK,
                                                int qs, const int64_t* s_tok, int lane,
                                                int warp) {
  constexpr int kMB = kQSub / 16;
  constexpr int kWarpsPerM = kWarps / kMB;
  constexpr int kCols = kD / kWarpsPerM;
  static_assert(kWarps % kMB == 0 && kCols % 16 == 0, "dQ block split");
  const int m0 = (warp % kMB) * 16, n0 = (warp / kMB) * kCols;
  float acc[kCols / 8][4];
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
  if constexpr (Elem<T>::kF32) {
    // A = dS from [key][query] storage and B = K [key][d], both by 32-bit loads in the permuted
    // key order (k index t <-> key 2t, t + 4 <-> key 2t + 1).
    const float* sK = reinterpret_cast<const float*>(__cvta_shared_to_generic(baseK));
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 2
    for (int k0 = 0; k0 < kKV; k0 += 8) {
      const float* d0 = ds + (k0 + 2 * t) * kDsStride + m0 + g;
      uint32_t a[4], as[4];
      tf32_op<T>(d0[0], a[0], as[0]);
      tf32_op<T>(d0[8], a[1], as[1]);
      tf32_op<T>(d0[kDsStride], a[2], as[2]);
      tf32_op<T>(d0[kDsStride + 8], a[3], as[3]);
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n) {
        uint32_t b0, b1, bs0, bs1;
        load_b_kn_f32<T, kD>(b0, b1, bs0, bs1, sK, k0, n0 + n * 8, lane);
        mma_tf32<T, true>(acc[n], a, as, b0, b1, bs0, bs1);
      }
    }
  } else {
  const uint32_t baseDs = smem_u32(ds);
#pragma unroll
  for (int k0 = 0; k0 < kKV; k0 += 16) {
    uint32_t a[4], bb[4];
    // A = dS (queries x keys) from [key][query] storage: the transposing ldmatrix.
    const int kr = k0 + (lane & 7) + ((lane >> 4) << 3), qc = m0 + ((lane >> 3) & 1) * 8;
    mma::ldsm_x4_trans(a, baseDs + 2 * (kr * kDsStride + qc));
#pragma unroll
    for (int n = 0; n < kCols / 8; n += 2) {
      load_b_kn<kD>(bb, baseK, k0, n0 + n * 8, lane);
      mma16816<T>(acc[n], a, bb[0], bb[1]);
      mma16816<T>(acc[n + 1], a, bb[2], bb[3]);
    }
  }
  }  // 16-bit
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = s_tok[qs + m0 + (lane >> 2) + half * 8];  // query row of the tile
    if (t < 0) continue;
    float* dst = p.dq_accum + t * p.dq_row;
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      const int col = n0 + n * 8 + 2 * (lane & 3);
      if (col >= p.dim) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(dst + col),
                make_float2(acc[n][2 * half], acc[n][2 * half + 1]));
#else
      atomicAdd(dst + col, acc[n][2 * half]);
      atomicAdd(dst + col + 1, acc[n][2 * half + 1]);
#endif
    }
  }
}

}  // namespace bwd
}  // namespace fna
