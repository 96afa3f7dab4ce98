// The backward configuration table (Options::backward_config, fna::fused_backward_configs): the
// kernels' row counts are fixed per (dtype, padded head dim) (BwdShape, launch/bwd_launch.cuh);
// a configuration names the dK / dV kernel's family and how those rows spread over the axes.
#pragma once

#include <string>
#include <vector>

#include "cuda/fused/kernel/common/tiling.cuh"
#include "cuda/fused/plan/plan.h"
#include "fna/fna.h"

namespace fna {
namespace bwd {

using fused::kAxes;

// One backward configuration: tile shapes lifted to kAxes (leading extents 1 below rank 3).
struct BwdConfig {
  fused::BwdFamily family;  // the dK / dV kernel
  int rank;
  DType dtype;
  int dim;       // padded head dim (64, 128, 256)
  int kv[kAxes]; // dK/dV kernel: the key tile it owns
  int q[kAxes];  //   and the query tiles it visits
  int dq_q[kAxes];   // dQ kernel (deterministic mode): the query tile it owns
  int dq_kv[kAxes];  //   and the key tiles it visits
  std::string name() const;
};

// The padded head dim the kernels are compiled for (64, 128 or 256).
int padded_dim(int64_t dmax);
// Whether this build has the Hopper dK / dV kernel of `family` (sm90 or sm90ws) for (dtype,
// padded head dim): both up to 128, the warp-specialized one also at 256.
bool sm90_built(DType dtype, int dpad, fused::BwdFamily family);
// The configurations for (rank, dtype, max(D, D_v)); empty above 256.
std::vector<BwdConfig> bwd_configs(int rank, DType dtype, int64_t dmax);

}  // namespace bwd
}  // namespace fna
