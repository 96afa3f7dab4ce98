// Launchers of the fused backward kernels for one (dtype, padded head dim). The kernel shapes are
// fixed per head dim here; tile *shapes* (how a tile's rows spread over the axes) are runtime
// values in Params, chosen by the host heuristic, so ranks 1-3 share one instantiation.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/backends.h"
#include "cuda/fused/bwd_dkdv.cuh"
#include "cuda/fused/bwd_dq.cuh"
#include "cuda/fused/bwd_params.cuh"

namespace fna {
namespace bwd {

// Query / key tile sizes of both kernels (the host tiles the grid with these row counts).
constexpr int kDkdvWarps = 8;                  // 128 keys per CTA
constexpr int kDkdvKeys = 16 * kDkdvWarps;
constexpr int kDkdvQueries = 64;
constexpr int kDqWarps = 4;                    // 64 queries per CTA
constexpr int kDqQueries = 16 * kDqWarps;
constexpr int kDqKeys = 64;

// Sub-tile of queries per mainloop step of the dK/dV kernel: at head dim 128 the dK and dV
// accumulators already take 128 registers per thread, so S^T / dP^T are computed 32 queries at a
// time to stay under 255 without spills.
template <int kD>
constexpr int dkdv_qsub() { return kD > 64 ? 32 : 64; }

// Sets the dynamic shared memory of `kernel`, or reports that the device cannot hold it.
template <typename Kernel>
Status set_smem(Kernel kernel, size_t bytes, const char* name) {
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (bytes > size_t(optin))
    return {Code::unsupported, std::string("backend=cuda-fused: ") + name + " needs " +
                                   std::to_string(bytes) + " bytes of shared memory, device has " +
                                   std::to_string(optin)};
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err != cudaSuccess) return {Code::runtime_error, std::string(name) + ": " + cudaGetErrorString(err)};
  return Status::Ok();
}

// p_dkdv / p_dq carry their own tile shapes and tile counts. `dkdv_groups` etc. are grid sizes.
template <typename T, int kD>
Status launch_backward(const Params& p_dkdv, const Params& p_dq, dim3 grid_dkdv, dim3 grid_add,
                       dim3 grid_dq, cudaStream_t stream) {
  constexpr int kQSub = dkdv_qsub<kD>();
  using DkdvT = DkdvTraits<T, kD, kDkdvWarps, kDkdvQueries, kQSub>;
  using DqT = DqTraits<T, kD, kDqWarps, kDqKeys>;
  auto dkdv = dkdv_kernel<T, kD, kDkdvWarps, kDkdvQueries, kQSub>;
  auto dq = dq_kernel<T, kD, kDqWarps, kDqKeys>;
  Status st = set_smem(dkdv, DkdvT::kSmem, "dkdv kernel");
  if (!st.ok()) return st;
  st = set_smem(dq, DqT::kSmem, "dq kernel");
  if (!st.ok()) return st;

  dkdv<<<grid_dkdv, DkdvT::kThreads, DkdvT::kSmem, stream>>>(p_dkdv, false);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return {Code::runtime_error, std::string("launching dkdv: ") + cudaGetErrorString(err)};
  if (grid_add.x > 0) {
    dkdv<<<grid_add, DkdvT::kThreads, DkdvT::kSmem, stream>>>(p_dkdv, true);
    err = cudaGetLastError();
    if (err != cudaSuccess)
      return {Code::runtime_error, std::string("launching dkdv (additional): ") + cudaGetErrorString(err)};
  }
  dq<<<grid_dq, DqT::kThreads, DqT::kSmem, stream>>>(p_dq);
  err = cudaGetLastError();
  if (err != cudaSuccess) return {Code::runtime_error, std::string("launching dq: ") + cudaGetErrorString(err)};
  return Status::Ok();
}

// Explicit instantiations live in backward_<dtype>.cu.
#define FNA_BWD_DECLARE(T, D)                                                                   \
  extern template Status launch_backward<T, D>(const Params&, const Params&, dim3, dim3, dim3, \
                                               cudaStream_t);

}  // namespace bwd
}  // namespace fna
