// Instantiations of the fused backward kernels for float32 on the TF32 tensor cores, split TF32
// (mma::F32: three TF32 products per float32 product, float32 accuracy), padded head dims 64 and
// 128. Plain TF32 (mma::TF32) and head dim 256 compile from the same templates but are not
// instantiated until validated on a device (backward.cu).
#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<mma::F32, 64>(const Params&, const Params&, dim3, dim3, dim3,
                                              cudaStream_t);
template Status launch_backward<mma::F32, 128>(const Params&, const Params&, dim3, dim3, dim3,
                                               cudaStream_t);

}  // namespace bwd
}  // namespace fna
