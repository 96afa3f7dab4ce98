// Warp-level tensor-core primitives for sm_80+ (Ampere, Ada, Hopper): mma.sync m16n8k16 with f32
// accumulation, m16n8k8 tf32 (plain, or split into three products for float32 accuracy),
// ldmatrix (plain and transposed), cp.async 16-byte copies with commit / wait groups.
// Shared by the fused forward and backward kernels; the interface is kept stable.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and t = lane % 4. Every 32-bit
// register holds two 16-bit elements, the lower column / k index in the low half.
//   A (16x16, row-major, 4 regs):  a0 = A[g][2t..2t+1]      a1 = A[g+8][2t..2t+1]
//                                  a2 = A[g][2t+8..2t+9]    a3 = A[g+8][2t+8..2t+9]
//   B (16x8, k x n, 2 regs):       b0 = B[2t..2t+1][g]      b1 = B[2t+8..2t+9][g]
//   C/D (16x8, f32, 4 regs):       c0,c1 = C[g][2t], C[g][2t+1]    c2,c3 = C[g+8][2t], C[g+8][2t+1]
// Consequence used by flash attention: the C fragments of two adjacent 16x8 tiles (columns
// 16j..16j+7 and 16j+8..16j+15), converted to 16-bit pairs, are exactly the A fragment of k-step j
// (a0 = pack(c0,c1) of the first, a1 = pack(c2,c3) of the first, a2/a3 the same of the second), so
// P = softmax(S) feeds the second GEMM straight from registers.
//
// ldmatrix.x4 loads four 8x8 16-bit matrices; lanes 8m..8m+7 supply the row addresses of matrix m
// (16-byte aligned rows), and register r[m] of lane l receives matrix m's row l/4, columns 2(l%4),
// 2(l%4)+1. With .trans a lane receives column l/4, rows 2(l%4), 2(l%4)+1 instead. Hence:
//   - A from row-major smem X[row][k]:      lane l points at X[row0 + (l & 15)][k0 + (l >> 4) * 8].
//   - B from smem stored [n][k] (K for S = Q K^T), two n-tiles at once, non-transposed:
//       lane l points at K[n0 + (l & 7) + (l >> 4) * 8][k0 + ((l >> 3) & 1) * 8];
//       n-tile 0 = {r0, r1}, n-tile 1 = {r2, r3}.
//   - B from smem stored [k][n] (V for O = P V), two n-tiles at once, transposed:
//       lane l points at V[k0 + (l & 7) + ((l >> 3) & 1) * 8][n0 + (l >> 4) * 8];
//       n-tile 0 = {r0, r1}, n-tile 1 = {r2, r3}.
// The helpers below (ldsm_a_addr, ldsm_b_nk_addr, ldsm_b_kn_addr) compute those lane offsets.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fna {
namespace mma {

// 16-bit element types of the tensor-core path.
struct F16 {
  using type = __half;
};
struct BF16 {
  using type = __nv_bfloat16;
};
// float32 elements on the TF32 tensor cores (mma.m16n8k8): F32 splits every operand x into
// big = tf32(x) and small = tf32(x - big) and sums three products (small * big' + big * small' +
// big * big'), float32-class accuracy; TF32 rounds each operand once (about 1e-3 relative).
struct F32 {
  using type = float;
  static constexpr bool kSplit = true;
};
struct TF32 {
  using type = float;
  static constexpr bool kSplit = false;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two floats to one register of two 16-bit values (lo in the low half), round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<F16>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<BF16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// d = a * b + d, 16x8x16, f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<F16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<BF16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- TF32 (m16n8k8, f32 accumulate). Fragment layouts (PTX ISA, "mma.m16n8k8" .tf32), g = lane / 4,
// t = lane % 4, one element per register:
//   A (16x8, row-major, 4 regs):  a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]
//   B (8x8, k x n, 2 regs):       b0 = B[t][g]  b1 = B[t+4][g]
//   C/D (16x8, f32):              the same as m16n8k16 above.
// An ldmatrix.x4 (b16) over float32 rows hands lane l the float at row l/4, column l%4 of each
// 8-row x 16-byte matrix, so the ldsm_*_addr patterns below load tf32 A fragments and B fragments
// from [n][k] storage when their column offsets (8 16-bit elements = 16 bytes) are read as 4 floats.

// float32 -> tf32 (round to nearest, ties away), as a 32-bit register with the low 13 bits zero.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// x = big + small (+ an error of about 2^-22 |x|), both tf32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));
}

// d = a * b + d, 16x8x8, tf32 inputs, f32 accumulate.
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// x2: lanes 0..15 supply the addresses (matrix 0 = lanes 0-7, matrix 1 = lanes 8-15).
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Lane offsets (row, column) in elements for the ldmatrix.x4 patterns documented above.
struct LdsmOffset {
  int row;
  int col;
};
// A fragment (16x16 at row0, k0) from row-major [row][k].
__device__ __forceinline__ LdsmOffset ldsm_a_addr(int lane) { return {lane & 15, (lane >> 4) * 8}; }
// Two B n-tiles (16 n x 16 k) from smem stored [n][k]: row = n, col = k.
__device__ __forceinline__ LdsmOffset ldsm_b_nk_addr(int lane) {
  return {(lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8};
}
// Two B n-tiles (16 k x 16 n) from smem stored [k][n] (use with .trans): row = k, col = n.
__device__ __forceinline__ LdsmOffset ldsm_b_kn_addr(int lane) {
  return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8};
}

// 16-byte global -> shared copy that bypasses L1. When !valid nothing is read and the 16 bytes
// are zero-filled (src-size 0), so out-of-bounds rows and padded head-dim columns become zeros;
// `gmem` must still be a mapped address (pass the tensor's base pointer).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_size));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// exp2 on the SFU (inputs are already scaled by log2(e)).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mma
}  // namespace fna
