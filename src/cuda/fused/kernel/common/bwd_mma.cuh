// The backward's thin layer over the shared tensor-core primitives (cuda/common/mma.cuh): element
// types mapped to mma tags, the XOR swizzle of its shared-memory tiles, and fragment loaders that
// apply that swizzle to the ldmatrix lane patterns documented in mma.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/mma.cuh"

namespace fna {
namespace bwd {

template <typename T>
struct MmaTag;
template <>
struct MmaTag<__half> {
  using type = mma::F16;
};
template <>
struct MmaTag<__nv_bfloat16> {
  using type = mma::BF16;
};

// Storage element of a kernel's type parameter: the 16-bit types themselves, float for the two
// float32 precisions (mma::F32 split TF32, mma::TF32 plain TF32).
template <typename T>
struct Elem {
  using type = T;
  static constexpr bool kF32 = false;
};
template <>
struct Elem<mma::F32> {
  using type = float;
  static constexpr bool kF32 = true;
};
template <>
struct Elem<mma::TF32> {
  using type = float;
  static constexpr bool kF32 = true;
};

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return mma::pack2<typename MmaTag<T>::type>(lo, hi);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  mma::mma_16816<typename MmaTag<T>::type>(d, a, b0, b1);
}

using mma::cp_async_commit;
using mma::smem_u32;

// 16-byte global -> shared copy; `valid == false` writes zeros without reading `src`.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  mma::cp_async_16(smem_u32(dst), src, valid);
}
__device__ __forceinline__ void cp_async_wait_all() { mma::cp_async_wait<0>(); }

// A shared tile of rows of kDim 16-bit elements (kDim / 8 16-byte chunks). The chunk index is
// XORed with the row's low 3 bits so that the 8 row addresses of one ldmatrix phase fall in 8
// different bank groups (kDim must be a multiple of 64).
template <int kDim>
struct Swizzled {
  static_assert(kDim % 64 == 0, "swizzle needs at least 8 chunks per row");
  // Element offset of (row, chunk).
  static __device__ __forceinline__ int offset(int row, int chunk) {
    return row * kDim + ((chunk ^ (row & 7)) << 3);
  }
};

// Fragment loaders over a Swizzled tile at shared address `base`.
// A operand 16x16 at (r0, k0) of a tile stored [row][k].
template <int kDim>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t base, int r0, int k0, int lane) {
  const mma::LdsmOffset o = mma::ldsm_a_addr(lane);
  mma::ldsm_x4(a, base + 2 * Swizzled<kDim>::offset(r0 + o.row, (k0 + o.col) >> 3));
}
// B operands of two n8 blocks (n0, n0 + 8) x k16 from a tile stored [n][k] (K for Q K^T):
// b[0..1] is n block n0, b[2..3] n block n0 + 8.
template <int kDim>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], uint32_t base, int n0, int k0,
                                          int lane) {
  const mma::LdsmOffset o = mma::ldsm_b_nk_addr(lane);
  mma::ldsm_x4(b, base + 2 * Swizzled<kDim>::offset(n0 + o.row, (k0 + o.col) >> 3));
}
// The same from a tile stored [k][n] (V for P V), through the transposing ldmatrix.
template <int kDim>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], uint32_t base, int k0, int n0,
                                          int lane) {
  const mma::LdsmOffset o = mma::ldsm_b_kn_addr(lane);
  mma::ldsm_x4_trans(b, base + 2 * Swizzled<kDim>::offset(k0 + o.row, (n0 + o.col) >> 3));
}

