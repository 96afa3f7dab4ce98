// Instantiates the rank-1 bf16 forward configurations of config.h (one file per rank and
// dtype so the kernels compile in parallel).
#include "cuda/fused/config.h"
#include "cuda/fused/fwd_kernel.cuh"

namespace fna {
namespace fused {

#define FNA_FWD_INSTANTIATE(R, D, Q0, Q1, Q2, K0, K1, K2, MT, DT)                              \
  template cudaError_t launch_fwd<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>( \
      const FwdParams&, int, cudaStream_t);                                                \
  template size_t fwd_smem_bytes<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();
FNA_FWD_CONFIGS_RANK1(FNA_FWD_INSTANTIATE, BF16)
#undef FNA_FWD_INSTANTIATE

}  // namespace fused
}  // namespace fna
