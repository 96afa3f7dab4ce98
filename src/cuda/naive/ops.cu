// cuda-naive and cuda-gemm forward and backward: the unfused operator chain of the paper's
// sections 3.1 / 3.2 over an f32 workspace of attention weights, on the naive kernels or the GEMM
// ones (kernels::Naive / kernels::Gemm, cuda/gemm/kernel_set.cuh).
//   forward:  S = scale * PN(Q, K)           -> softmax (P, LSE) -> O = NN(P, V)
//   backward: S = scale * PN(Q, K), dP = PN(dO, V) -> P = softmax(S),
//             dS = P (dP - (rowsum(P dP) - d_lse))  (d_lse: the gradient into the LSE, or 0)
//             dQ = scale * NN(dS, K), dK = scale * IN(dS, Q), dV = IN(P, dO)
// The workspace holds all rows of a chunk of (batch, kv head) pairs; a chunk always holds whole
// pairs, so the IN sums over every query (and every query head of the group) of its keys.
// The backward renormalizes P from the recomputed logits instead of reading the LSE input (see
// softmax.cu); the LSE is still validated and produced by the forward for callers that need it.
// A query region (Problem::query_offset / query_shape) runs the kRegion kernels: the workspace
// holds the region's query rows only (N = query_tokens), query-role tensors (Q, O, dO, dQ, LSE,
// d_LSE) are read and written at region coordinates, windows are the global coordinates' in the
// whole grid, and dK / dV / the additional keys' gradients sum over the region's queries only
// (cuda-naive only).
#include <algorithm>
#include <cmath>

#include "core/backends.h"
#include "cuda/gemm/kernel_set.cuh"

