// The operator kernels a composed call runs (cuda/naive/ops.cu, unfused.cu): cuda-naive's one
// thread per output element, or cuda-gemm's tensor-core tiles. Both sets take the naive
// launchers' arguments, so the compositions are written once.
#pragma once

#include "cuda/gemm/launch.cuh"
#include "cuda/naive/launch.cuh"

namespace fna {
namespace kernels {

struct Naive {
  static constexpr const char* kForwardWorkspace = "cuda-naive forward attention weights";
  static constexpr const char* kBackwardWorkspace =
      "cuda-naive backward attention weights and gradients";
  template <typename TIn, typename TOut, bool kRegion>
  static Status pn(const naive::Geo<kRegion>& g, int64_t p0, int64_t rows, const void* a,
                   const naive::View& va, const void* b, const naive::View& vb, const void* add_b,
                   const naive::AddView& vab, int width, void* out, const naive::View& vo,
                   float scale, float masked, cudaStream_t stream,
                   const naive::Bias& bias = naive::Bias{}) {
    return naive::pn<TIn, TOut, kRegion>(g, p0, rows, a, va, b, vb, add_b, vab, width, out, vo,
                                         scale, masked, stream, bias);
  }
  template <typename TAttn, typename T, bool kRegion>
  static Status nn(const naive::Geo<kRegion>& g, int64_t p0, int64_t rows, const void* attn,
                   const naive::View& vattn, const void* b, const naive::View& vb,
                   const void* add_b, const naive::AddView& vab, int width, void* out,
                   const naive::View& vo, float scale, cudaStream_t stream) {
    return naive::nn<TAttn, T, kRegion>(g, p0, rows, attn, vattn, b, vb, add_b, vab, width, out,
                                        vo, scale, stream);
  }
  template <typename TAttn, typename T, bool kRegion>
  static Status inverse(const naive::Geo<kRegion>& g, int64_t p0, int64_t pairs, const void* attn,
                        const naive::View& vattn, const void* a, const naive::View& va, int width,
                        void* out, const naive::View& vo, float scale, cudaStream_t stream) {
    return naive::inverse<TAttn, T, kRegion>(g, p0, pairs, attn, vattn, a, va, width, out, vo,
                                             scale, stream);
  }
};

// Whole-grid calls only (no query region): `rows` covers whole (batch, kv head) pairs. The
// additional keys' gradients stay on the naive kernel (naive::add_grad), which both sets share.
struct Gemm {
  static constexpr const char* kForwardWorkspace = "cuda-gemm forward attention weights";
  static constexpr const char* kBackwardWorkspace =
      "cuda-gemm backward attention weights and gradients";
  template <typename TIn, typename TOut, bool kRegion>
  static Status pn(const naive::Geometry& g, int64_t p0, int64_t rows, const void* a,
                   const naive::View& va, const void* b, const naive::View& vb, const void* add_b,
                   const naive::AddView& vab, int width, void* out, const naive::View& vo,
                   float scale, float masked, cudaStream_t stream,
                   const naive::Bias& bias = naive::Bias{}) {
    static_assert(!kRegion, "cuda-gemm takes no query region");
    return gemm::pn<TIn, TOut>(g, p0, rows / (g.tokens * g.group), a, va, b, vb, add_b, vab,
                               width, out, vo, scale, masked, stream, bias);
  }
  template <typename TAttn, typename T, bool kRegion>
  static Status nn(const naive::Geometry& g, int64_t p0, int64_t rows, const void* attn,
                   const naive::View& vattn, const void* b, const naive::View& vb,
                   const void* add_b, const naive::AddView& vab, int width, void* out,
                   const naive::View& vo, float scale, cudaStream_t stream) {
    static_assert(!kRegion, "cuda-gemm takes no query region");
    return gemm::nn<TAttn, T>(g, p0, rows / (g.tokens * g.group), attn, vattn, b, vb, add_b, vab,
                              width, out, vo, scale, stream);
  }
  template <typename TAttn, typename T, bool kRegion>
  static Status inverse(const naive::Geometry& g, int64_t p0, int64_t pairs, const void* attn,
                        const naive::View& vattn, const void* a, const naive::View& va, int width,
                        void* out, const naive::View& vo, float scale, cudaStream_t stream) {
    static_assert(!kRegion, "cuda-gemm takes no query region");
    return gemm::inverse<TAttn, T>(g, p0, pairs, attn, vattn, a, va, width, out, vo, scale,
                                   stream);
  }
};

}  // namespace kernels
}  // namespace fna
