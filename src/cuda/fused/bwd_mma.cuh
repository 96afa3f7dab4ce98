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

}  // namespace bwd
}  // namespace fna
