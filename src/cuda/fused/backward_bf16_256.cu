// Instantiation of the fused backward kernels for bf16 at padded head dim 256 (head dims 129-256:
// two dK/dV passes, bwd_launch.cuh), in its own file so it compiles in parallel with the others.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<__nv_bfloat16, 256>(const Params&, const Params&, dim3, dim3, dim3,
                                          cudaStream_t);

}  // namespace bwd
}  // namespace fna
