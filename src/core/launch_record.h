// What the last cuda-fused launch of the calling thread ran, written by the fused launch paths
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
// Defined with the fused backend (FNA_WITH_CUDA_FUSED).
LaunchRecord& last_launch();

}  // namespace detail
}  // namespace fna
