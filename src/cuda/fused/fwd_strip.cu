// Instantiates the strip forward configurations of config.h (FNA_FWD_CONFIGS_STRIP).
#include "cuda/fused/config.h"
#include "cuda/fused/fwd_strip.cuh"

namespace fna {
namespace fused {

template <class T, int kD, int kPhases>
size_t fwd_strip_smem_bytes() {
  // A lower bound: a ring of 16 rows of a 16-column halo.
  return size_t(16) * kStripCols * 2 * kD * 2;
}

#define FNA_FWD_STRIP_INSTANTIATE(D, PH, DT)                                                 \
  template cudaError_t launch_fwd_strip<mma::DT, D, PH>(const FwdParams&, int, cudaStream_t); \
  template size_t fwd_strip_smem_bytes<mma::DT, D, PH>();
FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_INSTANTIATE, BF16)
FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_INSTANTIATE, F16)
#undef FNA_FWD_STRIP_INSTANTIATE

}  // namespace fused
}  // namespace fna
