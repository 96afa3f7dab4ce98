// Internal backend entry points. The dispatcher (api.cpp) calls these only after validation, with
// Options::scale already resolved to a positive value, and only for backends compiled in.
#pragma once

#include "fna/fna.h"

namespace fna {
namespace detail {

#define FNA_DECLARE_BACKEND(prefix)                                                          \
  Status prefix##_forward(const Problem& p, const ForwardArgs& a, const Options& opt);      \
  Status prefix##_backward(const Problem& p, const BackwardArgs& a, const Options& opt);   \
  Status prefix##_qk_forward(const Problem& p, const QKArgs& a, const Options& opt);       \
  Status prefix##_qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt); \
  Status prefix##_av_forward(const Problem& p, const AVArgs& a, const Options& opt);       \
  Status prefix##_av_backward(const Problem& p, const AVBackwardArgs& a, const Options& opt);

FNA_DECLARE_BACKEND(reference)
FNA_DECLARE_BACKEND(cpu)
FNA_DECLARE_BACKEND(cuda_naive)
FNA_DECLARE_BACKEND(cuda_gemm)
#undef FNA_DECLARE_BACKEND

// The fused backend has no unfused operators.
Status cuda_fused_forward(const Problem& p, const ForwardArgs& a, const Options& opt);
Status cuda_fused_backward(const Problem& p, const BackwardArgs& a, const Options& opt);
std::vector<std::string> cuda_fused_configs(int rank, DType dtype, int64_t dim);
std::vector<std::string> cuda_fused_backward_configs(int rank, DType dtype, int64_t dim);
Status cuda_fused_plan(const Problem& p, const Options& opt, FusedPlan* plan);
// The backward_* fields of FusedPlan (called by cuda_fused_plan; CUDA builds only).
Status cuda_fused_backward_plan(const Problem& p, const Options& opt, FusedPlan* plan);

// CUDA runtime helpers (defined in src/cuda/common/runtime.cu; stubs without CUDA).
bool cuda_device_available();
// Checks that `ptr` is device-accessible memory on `device_index`; message names `arg`.
Status cuda_check_pointer(const void* ptr, int device_index, const char* arg);

inline int64_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

}  // namespace detail
}  // namespace fna
