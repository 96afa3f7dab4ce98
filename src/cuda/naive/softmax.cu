// Row softmax forward / backward over the f32 workspace, one warp per row of attention weights.
#include <cmath>

#include "cuda/naive/kernels.cuh"

namespace fna {
namespace naive {

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Every row holds at least the query itself (every window contains its query), so the row maximum
// is finite and the sum is >= 1. kRegion: the rows are the query region's, LSE at region
// coordinates.
template <bool kRegion>
__global__ void softmax_forward_kernel(Geo<kRegion> g, int64_t p0, int64_t rows, float* ws,
                                       float* lse, View vlse) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < rows;
       r += int64_t(gridDim.x) * kWarpsPerBlock) {
    float* s = ws + r * g.cols;
    float m = -INFINITY;
    for (int c = lane; c < g.cols; c += 32) m = fmaxf(m, s[c]);
    m = warp_max(m);
    float sum = 0.f;
    for (int c = lane; c < g.cols; c += 32) sum += expf(s[c] - m);
    sum = warp_sum(sum);
    const float inv = 1.f / sum;
    for (int c = lane; c < g.cols; c += 32) s[c] = expf(s[c] - m) * inv;
    if (lse != nullptr && lane == 0) {
      const Row row = decode_row<kRegion>(g, p0, r);
      lse[vlse.at(row.b, query_coords<kRegion>(row), row.hkv, row.g, 0)] = m + logf(sum);
    }
  }
}

// P is renormalized from the row itself rather than taken as exp(s - LSE): the forward's LSE was
// rounded separately, and a row whose softmax is exactly one-hot (K = 1, or a causal row that
// sees only its query) must give dS = 0 exactly, as the true gradient is.
// d_lse (a user LSE view; null = zero): the gradient into the row's LSE. d LSE / d s_j = P_j, so
// it adds P_j * d_lse to dS_j, i.e. it is subtracted from sum(P * dP). kRegion as in the forward.
template <bool kRegion>
__global__ void softmax_backward_kernel(Geo<kRegion> g, int64_t p0, int64_t rows, float* ws_s,
                                        float* ws_dp, const float* d_lse, View vdlse) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < rows;
       r += int64_t(gridDim.x) * kWarpsPerBlock) {
    float* s = ws_s + r * g.cols;
    float* dp = ws_dp + r * g.cols;
    float m = -INFINITY;
    for (int c = lane; c < g.cols; c += 32) m = fmaxf(m, s[c]);
    m = warp_max(m);
    float sum = 0.f;
    for (int c = lane; c < g.cols; c += 32) sum += expf(s[c] - m);  // masked slots: exp(-inf) = 0
    const float inv = 1.f / warp_sum(sum);
    float delta = 0.f;
    for (int c = lane; c < g.cols; c += 32) {
      const float p = expf(s[c] - m) * inv;
      s[c] = p;
      delta = fmaf(p, dp[c], delta);
    }
    delta = warp_sum(delta);
    if (d_lse != nullptr) {
      const Row row = decode_row<kRegion>(g, p0, r);
      delta -= d_lse[vdlse.at(row.b, query_coords<kRegion>(row), row.hkv, row.g, 0)];
    }
    for (int c = lane; c < g.cols; c += 32) dp[c] = s[c] * (dp[c] - delta);
  }
}

unsigned warp_grid(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < (int64_t(1) << 20) ? (blocks > 0 ? blocks : 1)
                                                           : (int64_t(1) << 20));
}

}  // namespace

cudaError_t launch_softmax_forward(const Geometry& g, int64_t p0, int64_t rows, float* ws,
                                   float* lse, const View& vlse, cudaStream_t stream) {
  softmax_forward_kernel<false><<<warp_grid(rows), kThreads, 0, stream>>>(g, p0, rows, ws, lse,
                                                                          vlse);
  return cudaGetLastError();
}

cudaError_t launch_softmax_forward(const RegionGeometry& g, int64_t p0, int64_t rows, float* ws,
                                   float* lse, const View& vlse, cudaStream_t stream) {
  softmax_forward_kernel<true><<<warp_grid(rows), kThreads, 0, stream>>>(g, p0, rows, ws, lse,
                                                                         vlse);
  return cudaGetLastError();
}

cudaError_t launch_softmax_backward(const Geometry& g, int64_t p0, int64_t rows, float* s,
                                    float* dp, const float* d_lse, const View& vdlse,
                                    cudaStream_t stream) {
  softmax_backward_kernel<false><<<warp_grid(rows), kThreads, 0, stream>>>(g, p0, rows, s, dp,
                                                                           d_lse, vdlse);
  return cudaGetLastError();
}

cudaError_t launch_softmax_backward(const RegionGeometry& g, int64_t p0, int64_t rows, float* s,
                                    float* dp, const float* d_lse, const View& vdlse,
                                    cudaStream_t stream) {
  softmax_backward_kernel<true><<<warp_grid(rows), kThreads, 0, stream>>>(g, p0, rows, s, dp,
                                                                          d_lse, vdlse);
  return cudaGetLastError();
}

}  // namespace naive
}  // namespace fna
