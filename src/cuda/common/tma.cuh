// TMA tile loads (device side of tma.h): one thread copies a whole box of rows into shared memory
// and the box's bytes complete a transaction count on an mbarrier.
#pragma once

#include <cstdint>

#include "cuda/common/tma.h"

namespace fna {
namespace tma {

// Arrive on `bar` and add `bytes` to the transactions its current phase waits for.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

// Add `bytes` to the transactions the current phase of `bar` waits for, without arriving.
__device__ __forceinline__ void expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

// The coordinate of a map dim with role `r`.
__device__ __forceinline__ int coord_of(int8_t r, int b, const int (&o)[3], int h) {
  return r == kHead ? h : r == kAxis0 ? o[0] : r == kAxis1 ? o[1] : r == kAxis2 ? o[2]
                                                               : r == kBatch ? b : 0;
}

// The coordinates of map dims 1-4 for the box whose first row is at grid coordinate `o` (batch
// b, head h).
__device__ __forceinline__ void box_coords(const TokenMap& m, int b, const int (&o)[3], int h,
                                           int (&c)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = coord_of(m.role[i], b, o, h);
}

// Columns col .. col + 63 of the box at map coordinates `c` (box_coords) into shared memory at
// `dst` (1024-byte aligned), completing on `bar`.
__device__ __forceinline__ void load_box(uint32_t dst, const TokenMap& m, int col,
                                         const int (&c)[4], uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&m.map)), "r"(col), "r"(c[0]), "r"(c[1]), "r"(c[2]),
      "r"(c[3]), "r"(bar)
      : "memory");
#endif
}

}  // namespace tma
}  // namespace fna
