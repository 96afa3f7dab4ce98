// Instantiations of the fused backward kernels for float32 on the TF32 tensor cores, split TF32
// (mma::F32: three TF32 products per float32 product, float32 accuracy), padded head dims 64 and
// 128 (256 in backward_f32_256.cu; plain TF32 in backward_tf32*.cu).
#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<mma::F32, 64>(const Params&, const Params&, dim3, dim3, dim3,
                                              cudaStream_t);
template Status launch_backward<mma::F32, 128>(const Params&, const Params&, dim3, dim3, dim3,
                                               cudaStream_t);

}  // namespace bwd
}  // namespace fna
