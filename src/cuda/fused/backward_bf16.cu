// Instantiations of the fused backward kernels for bf16 (padded head dims 64 and 128; 256 in
// backward_bf16_256.cu); one file per dtype so they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<__nv_bfloat16, 64>(const Params&, const Params&, dim3, dim3, dim3,
                                         cudaStream_t);
template Status launch_backward<__nv_bfloat16, 128>(const Params&, const Params&, dim3, dim3, dim3,
                                          cudaStream_t);

}  // namespace bwd
}  // namespace fna
