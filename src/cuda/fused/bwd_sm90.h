// The Hopper (wgmma, sm_90a) dK / dV kernel of the fused backward (bwd_dkdv_sm90.cuh), built in
// the sm_90a object library when FNA_WITH_SM90 is defined; launch_backward (bwd_launch.cuh) calls
// it for 16-bit head dims <= 128 in the atomic-dQ mode on compute capability 9.0.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>

#include "core/backends.h"
#include "cuda/fused/bwd_params.cuh"

namespace fna {
namespace bwd {

// dK / dV (neighborhood tiles `grid`, additional keys `grid_add`) with dQ accumulated into
// p.dq_accum by atomics, then dQ converted; p's tiles must be 128 keys x 64 queries.
template <typename T, int kD>
Status launch_dkdv_sm90(const Params& p, dim3 grid, dim3 grid_add, cudaStream_t stream);

// Whether the current device runs the sm_90a kernels (compute capability 9.0), unless the
// environment sets FNA_BWD_SM80=1 (the mma.sync kernels, for comparisons).
inline bool use_bwd_sm90() {
  const char* env = std::getenv("FNA_BWD_SM80");
  if (env != nullptr && env[0] == '1') return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// Whether the warp-specialized dK / dV kernel runs (dkdv_sm90_ws_kernel): by default at padded
// head dim 128 (measured faster there, slower at 64: docs/benchmarks.md); FNA_BWD_SM90_WS=0 / 1
// in the environment forces the plain kernel / it at every head dim, read at every call (for
// same-process comparisons).
inline bool use_bwd_sm90_ws(int padded_dim) {
  const char* env = std::getenv("FNA_BWD_SM90_WS");
  if (env != nullptr && env[0] == '0') return false;
  if (env != nullptr && env[0] == '1') return true;
  return padded_dim == 128;
}

}  // namespace bwd
}  // namespace fna
