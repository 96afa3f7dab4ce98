// cuda-naive and cuda-gemm unfused operators (public qk / av ops): the PN / NN / IN kernels of
// either set (cuda/gemm/kernel_set.cuh) reading and writing the user's attention tensor
// [B, *shape, H, W + N_add] in place of the workspace.
// Neighbor order is row-major over the window box; non-neighbor slots are -inf in qk's output,
// ignored by av, 0 in av_backward's d_attn, and their d_attn is ignored by qk_backward.
#include <cmath>

#include "core/backends.h"
#include "cuda/gemm/kernel_set.cuh"

namespace fna {
namespace detail {

namespace {

using naive::AddView;
using naive::Geometry;
using naive::View;

template <typename T, class K>
Status qk_forward_t(const Problem& p, const QKArgs& a, const Options& opt) {
  const Geometry g = naive::make_geometry(p);
  const int r = p.rank, G = g.group;
  const int64_t rows = g.batch * g.heads_kv * g.tokens * G;
  return K::template pn<T, T, false>(g, 0, rows, a.q.data, naive::user_view(a.q, r, G, true), a.k.data,
                         naive::user_view(a.k, r, 1, true), a.add_k.data, naive::add_view(a.add_k),
                         g.dim, a.attn.data, naive::user_view(a.attn, r, G, true),
                         static_cast<float>(opt.scale), -INFINITY, stream_of(opt),
                         naive::bias_view(a.rpb, r));
}

template <typename T, class K>
Status qk_backward_t(const Problem& p, const QKBackwardArgs& a, const Options& opt) {
  const Geometry g = naive::make_geometry(p);
  const int r = p.rank, G = g.group;
  const int64_t pairs = g.batch * g.heads_kv, rows = pairs * g.tokens * G;
  const cudaStream_t stream = stream_of(opt);
  const float scale = static_cast<float>(opt.scale);
  const View vq = naive::user_view(a.q, r, G, true), vk = naive::user_view(a.k, r, 1, true),
             vda = naive::user_view(a.d_attn, r, G, true);
  FNA_TRY((K::template nn<T, T, false>(g, 0, rows, a.d_attn.data, vda, a.k.data, vk, a.add_k.data,
                           naive::add_view(a.add_k), g.dim, a.dq.data,
                           naive::user_view(a.dq, r, G, true), scale, stream)));
  FNA_TRY((K::template inverse<T, T, false>(g, 0, pairs, a.d_attn.data, vda, a.q.data, vq, g.dim, a.dk.data,
                                naive::user_view(a.dk, r, 1, true), scale, stream)));
  return naive::add_grad<T, T>(g, 0, pairs, a.d_attn.data, vda, a.q.data, vq, g.dim,
                               a.d_add_k.data, naive::add_view(a.d_add_k), scale, stream);
}

template <typename T, class K>
Status av_forward_t(const Problem& p, const AVArgs& a, const Options& opt) {
  const Geometry g = naive::make_geometry(p);
  const int r = p.rank, G = g.group;
  const int64_t rows = g.batch * g.heads_kv * g.tokens * G;
  return K::template nn<T, T, false>(g, 0, rows, a.attn.data, naive::user_view(a.attn, r, G, true), a.v.data,
                         naive::user_view(a.v, r, 1, true), a.add_v.data, naive::add_view(a.add_v),
                         g.dim_v, a.o.data, naive::user_view(a.o, r, G, true), 1.f,
                         stream_of(opt));
}

template <typename T, class K>
Status av_backward_t(const Problem& p, const AVBackwardArgs& a, const Options& opt) {
  const Geometry g = naive::make_geometry(p);
  const int r = p.rank, G = g.group;
  const int64_t pairs = g.batch * g.heads_kv, rows = pairs * g.tokens * G;
  const cudaStream_t stream = stream_of(opt);
  const View vattn = naive::user_view(a.attn, r, G, true),
             vdo = naive::user_view(a.d_o, r, G, true);
  FNA_TRY((K::template pn<T, T, false>(g, 0, rows, a.d_o.data, vdo, a.v.data, naive::user_view(a.v, r, 1, true),
                           a.add_v.data, naive::add_view(a.add_v), g.dim_v, a.d_attn.data,
                           naive::user_view(a.d_attn, r, G, true), 1.f, 0.f, stream)));
  FNA_TRY((K::template inverse<T, T, false>(g, 0, pairs, a.attn.data, vattn, a.d_o.data, vdo, g.dim_v,
                                a.dv.data, naive::user_view(a.dv, r, 1, true), 1.f, stream)));
  return naive::add_grad<T, T>(g, 0, pairs, a.attn.data, vattn, a.d_o.data, vdo, g.dim_v,
                               a.d_add_v.data, naive::add_view(a.d_add_v), 1.f, stream);
}

}  // namespace

#define FNA_UNFUSED_ENTRY(prefix, op, Args, backend, kernel_set, check)                             \
  Status prefix##_##op(const Problem& p, const Args& a, const Options& opt) {                  \
    FNA_TRY(validate_backend_limits(p, backend));                                              \
    DeviceGuard guard;                                                                         \
    FNA_TRY(guard.set(opt.device_index));                                                      \
    FNA_TRY(check);                                                                            \
    return naive::dispatch_dtype(p.dtype,                                                      \
                                 [&](auto t) { return op##_t<decltype(t), kernel_set>(p, a, opt); }); \
  }
#define FNA_NAIVE_ENTRY(op, Args) \
  FNA_UNFUSED_ENTRY(cuda_naive, op, Args, Backend::cuda_naive, kernels::Naive, Status::Ok())
#define FNA_GEMM_ENTRY(op, Args)                                                \
  FNA_UNFUSED_ENTRY(cuda_gemm, op, Args, Backend::cuda_gemm, kernels::Gemm, \
                    gemm::check(p, opt.device_index))

FNA_NAIVE_ENTRY(qk_forward, QKArgs)
FNA_NAIVE_ENTRY(qk_backward, QKBackwardArgs)
FNA_NAIVE_ENTRY(av_forward, AVArgs)
FNA_NAIVE_ENTRY(av_backward, AVBackwardArgs)
FNA_GEMM_ENTRY(qk_forward, QKArgs)
FNA_GEMM_ENTRY(qk_backward, QKBackwardArgs)
FNA_GEMM_ENTRY(av_forward, AVArgs)
FNA_GEMM_ENTRY(av_backward, AVBackwardArgs)
#undef FNA_GEMM_ENTRY
#undef FNA_NAIVE_ENTRY
#undef FNA_UNFUSED_ENTRY

}  // namespace detail
}  // namespace fna
