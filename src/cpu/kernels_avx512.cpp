// The tile kernels compiled for avx512 (see kernels_impl.h).
// kernels_{avx512,avx2,generic}.cpp differ only in the ISA lines.
#include "cpu/tile.h"

#if FNA_CPU_X86_KERNELS
#include <immintrin.h>  // before the target pragma, like every other header

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
#endif
#define FNA_CPU_ISA avx512
#define FNA_CPU_VW 16
#include "cpu/kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace fna {
namespace cpu {
const Kernels& avx512_kernel_table() {
  static const Kernels k{"avx512", 16, &avx512::forward_tiles, &avx512::backward_tiles,
                         &avx512::transpose_rows};
  return k;
}
}  // namespace cpu
}  // namespace fna

#endif  // FNA_CPU_X86_KERNELS
