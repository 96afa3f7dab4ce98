// Host-side launchers for the naive kernels: one grid-stride launch each, the launch error
// checked right after (as a Status naming the operator), and the dtype switch of an entry point.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/runtime.cuh"
#include "cuda/naive/kernels.cuh"

namespace fna {
namespace naive {

// kRegion: the fused forward / backward with a query region (kernels.cuh); `rows` then counts the
// region's query rows.
template <typename TIn, typename TOut, bool kRegion = false>
Status pn(const Geo<kRegion>& g, int64_t p0, int64_t rows, const void* a, const View& va,
          const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
          void* out, const View& vo, float scale, float masked, cudaStream_t stream,
          const Bias& bias = Bias{}) {
  pn_kernel<TIn, TOut, kRegion><<<grid_for(rows * g.cols), kThreads, 0, stream>>>(
      g, p0, rows, static_cast<const TIn*>(a), va, static_cast<const TIn*>(b), vb,
      static_cast<const TIn*>(add_b), vab, width, static_cast<TOut*>(out), vo, scale, masked,
      bias);
  FNA_CUDA_CHECK_LAUNCH("cuda-naive PN kernel");
  return Status::Ok();
}

template <typename TAttn, typename T, bool kRegion = false>
Status nn(const Geo<kRegion>& g, int64_t p0, int64_t rows, const void* attn, const View& vattn,
          const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
          void* out, const View& vo, float scale, cudaStream_t stream) {
  nn_kernel<TAttn, T, kRegion><<<grid_for(rows * width), kThreads, 0, stream>>>(
      g, p0, rows, static_cast<const TAttn*>(attn), vattn, static_cast<const T*>(b), vb,
      static_cast<const T*>(add_b), vab, width, static_cast<T*>(out), vo, scale);
  FNA_CUDA_CHECK_LAUNCH("cuda-naive NN kernel");
  return Status::Ok();
}

// `pairs` (batch, kv head) pairs starting at p0: every key token of them (of the whole grid, also
// with kRegion).
template <typename TAttn, typename T, bool kRegion = false>
Status inverse(const Geo<kRegion>& g, int64_t p0, int64_t pairs, const void* attn,
               const View& vattn, const void* a, const View& va, int width, void* out,
               const View& vo, float scale, cudaStream_t stream) {
  const int64_t kv_rows = pairs * g.tokens;
  in_kernel<TAttn, T, kRegion><<<grid_for(kv_rows * width), kThreads, 0, stream>>>(
      g, p0, kv_rows, static_cast<const TAttn*>(attn), vattn, static_cast<const T*>(a), va, width,
      static_cast<T*>(out), vo, scale);
  FNA_CUDA_CHECK_LAUNCH("cuda-naive IN kernel");
  return Status::Ok();
}

template <typename TAttn, typename T, bool kRegion = false>
Status add_grad(const Geo<kRegion>& g, int64_t p0, int64_t pairs, const void* attn,
                const View& vattn, const void* a, const View& va, int width, void* out,
                const AddView& vo, float scale, cudaStream_t stream) {
  if (g.num_add == 0) return Status::Ok();
  add_grad_kernel<TAttn, T, kRegion><<<grid_for(pairs * g.num_add * width), kThreads, 0,
                                       stream>>>(
      g, p0, pairs, static_cast<const TAttn*>(attn), vattn, static_cast<const T*>(a), va, width,
      static_cast<T*>(out), vo, scale);
  FNA_CUDA_CHECK_LAUNCH("cuda-naive additional-KV gradient kernel");
  return Status::Ok();
}

// Calls fn.template operator()<T>() with T the CUDA element type of `dtype`.
template <typename Fn>
Status dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f16: return fn(__half{});
    case DType::bf16: return fn(__nv_bfloat16{});
  }
  return {Code::unsupported, "cuda-naive: unknown dtype"};
}

#define FNA_TRY(expr)                  \
  do {                                 \
    ::fna::Status fna_st_ = (expr);    \
    if (!fna_st_.ok()) return fna_st_; \
  } while (0)

}  // namespace naive
}  // namespace fna
