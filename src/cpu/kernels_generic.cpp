// The tile kernels compiled for generic (see kernels_impl.h).
// kernels_{avx512,avx2,generic}.cpp differ only in the ISA lines.
#include "cpu/tile.h"

#define FNA_CPU_ISA generic
#define FNA_CPU_VW 4
#include "cpu/kernels_impl.h"

namespace fna {
namespace cpu {
const Kernels& generic_kernel_table() {
  static const Kernels k{"generic", 4, &generic::forward_tiles, &generic::backward_tiles,
                         &generic::transpose_rows};
  return k;
}
}  // namespace cpu
}  // namespace fna
