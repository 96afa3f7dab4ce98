// The Hopper (wgmma, sm_90a) dK / dV kernels of the fused backward (bwd_dkdv_sm90.cuh, plain;
// bwd_dkdv_sm90_ws.cuh, warp-specialized), built in the sm_90a object library when FNA_WITH_SM90
// is defined; launch_backward (bwd_launch.cuh) calls them when the plan's family is sm90 or
// sm90ws (16-bit, padded head dims 64 and 128, atomic dQ).
#pragma once

#include <cuda_runtime.h>

#include "core/backends.h"
#include "cuda/fused/configs/backward.h"
#include "cuda/fused/kernel/common/bwd_params.cuh"
#include "cuda/fused/plan/bwd_plan.h"

namespace fna {
namespace bwd {

// dK / dV (neighborhood tiles l.grid_dkdv, additional keys l.grid_add) with dQ accumulated into
// p.dq_accum by atomics, then dQ converted; p's tiles must be l.kv_rows keys (64 or 128; the
// warp-specialized kernel: 128) x 64 queries (l.q_steps of them per step).
template <typename T, int kD>
Status launch_dkdv_sm90(const Params& p, const BwdLaunch& l, cudaStream_t stream);
// The dynamic shared memory of family f's kernel with kv_rows-key tiles and q_steps query tiles
// per step (bytes).
template <typename T, int kD>
size_t dkdv_sm90_smem(fused::BwdFamily f, int kv_rows, int q_steps);


}  // namespace bwd
}  // namespace fna
