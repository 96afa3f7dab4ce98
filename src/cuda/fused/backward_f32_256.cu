// Instantiation of the float32 (split TF32) fused backward at padded head dim 256 (head dims
// 129-256: two dK/dV passes, bwd_launch.cuh), in its own file so it compiles in parallel.
#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

template Status launch_backward<mma::F32, 256>(const Params&, const Params&, dim3, dim3, dim3,
                                               cudaStream_t);

}  // namespace bwd
}  // namespace fna
