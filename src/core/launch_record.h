// What the last cuda-fused launches of the process ran, written by the fused launch paths
// from the plan they consumed (src/cuda/fused/plan/forward.cu, backward.cu). For tests: the plan that
// fna::fused_plan reports is the kernel launched. Plain C++ (the Python bindings read it).
#pragma once

#include <cstddef>
#include <string>

namespace fna {
namespace detail {

struct LaunchRecord {
  std::string forward;   // forward configuration launched ("" none yet)
  std::string backward;  // backward configuration launched
  bool forward_tma = false, backward_tma = false;
  unsigned forward_grid = 0;
  size_t forward_smem = 0;
};
// Defined with the fused backend (FNA_WITH_CUDA_FUSED); thread-safe (autograd runs the backward
// on its own thread). A copy of the record, and the writers of its forward / backward halves.
LaunchRecord last_launch();
void record_forward_launch(const std::string& config, bool tma, unsigned grid, size_t smem);
void record_backward_launch(const std::string& config, bool tma);

}  // namespace detail
}  // namespace fna