// ---- float32 on the TF32 tensor cores (m16n8k8). A row of kD floats is addressed as kD * 2
// 16-bit units, so Swizzled<2 * kD> and the ldmatrix loaders above serve float tiles unchanged:
// a 16-unit k-step is 8 floats, and the loaded registers are exactly the tf32 A fragment
// (load_a) and the B fragments of two n8 blocks (load_b_nk) of that k8 step (mma.cuh).
// ldmatrix.trans cannot transpose 32-bit data, so B operands stored [k][n] (dO, Q, K in the
// second products) come from 32-bit shared loads; there the k order inside each 8-step is
// permuted (k index t <-> row 2t, t + 4 <-> row 2t + 1) so that a C fragment (columns 2t, 2t + 1)
// is the A fragment of the next product without shuffles: A = {c0, c2, c1, c3}.

// One float32 operand: rounded once (TF32) or split into big + small (F32).
template <class T>
__device__ __forceinline__ void tf32_op(float x, uint32_t& big, uint32_t& small) {
  if constexpr (T::kSplit) {
    mma::split_tf32(x, big, small);
  } else {
    big = mma::to_tf32(x);
    small = 0;
  }
}
// A fragment (4 registers) as tf32 operands.
template <class T>
__device__ __forceinline__ void tf32_frag(const uint32_t (&r)[4], uint32_t (&big)[4],
                                          uint32_t (&small)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) tf32_op<T>(__uint_as_float(r[i]), big[i], small[i]);
}
// d += a * b: F32 sums small * big + big * small + big * big (small terms first). kFresh (the
// long accumulations: dK / dV / dQ over hundreds of keys or queries, and S / dP over head dims
// 128 and above, as the forward does from 128) sums the three into a fresh
// fragment and adds that to d with an ordinary (round-to-nearest) float add: the tensor cores'
// f32 accumulation rounds less carefully, and those sums would otherwise drift by ~1e-5
// relative. Plain TF32 accumulates in place.
template <class T, bool kFresh = false>
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&as)[4], uint32_t b0, uint32_t b1,
                                         uint32_t bs0, uint32_t bs1) {
  if constexpr (T::kSplit && !kFresh) {
    mma::mma_1688_tf32(d, as, b0, b1);
    mma::mma_1688_tf32(d, a, bs0, bs1);
    mma::mma_1688_tf32(d, a, b0, b1);
  } else if constexpr (T::kSplit) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    mma::mma_1688_tf32(t, as, b0, b1);
    mma::mma_1688_tf32(t, a, bs0, bs1);
    mma::mma_1688_tf32(t, a, b0, b1);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] += t[i];
  } else {
    mma::mma_1688_tf32(d, a, b0, b1);
  }
}
// C fragment of an n8 block -> A fragment of a k8 step (permuted k order, see above).
template <class T>
__device__ __forceinline__ void c_to_a(const float (&c)[4], uint32_t (&a)[4], uint32_t (&as)[4]) {
  tf32_op<T>(c[0], a[0], as[0]);
  tf32_op<T>(c[2], a[1], as[1]);
  tf32_op<T>(c[1], a[2], as[2]);
  tf32_op<T>(c[3], a[3], as[3]);
}
// B fragment of the k8 x n8 block (k0, n0) of a Swizzled<2 * kD> float tile stored [k][n], in the
// permuted k order: b0 = X[k0 + 2t][n0 + g], b1 = X[k0 + 2t + 1][n0 + g]. Rows 2t of one load fall
// in different bank groups through the swizzle (conflict-free).
template <int kD>
__device__ __forceinline__ float swz_f32(const float* tile, int row, int col) {
  return tile[Swizzled<2 * kD>::offset(row, col >> 2) / 2 + (col & 3)];
}
template <class T, int kD>
__device__ __forceinline__ void load_b_kn_f32(uint32_t& b0, uint32_t& b1, uint32_t& bs0,
                                              uint32_t& bs1, const float* tile, int k0, int n0,
                                              int lane) {
  const int r = k0 + 2 * (lane & 3), c = n0 + (lane >> 2);
  tf32_op<T>(swz_f32<kD>(tile, r, c), b0, bs0);
  tf32_op<T>(swz_f32<kD>(tile, r + 1, c), b1, bs1);
}

}  // namespace bwd
}  // namespace fna
