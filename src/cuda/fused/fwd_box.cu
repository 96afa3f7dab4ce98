// Instantiates the box forward configurations of config.h (FNA_FWD_CONFIGS_BOX).
#include "cuda/fused/config.h"
#include "cuda/fused/fwd_box.cuh"

namespace fna {
namespace fused {

template <class T, int kD, class QT>
size_t fwd_box_smem_bytes() {
  return size_t(QT::kSize) * kD * 2;  // a lower bound: the halo of QT's own queries
}

#define FNA_FWD_BOX_INSTANTIATE(D, Q1, Q2, DT)                                                  \
  template cudaError_t launch_fwd_box<mma::DT, D, Tile<1, Q1, Q2>>(const FwdParams&, int,     \
                                                                   cudaStream_t);             \
  template size_t fwd_box_smem_bytes<mma::DT, D, Tile<1, Q1, Q2>>();
FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_INSTANTIATE, BF16)
FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_INSTANTIATE, F16)
#undef FNA_FWD_BOX_INSTANTIATE

}  // namespace fused
}  // namespace fna
