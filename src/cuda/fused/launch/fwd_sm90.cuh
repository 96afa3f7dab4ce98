// The Hopper forward's instantiations: one row of configs/forward.h's sm90 tables instantiates the
// launcher of its schedule column, the plain kernel's (kernel/sm90/fwd_sm90.cuh, with the
// backward's dQ kernel on its tiles) or the warp-specialized one's (kernel/sm90/fwd_sm90_ws.cuh). The build's generated files expand it.
#pragma once

#include "cuda/fused/kernel/sm90/fwd_sm90.cuh"
#include "cuda/fused/kernel/sm90/fwd_sm90_ws.cuh"

namespace fna {
namespace fused {

// Instantiates one row of configs/forward.h's Hopper tables, by its schedule column (the build's generated
// files expand it).
#define FNA_FWD_SM90_INSTANTIATE_Sm90(R, D, Q0, Q1, Q2, K0, K1, K2, DT)                        \
  template cudaError_t launch_fwd_sm90<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>(     \
      const FwdParams&, const FwdLaunch&, cudaStream_t);                                      \
  template cudaError_t launch_dq_sm90<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>(      \
      const FwdParams&, const FwdLaunch&, const StripBwd&, const DqTma&, cudaStream_t);       \
  template size_t dq_sm90_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();    \
  template size_t fwd_sm90_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();
#define FNA_FWD_SM90_INSTANTIATE_Sm90Ws(R, D, Q0, Q1, Q2, K0, K1, K2, DT)                      \
  template cudaError_t launch_fwd_sm90ws<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>(   \
      const FwdParams&, const FwdLaunch&, cudaStream_t);                                      \
  template size_t fwd_sm90ws_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();  \
  template size_t fwd_sm90ws_bias_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();
#define FNA_FWD_SM90_INSTANTIATE(R, D, Q0, Q1, Q2, K0, K1, K2, S, DT) \
  FNA_FWD_SM90_INSTANTIATE_##S(R, D, Q0, Q1, Q2, K0, K1, K2, DT)

}  // namespace fused
}  // namespace fna
