// Temporary: replaced by the fast CPU backend.
#include "core/backends.h"
namespace fna { namespace detail {
#define STUB(fn, A) Status cpu_##fn(const Problem&, const A&, const Options&) { return {Code::unsupported, "cpu backend not yet built"}; }
STUB(forward, ForwardArgs) STUB(backward, BackwardArgs) STUB(qk_forward, QKArgs) STUB(qk_backward, QKBackwardArgs) STUB(av_forward, AVArgs) STUB(av_backward, AVBackwardArgs)
}}
