// Placeholder until the fused backward kernels land: `cuda-fused` answers `unsupported`, and `auto`
// falls back to `cuda-naive`.
#include "core/backends.h"

namespace fna {
namespace detail {

Status cuda_fused_backward(const Problem&, const BackwardArgs&, const Options&) {
  return {Code::unsupported, "backend=cuda-fused: backward is not implemented yet"};
}

}  // namespace detail
}  // namespace fna
