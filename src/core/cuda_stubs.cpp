// Definitions of the CUDA entry points for builds without them. They are never reached through
// the API (the dispatcher checks backend_compiled first); they exist so the library links.
#include "core/backends.h"

namespace fna {
namespace detail {

namespace {
[[maybe_unused]] Status missing(const char* what) {
  return {Code::not_compiled, std::string(what) + " is not compiled into this build of fna"};
}
}  // namespace

#if !defined(FNA_WITH_CUDA)
bool cuda_device_available() { return false; }
Status cuda_check_pointer(const void*, int, const char* arg) {
  return {Code::not_compiled, std::string(arg) + ": CUDA is not compiled into this build of fna"};
}
Status cuda_naive_forward(const Problem&, const ForwardArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_naive_backward(const Problem&, const BackwardArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_naive_qk_forward(const Problem&, const QKArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_naive_qk_backward(const Problem&, const QKBackwardArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_naive_av_forward(const Problem&, const AVArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_naive_av_backward(const Problem&, const AVBackwardArgs&, const Options&) { return missing("backend=cuda-naive"); }
Status cuda_gemm_forward(const Problem&, const ForwardArgs&, const Options&) { return missing("backend=cuda-gemm"); }
Status cuda_gemm_backward(const Problem&, const BackwardArgs&, const Options&) { return missing("backend=cuda-gemm"); }
Status cuda_gemm_qk_forward(const Problem&, const QKArgs&, const Options&) { return missing("backend=cuda-gemm"); }
Status cuda_gemm_qk_backward(const Problem&, const QKBackwardArgs&, const Options&) { return missing("backend=cuda-gemm"); }
Status cuda_gemm_av_forward(const Problem&, const AVArgs&, const Options&) { return missing("backend=cuda-gemm"); }
Status cuda_gemm_av_backward(const Problem&, const AVBackwardArgs&, const Options&) { return missing("backend=cuda-gemm"); }
#endif

#if !defined(FNA_WITH_CUDA_FUSED)
Status cuda_fused_forward(const Problem&, const ForwardArgs&, const Options&) { return missing("backend=cuda-fused"); }
Status cuda_fused_backward(const Problem&, const BackwardArgs&, const Options&) { return missing("backend=cuda-fused"); }
std::vector<std::string> cuda_fused_configs(int, DType, int64_t) { return {}; }
std::vector<std::string> cuda_fused_backward_configs(int, DType, int64_t) { return {}; }
Status cuda_fused_plan(const Problem&, const Options&, FusedPlan*) { return missing("backend=cuda-fused"); }
#endif

}  // namespace detail
}  // namespace fna