namespace fna {
namespace detail {

namespace {

using naive::AddView;
using naive::Geo;
using naive::Geometry;
using naive::View;

// How many (batch, kv head) pairs one workspace chunk holds, with `buffers` f32 row buffers (one
// row per query token of the region, which is the whole grid without one).
struct Chunks {
  int64_t pairs;      // B * H_kv
  int64_t per_chunk;  // pairs per chunk
  size_t bytes;       // workspace bytes for one chunk
};

// opt.tuning.naive_workspace_bytes, when set, replaces the budget (a tiny one forces one pair per
// chunk, so small test problems take the chunked path that only large problems take otherwise).
Chunks plan_chunks(const Geometry& g, int64_t queries, int buffers, const Options& opt) {
  Chunks c;
  c.pairs = g.batch * g.heads_kv;
  const size_t per_pair = size_t(queries) * g.group * g.cols * sizeof(float) * buffers;
  // Half the free memory at most (the caller's tensors and other streams need the rest), and a
  // cap so one call does not hold many GiB for the naive path's benefit.
  size_t budget = size_t(opt.tuning.naive_workspace_bytes);
  if (budget == 0) budget = std::min(cuda_free_memory() / 2, size_t(4) << 30);
  c.per_chunk = std::max<int64_t>(1, std::min<int64_t>(c.pairs, int64_t(budget / per_pair)));
  c.bytes = per_pair * size_t(c.per_chunk);
  return c;
}

template <typename T, bool kRegion, class K>
Status forward_t(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const Geo<kRegion> g = naive::make_geo<kRegion>(p);
  const int64_t queries = naive::query_tokens(g);
  const int r = p.rank, G = g.group;
  const cudaStream_t stream = stream_of(opt);
  const View vq = naive::user_view(a.q, r, G, true), vk = naive::user_view(a.k, r, 1, true),
             vv = naive::user_view(a.v, r, 1, true), vo = naive::user_view(a.o, r, G, true);
  const View vlse = a.lse.data ? naive::user_view(a.lse, r, G, false) : View{};
  const AddView vak = naive::add_view(a.add_k), vav = naive::add_view(a.add_v);
  const float scale = static_cast<float>(opt.scale);

  const Chunks ch = plan_chunks(g, queries, 1, opt);
  Workspace ws(stream);
  FNA_TRY(ws.allocate(ch.bytes, K::kForwardWorkspace));
  for (int64_t p0 = 0; p0 < ch.pairs; p0 += ch.per_chunk) {
    const int64_t np = std::min(ch.per_chunk, ch.pairs - p0);
    const int64_t rows = np * queries * G;
    const View vw = naive::workspace_view(g, p0);
    FNA_TRY((K::template pn<T, float, kRegion>(g, p0, rows, a.q.data, vq, a.k.data, vk, a.add_k.data,
                                          vak, g.dim, ws.get(), vw, scale, -INFINITY, stream)));
    FNA_CUDA_TRY(naive::launch_softmax_forward(g, p0, rows, ws.as<float>(),
                                               static_cast<float*>(a.lse.data), vlse, stream));
    FNA_TRY((K::template nn<float, T, kRegion>(g, p0, rows, ws.get(), vw, a.v.data, vv, a.add_v.data,
                                          vav, g.dim_v, a.o.data, vo, 1.f, stream)));
  }
  return Status::Ok();
}

template <typename T, bool kRegion, class K>
Status backward_t(const Problem& p, const BackwardArgs& a, const Options& opt) {
  const Geo<kRegion> g = naive::make_geo<kRegion>(p);
  const int64_t queries = naive::query_tokens(g);
  const int r = p.rank, G = g.group;
  const cudaStream_t stream = stream_of(opt);
  const View vq = naive::user_view(a.q, r, G, true), vk = naive::user_view(a.k, r, 1, true),
             vv = naive::user_view(a.v, r, 1, true), vdo = naive::user_view(a.d_o, r, G, true);
  const View vdq = naive::user_view(a.dq, r, G, true), vdk = naive::user_view(a.dk, r, 1, true),
             vdv = naive::user_view(a.dv, r, 1, true);
  const AddView vak = naive::add_view(a.add_k), vav = naive::add_view(a.add_v),
                vdak = naive::add_view(a.d_add_k), vdav = naive::add_view(a.d_add_v);
  const View vdlse = a.d_lse.data ? naive::user_view(a.d_lse, r, G, false) : View{};
  const float scale = static_cast<float>(opt.scale);

  const Chunks ch = plan_chunks(g, queries, 2, opt);
  Workspace ws(stream);
  FNA_TRY(ws.allocate(ch.bytes, K::kBackwardWorkspace));
  float* ws_p = ws.as<float>();                       // S, then P
  float* ws_ds = ws_p + ch.bytes / 2 / sizeof(float);  // dP, then dS
  for (int64_t p0 = 0; p0 < ch.pairs; p0 += ch.per_chunk) {
    const int64_t np = std::min(ch.per_chunk, ch.pairs - p0);
    const int64_t rows = np * queries * G;
    const View vw = naive::workspace_view(g, p0);
    FNA_TRY((K::template pn<T, float, kRegion>(g, p0, rows, a.q.data, vq, a.k.data, vk, a.add_k.data,
                                          vak, g.dim, ws_p, vw, scale, -INFINITY, stream)));
    // Masked slots of dP only ever meet P = 0, so any finite value does.
    FNA_TRY((K::template pn<T, float, kRegion>(g, p0, rows, a.d_o.data, vdo, a.v.data, vv,
                                          a.add_v.data, vav, g.dim_v, ws_ds, vw, 1.f, 0.f,
                                          stream)));
    FNA_CUDA_TRY(naive::launch_softmax_backward(g, p0, rows, ws_p, ws_ds,
                                                static_cast<const float*>(a.d_lse.data), vdlse,
                                                stream));
    FNA_TRY((K::template nn<float, T, kRegion>(g, p0, rows, ws_ds, vw, a.k.data, vk, a.add_k.data,
                                          vak, g.dim, a.dq.data, vdq, scale, stream)));
    // dK / dV over every key of the grid (keys no region query sees get 0).
    FNA_TRY((K::template inverse<float, T, kRegion>(g, p0, np, ws_ds, vw, a.q.data, vq, g.dim,
                                               a.dk.data, vdk, scale, stream)));
    FNA_TRY((K::template inverse<float, T, kRegion>(g, p0, np, ws_p, vw, a.d_o.data, vdo, g.dim_v,
                                               a.dv.data, vdv, 1.f, stream)));
    FNA_TRY((naive::add_grad<float, T, kRegion>(g, p0, np, ws_ds, vw, a.q.data, vq, g.dim,
                                                a.d_add_k.data, vdak, scale, stream)));
    FNA_TRY((naive::add_grad<float, T, kRegion>(g, p0, np, ws_p, vw, a.d_o.data, vdo, g.dim_v,
                                                a.d_add_v.data, vdav, 1.f, stream)));
  }
  return Status::Ok();
}

}  // namespace

// make_geometry narrows sizes to int: the limits are checked here too, since `auto` reaches these
// entry points as the fused backend's fallback without validating for cuda-naive.
Status cuda_naive_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  FNA_TRY(validate_backend_limits(p, Backend::cuda_naive));
  DeviceGuard guard;
  FNA_TRY(guard.set(opt.device_index));
  const bool region = p.has_query_region();
  return naive::dispatch_dtype(p.dtype, [&](auto t) {
    return region ? forward_t<decltype(t), true, kernels::Naive>(p, a, opt)
                  : forward_t<decltype(t), false, kernels::Naive>(p, a, opt);
  });
}

Status cuda_naive_backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  FNA_TRY(validate_backend_limits(p, Backend::cuda_naive));
  DeviceGuard guard;
  FNA_TRY(guard.set(opt.device_index));
  const bool region = p.has_query_region();
  return naive::dispatch_dtype(p.dtype, [&](auto t) {
    return region ? backward_t<decltype(t), true, kernels::Naive>(p, a, opt)
                  : backward_t<decltype(t), false, kernels::Naive>(p, a, opt);
  });
}

// cuda-gemm: the same composition over the GEMM kernels (whole grids; the dispatcher answers a
// query region with `unsupported` before calling).
Status cuda_gemm_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  FNA_TRY(validate_backend_limits(p, Backend::cuda_gemm));
  DeviceGuard guard;
  FNA_TRY(guard.set(opt.device_index));
  FNA_TRY(gemm::check(p, opt.device_index));
  return naive::dispatch_dtype(p.dtype, [&](auto t) {
    return forward_t<decltype(t), false, kernels::Gemm>(p, a, opt);
  });
}

Status cuda_gemm_backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  FNA_TRY(validate_backend_limits(p, Backend::cuda_gemm));
  DeviceGuard guard;
  FNA_TRY(guard.set(opt.device_index));
  FNA_TRY(gemm::check(p, opt.device_index));
  return naive::dispatch_dtype(p.dtype, [&](auto t) {
    return backward_t<decltype(t), false, kernels::Gemm>(p, a, opt);
  });
}

}  // namespace detail
}  // namespace fna
