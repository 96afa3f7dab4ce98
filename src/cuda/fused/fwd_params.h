// Device-side parameters of the fused forward kernel: built once on the host from the public
// (Problem, ForwardArgs, Options) in forward.cu, passed by value to every instantiation.
#pragma once

#include <cstdint>
#include <cstdlib>

#include <cuda_runtime.h>

#include "cuda/fused/tiling.cuh"

namespace fna {
namespace fused {

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // null: not requested
  const void* add_k;
  const void* add_v;
  // Strides in elements, lifted to [batch, axis 0, axis 1, axis 2, head] (unit stride on the last
  // dim is a precondition); lifted axes have stride 0.
  int64_t q_stride[5], k_stride[5], v_stride[5], o_stride[5], lse_stride[5];
  // Additional keys / values: [batch, token, head].
  int64_t add_k_stride[3], add_v_stride[3];
  Geometry geo;
  int batch, heads, heads_per_kv, dim, dim_v, num_add;
  int groups;          // number of dilation groups (product of dilations)
  int q_tiles[kAxes];  // query tiles per axis over the largest group
  int q_tiles_total;
  int q_div[kAxes];    // tile walk (tiling.cuh walk_divisors)
  float scale_log2;    // scale * log2(e): the softmax runs on exp2
  int sm_count;        // the device's SMs (the strip forward's row segments)
};

// One configuration's launcher (kMT: 16-row m-tiles per warp). Returns cudaErrorInvalidConfiguration (without launching) when
// the kernel needs more shared memory than `max_smem_optin` bytes.
template <class T, int kD, int kRank, int kMT, class QT, class KT>
cudaError_t launch_fwd(const FwdParams& p, int max_smem_optin, cudaStream_t stream);

// Dynamic shared memory of one configuration's CTA (bytes), for choosing configurations that fit
// the device.
template <class T, int kD, int kRank, int kMT, class QT, class KT>
size_t fwd_smem_bytes();

// The Hopper (wgmma, sm_90a) kernels of fwd_sm90.cuh / fwd_sm90_ws.cuh, built when FNA_WITH_SM90
// is defined.
template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_fwd_sm90(const FwdParams& p, int max_smem_optin, cudaStream_t stream);
template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90_smem_bytes();

// The box forward of fwd_box.cuh (rank 2, 16-bit, mma.sync): the launcher returns
// cudaErrorInvalidConfiguration when the problem is outside its limits (fwd_box.h) or its shared
// memory exceeds `max_smem_optin`; the size below is the part that does not depend on the problem.
template <class T, int kD, class QT>
cudaError_t launch_fwd_box(const FwdParams& p, int max_smem_optin, cudaStream_t stream);
template <class T, int kD, class QT>
size_t fwd_box_smem_bytes();

// The strip forward of fwd_strip.cuh (rank 2, 16-bit, mma.sync; kPhases box rows side by side):
// the same contract as the box forward's launcher; the size below is a lower bound.
template <class T, int kD, int kPhases>
cudaError_t launch_fwd_strip(const FwdParams& p, int max_smem_optin, cudaStream_t stream);
template <class T, int kD, int kPhases>
size_t fwd_strip_smem_bytes();

// Whether launch_fwd_sm90 runs the warp-specialized kernel for 128-query tiles of rank `rank`:
// for 2-D and 3-D tiles, where it measured 1.05x (2d-large) and 1.07x (3d-video) the plain
// kernel's speed; not for 1-D tiles (0.965x on 1d-long: H100, bf16, commit eb06b1a,
// tools/gpu/env_ab.py). FNA_SM90_WS=0 / 1 in the environment forces the plain / the
// warp-specialized kernel (for comparisons).
inline bool use_fwd_sm90_ws(int rank) {
  const char* env = std::getenv("FNA_SM90_WS");
  if (env != nullptr && (env[0] == '0' || env[0] == '1')) return env[0] == '1';
  return rank >= 2;
}

// Whether the sm90 forward runs a tile of `q_size` queries of a rank-`rank` problem in the
// warp-specialized kernel: 192-query tiles always, 128-query ones where use_fwd_sm90_ws says so
// (64-query tiles never).
inline bool fwd_sm90_runs_ws(int q_size, int rank) {
  return q_size == 192 || (q_size == 128 && use_fwd_sm90_ws(rank));
}

// Whether each compute warpgroup of the warp-specialized forward takes only the run of key tiles
// its own 64 rows need and skips the mask on tiles inside all of their windows (rows_span,
// rows_walk), rather than the whole query tile's. FNA_FWD_WG_SKIP=0 turns it off (comparisons).
inline bool use_fwd_wg_skip() {
  const char* env = std::getenv("FNA_FWD_WG_SKIP");
  return !(env != nullptr && env[0] == '0');
}

}  // namespace fused
}  // namespace fna
