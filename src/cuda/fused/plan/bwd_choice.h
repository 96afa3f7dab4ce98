// Host: the fused backward's plan, decided once per call from the problem, the device and the
// options (make_bwd_plan, bwd_choice.cu): the dK / dV kernel's family and tiles, the dQ mode,
// the bias's d rpb sums, grids, walks and TMA maps. backward.cu runs it (cuda_fused_backward)
// and reports it (cuda_fused_backward_plan).
#pragma once

#include <string>

#include "core/backends.h"
#include "cuda/fused/configs/backward_table.h"
#include "cuda/fused/launch/bwd_launch.cuh"
#include "cuda/fused/plan/bwd_plan.h"

namespace fna {
namespace bwd {

inline Status invalid(const std::string& m) { return {Code::invalid_argument, m}; }
inline Status unsupported(const std::string& why) {
  return {Code::unsupported, "backend=cuda-fused backward: " + why};
}

// Everything the backward runs, decided once: tiles and walks of both kernels, the dK / dV
// kernel's family, the dQ mode, grids, and the TMA maps; p_dkdv / p_dq are the call's Params with
// each kernel's tiles.
struct BwdPlan {
  BwdConfig cfg{};  // the configuration that runs (Options::backward_config or the plan's)
  int dpad = 64;
  BwdLaunch launch;
  int walk[kAxes] = {2, 1, 0};
  Params p_dkdv{}, p_dq{};
  TileRows rows{};
};

// The plan of the call: `p` carries its geometry, sizes and strides (placeholders when planning
// without tensors).
Status make_bwd_plan(const Problem& pr, const Options& opt, const Params& p, BwdPlan* plan);

// The dK / dV kernel's name as the launch records it and the plan reports it.
std::string backward_name(const BwdPlan& plan, DType dtype);

}  // namespace bwd
}  // namespace fna
