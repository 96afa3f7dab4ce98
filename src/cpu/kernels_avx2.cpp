// The tile kernels compiled for avx2 (see kernels_impl.h).
// kernels_{avx512,avx2,generic}.cpp differ only in the ISA lines.
#include "cpu/tile.h"

#if FNA_CPU_X86_KERNELS
#include <immintrin.h>  // before the target pragma, like every other header

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define FNA_CPU_ISA avx2
#define FNA_CPU_VW 8
#include "cpu/kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace fna {
namespace cpu {
const Kernels& avx2_kernel_table() {
  static const Kernels k{"avx2", 8, &avx2::forward_tiles, &avx2::backward_tiles,
                         &avx2::transpose_rows};
  return k;
}
}  // namespace cpu
}  // namespace fna

#endif  // FNA_CPU_X86_KERNELS
