// Placeholder until the fused forward kernels land: `cuda-fused` answers `unsupported`, and `auto`
// falls back to `cuda-naive`.
#include "core/backends.h"

namespace fna {
namespace detail {

Status cuda_fused_forward(const Problem&, const ForwardArgs&, const Options&) {
  return {Code::unsupported, "backend=cuda-fused: forward is not implemented yet"};
}

std::vector<std::string> cuda_fused_configs(int, DType, int64_t) { return {}; }

}  // namespace detail
}  // namespace fna
