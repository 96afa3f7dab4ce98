// Instantiations of the fused backward kernels for f16 (padded head dims 64 and 128; 256 in
// backward_f16_256.cu); one file per dtype so they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<__half, 64>(const Params&, const Params&, dim3, dim3, dim3,
                                         cudaStream_t);
template Status launch_backward<__half, 128>(const Params&, const Params&, dim3, dim3, dim3,
                                          cudaStream_t);

}  // namespace bwd
}  // namespace fna
