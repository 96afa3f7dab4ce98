// Instantiations of the fused backward kernels for float32 with plain TF32 products (mma::TF32,
// Options::allow_tf32: operands rounded to TF32 once, ~1e-3 relative), padded head dims 64 and
// 128 (256 in backward_tf32_256.cu).
#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<mma::TF32, 64>(const Params&, const Params&, dim3, dim3, dim3,
                                               cudaStream_t);
template Status launch_backward<mma::TF32, 128>(const Params&, const Params&, dim3, dim3, dim3,
                                                cudaStream_t);

}  // namespace bwd
}  // namespace fna
