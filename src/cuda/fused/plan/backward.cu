// Fused backward (backend cuda-fused): the call's tensors lifted into Params, its plan
// (make_bwd_plan, bwd_choice.cu: tiles, kernels, dQ mode), the per-query statistics {LSE *
// log2(e), rowsum(dO * O) - d_lse}, the workspaces, and the plan's kernels (bwd_launch.cuh); the
// autotuner's choice among the backward configurations; fused_plan()'s backward report. float32
// runs on the TF32 tensor cores: split TF32 (float32 accuracy) by default, plain TF32 under
// Options::allow_tf32. Rows that are not 16-byte aligned (or dims not multiples of 16 bytes) take
// element-wise loads and stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backends.h"
#include "core/neighborhood.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/launch/bwd_launch.cuh"
#include "cuda/fused/configs/backward_table.h"
#include "cuda/fused/kernel/common/bwd_stats.cuh"
#include "cuda/fused/plan/autotune_device.h"
#include "cuda/fused/plan/bwd_choice.h"
#include "cuda/fused/plan/bwd_plan.h"
#include "cuda/fused/plan/bwd_strip.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace bwd {

FNA_BWD_INSTANCES(FNA_BWD_DECLARE)

namespace {

// Deterministic d rpb: d_rpb[h][e] = the sum of the CTAs' slots of head h (p.d_rpb_part) over
// batch, dilation group and key tile. One warp per (h, e): lane l sums the slots l, l + 32, ...
// in order, then the lanes' sums combine by a fixed butterfly, so every run adds in the same
// order. grid_x: the neighborhood launch's blockIdx.x extent.
__global__ void rpb_partial_sum(const Params p, int grid_x) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(p.heads) * p.rpb_elems) return;  // (whole warps: blockDim.x is 32k)
  const int h = int(w / p.rpb_elems), e = int(w % p.rpb_elems);
  const int hkv = h / p.heads_per_kv, j = h % p.heads_per_kv;
  const int64_t step = int64_t(p.heads_per_kv) * p.rpb_elems;
  const int64_t per_y = int64_t(grid_x);
  const int64_t n = int64_t(p.batch) * p.groups * per_y;  // slots of head h
  float sum = 0.f;
  for (int64_t i = lane; i < n; i += 32) {
    const int64_t bg = i / per_y, x = i % per_y;  // (batch, group), key tile
    const int64_t b = bg / p.groups, g = bg % p.groups;
    const int64_t y = (b * p.heads_kv + hkv) * p.groups + g;
    sum += p.d_rpb_part[(y * per_y + x) * step + int64_t(j) * p.rpb_elems + e];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) p.d_rpb[int64_t(h) * p.rpb_stride[0] + e] = sum;
}

// Strides of a [B, L.., H] LSE-role TensorRef lifted to 3 axes.
TokStrides lift_lse(const Problem& p, const TensorRef& t) {
  TokStrides s{};
  s.b = t.strides[0];
  const int lead = kAxes - p.rank;
  for (int a = 0; a < kAxes; ++a) s.x[a] = a >= lead ? t.strides[1 + a - lead] : 0;
  s.h = t.strides[p.rank + 1];
  return s;
}

// Strides of a [B, L.., H, D] TensorRef lifted to 3 axes. Returns false when the head dim is not
// contiguous (no path reads that); clears *aligned when rows are not 16-byte aligned (cp.async).
// `vec`: elements per 16-byte chunk (8 16-bit, 4 float).
bool lift(const Problem& p, const TensorRef& t, TokStrides* s, bool* aligned, int vec) {
  s->b = t.strides[0];
  const int lead = kAxes - p.rank;  // lifted axes (tiling.cuh): the problem's are the last ones
  for (int a = 0; a < kAxes; ++a) s->x[a] = a >= lead ? t.strides[1 + a - lead] : 0;
  s->h = t.strides[p.rank + 1];
  bool al = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && s->b % vec == 0 && s->h % vec == 0;
  for (int a = 0; a < kAxes; ++a) al = al && s->x[a] % vec == 0;
  *aligned = *aligned && al;
  return t.strides[p.rank + 2] == 1;
}
bool lift_add(const TensorRef& t, AddStrides* s, bool* aligned, int vec) {
  s->b = t.strides[0];
  s->n = t.strides[1];
  s->h = t.strides[2];
  *aligned = *aligned && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && s->b % vec == 0 &&
             s->n % vec == 0 && s->h % vec == 0;
  return t.strides[3] == 1;
}

// A Q-role tensor's pointer moved back by the query region's offset (fused::region_elements).
template <class Ptr>
Ptr region_base(Ptr data, const TokStrides& s, const Params& p, int64_t elem) {
  return fused::moved(data, -fused::region_elements(p, s.x), elem);
}


// Geometry and sizes of a call in backward Params (strides and pointers set by the caller).
Params base_params(const Problem& pr, const Options& opt) {
  Params p{};
  static_cast<fused::ProblemBlock&>(p) = fused::problem_block(pr, opt.scale);
  return p;
}

// T: __half, __nv_bfloat16, or mma::F32 / mma::TF32 (float32 elements): the statistics, the
// workspaces, and the plan's kernels.
template <typename T>
Status run(const Problem& pr, const BackwardArgs& a, const Options& opt, const BwdPlan& plan) {
  using E = typename Elem<T>::type;
  cudaStream_t stream = detail::stream_of(opt);
  Params p = plan.p_dkdv;
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  detail::Workspace ws(stream);
  Status st = ws.allocate(size_t(rows) * sizeof(float2), "backward statistics");
  if (!st.ok()) return st;
  p.stats = ws.as<float2>();

  TokStrides so{};
  bool unused = true;
  lift(pr, a.o, &so, &unused, 4);
  const TokStrides sl = lift_lse(pr, a.lse);
  const TokStrides sdl = lift_lse(pr, a.d_lse);  // (unused when d_lse is absent)
  const void* o_data = a.o.data;
  const float* lse = static_cast<const float*>(a.lse.data);
  const float* d_lse = static_cast<const float*>(a.d_lse.data);
  if (p.region) {  // as Q, dO and dQ in cuda_fused_backward
    o_data = region_base(o_data, so, p, int64_t(sizeof(E)));
    lse = region_base(lse, sl, p, int64_t(sizeof(float)));
    if (d_lse != nullptr) d_lse = region_base(d_lse, sdl, p, int64_t(sizeof(float)));
  }

  // Atomic mode: dQ accumulated with float32 atomics inside the dK/dV kernel (one pass over the
  // pairs instead of two); the deterministic mode runs the separate dQ kernel instead.
  detail::Workspace ws_dq(stream);
  if (!plan.launch.deterministic && !plan.launch.dq_after()) {
    p.dq_row = (p.dim + 7) / 8 * 8;
    const size_t bytes = size_t(rows) * p.dq_row * sizeof(float);
    st = ws_dq.allocate(bytes, "backward dQ accumulator");
    if (!st.ok()) return st;
    p.dq_accum = ws_dq.as<float>();  // zeroed by the statistics kernel, row by row
  }
  Params p_dq = plan.p_dq;
  p_dq.stats = p.stats;
  if (p.d_rpb != nullptr)
    FNA_CUDA_TRY(cudaMemsetAsync(p.d_rpb, 0, size_t(p.heads) * p.rpb_elems * sizeof(float), stream));

  constexpr int kPer = 16 / int(sizeof(E));
  const int log_tpr = log_threads_per_row((p.dim_v + kPer - 1) / kPer);
  const bool dense = !p.region && dense_rows(p, so, p.dim_v) && dense_rows(p, p.sdo, p.dim_v) &&
                     dense_rows(p, sl, 1) && (d_lse == nullptr || dense_rows(p, sdl, 1));
  const bool vec = dense && p.dim_v % kPer == 0 && reinterpret_cast<uintptr_t>(a.o.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.d_o) % 16 == 0;
  const int threads = 256;
  const unsigned blocks = unsigned(((rows << log_tpr) + threads - 1) / threads);
  stats_kernel<E, std::is_same<T, mma::TF32>::value><<<blocks, threads, 0, stream>>>(
      p, static_cast<const E*>(o_data), so, lse, sl, d_lse, sdl, ws.as<float2>(), log_tpr, dense,
      vec);
  FNA_CUDA_CHECK_LAUNCH("backward stats kernel");
  // Deterministic d rpb: the CTAs' per-head sums in their own slots, then summed in order.
  detail::Workspace ws_rpb(stream);
  if (p.d_rpb != nullptr && plan.launch.deterministic) {
    const size_t bytes = plan.launch.rpb_part_bytes;
    st = ws_rpb.allocate(bytes, "backward d rpb partial sums");
    if (!st.ok()) return st;
    FNA_CUDA_TRY(cudaMemsetAsync(ws_rpb.get(), 0, bytes, stream));
    p.d_rpb_part = ws_rpb.as<float>();
  }
  if (plan.dpad == 64) st = launch_backward<T, 64>(p, p_dq, plan.launch, stream);
  else if (plan.dpad == 256) st = launch_backward<T, 256>(p, p_dq, plan.launch, stream);
  else st = launch_backward<T, 128>(p, p_dq, plan.launch, stream);
  if (!st.ok() || p.d_rpb_part == nullptr) return st;
  const int64_t n = int64_t(p.heads) * p.rpb_elems * 32;  // a warp per entry
  rpb_partial_sum<<<unsigned((n + 255) / 256), 256, 0, stream>>>(
      p, static_cast<int>(plan.launch.grid_dkdv.x));
  FNA_CUDA_CHECK_LAUNCH("backward d rpb sum kernel");
  return Status::Ok();
}

// Runs the plan's backward for the call (the statistics, the workspaces and the kernels).
Status run_plan(const Problem& pr, const BackwardArgs& a, const Options& opt, const BwdPlan& plan) {
  // float32: split TF32 (float32 accuracy) by default, plain TF32 with Options::allow_tf32.
  if (pr.dtype == DType::f32 && opt.allow_tf32) return run<mma::TF32>(pr, a, opt, plan);
  if (pr.dtype == DType::f32) return run<mma::F32>(pr, a, opt, plan);
  if (pr.dtype == DType::f16) return run<__half>(pr, a, opt, plan);
  return run<__nv_bfloat16>(pr, a, opt, plan);
}

// Tuning::mode = autotune without a named backward configuration: the options the call runs
// with, backward_config set to the autotuner's pick ("" = the plan's own). `a` is the call (timed
// on its stream when timing is allowed; the final run overwrites what the timing wrote); null when
// only planning (the cached choice, else the plan's, never timing).
Status resolve_autotune(const Problem& pr, const Options& opt, const Params& p,
                        const BackwardArgs* a, Options* out) {
  *out = opt;
  if (opt.tuning.mode != TuningMode::autotune || !opt.backward_config.empty()) return Status::Ok();
  const std::string sig = detail::autotune_signature("bwd", pr, opt);
  const std::string key = sig + "|" + opt.tuning.autotune_cache_dir;
  std::string choice;
  if (detail::AutotuneMemo::get().find(key, &choice)) {
    out->backward_config = choice;
    return Status::Ok();
  }
  Options h = opt;
  h.tuning.mode = TuningMode::heuristic;
  BwdPlan heur;
  Status st = make_bwd_plan(pr, h, p, &heur);
  if (!st.ok()) return st;
  const std::string own = heur.cfg.name();  // the plan's own tiles (not a table row)
  auto options_of = [&](const std::string& name) {
    Options o = h;
    if (name != own) o.backward_config = name;
    return o;
  };
  std::vector<std::string> cands = {own};
  for (const BwdConfig& c : bwd_configs(pr.rank, pr.dtype, std::max(pr.dim, pr.dim_v))) {
    BwdPlan pl;
    if (c.name() != own && make_bwd_plan(pr, options_of(c.name()), p, &pl).ok())
      cands.push_back(c.name());
  }
  detail::AutotuneRequest r = detail::autotune_request(sig, opt);
  r.candidates = cands;
  const cudaStream_t stream = detail::stream_of(opt);
  r.may_time = a != nullptr && detail::autotune_may_time(stream);
  r.fits = [&](const std::string& name) {
    BwdPlan pl;
    return make_bwd_plan(pr, options_of(name), p, &pl).ok();
  };
  r.time_ms = [&](const std::string& name) {
    const Options o = options_of(name);
    BwdPlan pl;
    if (!make_bwd_plan(pr, o, p, &pl).ok()) return -1.0;
    return detail::autotune_time(stream, [&] { return run_plan(pr, *a, o, pl); });
  };
  detail::AutotuneResult res;
  if (!(st = detail::autotune(r, &res)).ok()) return st;
  choice = res.choice == own ? std::string() : res.choice;
  if (res.timed || res.from_cache) detail::AutotuneMemo::get().put(key, choice);
  out->backward_config = choice;
  return Status::Ok();
}

}  // namespace
}  // namespace bwd

namespace detail {

std::vector<std::string> cuda_fused_backward_configs(int rank, DType dtype, int64_t dim) {
  std::vector<std::string> names;
  for (const bwd::BwdConfig& c : bwd::bwd_configs(rank, dtype, dim)) names.push_back(c.name());
  return names;
}

Status cuda_fused_backward(const Problem& pr, const BackwardArgs& a, const Options& opt_in) {
  using namespace bwd;
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  if (dmax > 256) return unsupported("head dim " + std::to_string(dmax) + " > 256");
  // base_params narrows sizes to int (problem_block): the limits come first.
  if (Status lim = validate_backend_limits(pr, Backend::cuda_fused); !lim.ok())
    return {Code::unsupported, lim.message};
  Params p = base_params(pr, opt_in);
  const int vec = pr.dtype == DType::f32 ? 4 : 8;  // elements per 16-byte chunk
  bool al = pr.dim % vec == 0 && pr.dim_v % vec == 0;
  bool ok = lift(pr, a.q, &p.sq, &al, vec) && lift(pr, a.k, &p.sk, &al, vec) &&
            lift(pr, a.v, &p.sv, &al, vec) && lift(pr, a.d_o, &p.sdo, &al, vec) &&
            lift(pr, a.dq, &p.sdq, &al, vec) && lift(pr, a.dk, &p.sdk, &al, vec) &&
            lift(pr, a.dv, &p.sdv, &al, vec) && a.o.strides[pr.rank + 2] == 1;
  if (p.num_add > 0)
    ok = ok && lift_add(a.add_k, &p.sak, &al, vec) && lift_add(a.add_v, &p.sav, &al, vec) &&
         lift_add(a.d_add_k, &p.sdak, &al, vec) && lift_add(a.d_add_v, &p.sdav, &al, vec);
  if (!ok) return unsupported("needs unit stride on the head dim of every tensor");
  p.aligned = al;
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.d_o = a.d_o.data;
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  if (pr.has_query_region()) {
    // Q, dO and dQ hold the query region only: their pointers move back by its offset so that
    // global coordinates address them (the kernels touch no row outside the region).
    const int64_t e = dtype_size(pr.dtype);
    p.q = region_base(p.q, p.sq, p, e);
    p.d_o = region_base(p.d_o, p.sdo, p, e);
    p.dq = region_base(p.dq, p.sdq, p, e);
  }
  p.add_k = a.add_k.data, p.add_v = a.add_v.data;
  p.d_add_k = a.d_add_k.data, p.d_add_v = a.d_add_v.data;
  if (a.rpb.data != nullptr) {
    if (!fused::dense_bias(pr.rank, a.rpb.strides, pr.kernel_size) ||
        !fused::dense_bias(pr.rank, a.d_rpb.strides, pr.kernel_size))
      return unsupported("rpb / d_rpb: the fused backward needs dense (contiguous) bias tables");
    if (!fused::set_bias(p, pr.rank, a.rpb.data, pr.kernel_size))
      return unsupported("rpb: the bias table has more than 2^31 elements");
    p.d_rpb = static_cast<float*>(a.d_rpb.data);
  }

  DeviceGuard guard;
  Status st = guard.set(opt_in.device_index);
  if (!st.ok()) return st;
  if (p.batch == 0 || p.tokens == 0 || p.heads == 0) {
    BwdPlan plan;
    return make_bwd_plan(pr, opt_in, p, &plan);
  }
  Options opt;
  if (!(st = resolve_autotune(pr, opt_in, p, &a, &opt)).ok()) return st;
  BwdPlan plan;
  if (!(st = make_bwd_plan(pr, opt, p, &plan)).ok()) return st;
  const StripStep& ss = plan.launch.dkdv_strip;
  record_backward_launch(backward_name(plan, pr.dtype),
                         ss.dim != 0 ? ss.launch.strip_tma.on != 0 : plan.launch.tma.on != 0);
  return run_plan(pr, a, opt, plan);
}

Status cuda_fused_backward_plan(const Problem& pr, const Options& opt_in, FusedPlan* out) {
  using namespace bwd;
  // Dense placeholder tensors at an aligned address (the TMA maps are encoded, never used).
  alignas(256) static char placeholder[256];
  Params p = base_params(pr, opt_in);
  auto dense = [&](int64_t heads, int64_t dim, TokStrides* s) {
    s->h = dim;
    s->x[2] = heads * dim;
    s->x[1] = s->x[2] * p.geo.axis[2].length;
    s->x[0] = s->x[1] * p.geo.axis[1].length;
    s->b = s->x[0] * p.geo.axis[0].length;
  };
  dense(p.heads, p.dim, &p.sq);
  dense(p.heads, p.dim_v, &p.sdo);
  dense(p.heads_kv, p.dim, &p.sk);
  dense(p.heads_kv, p.dim_v, &p.sv);
  p.q = p.d_o = p.k = p.v = placeholder;
  p.aligned = true;
  Options opt;
  Status st = resolve_autotune(pr, opt_in, p, nullptr, &opt);
  if (!st.ok()) return st;
  BwdPlan plan;
  st = make_bwd_plan(pr, opt, p, &plan);
  if (!st.ok()) return st;
  const Params& pk = plan.p_dkdv;
  double visited = 1;
  for (int a = 0; a < kAxes; ++a)
    visited *= fused::axis_tile_pairs(pk.geo.axis[a], pk.tkv[a], pk.tq[a], true);
  out->backward_config = plan.cfg.name();
  out->backward_family = fused::family_name(plan.launch.family);
  out->backward_copy = plan.launch.tma.on ? "tma" : "cp_async";
  out->backward_deterministic = plan.launch.deterministic;
  out->backward_head_dim = plan.launch.dim_cols;
  out->backward_kv_tile.assign(pk.tkv + kAxes - pr.rank, pk.tkv + kAxes);
  out->backward_q_tile.assign(pk.tq + kAxes - pr.rank, pk.tq + kAxes);
  out->backward_q_steps = plan.launch.q_steps;
  out->backward_dq = plan.launch.dq_strip.dim != 0
                         ? strip_name(plan.launch.dq_strip, fused::StripRole::dq, pr.dtype) +
                               (plan.launch.dq_strip.launch.strip_tma.on ? " (tma)" : " (cp_async)")
                     : plan.launch.dq_sm90.on
                         ? plan.launch.dq_sm90.name +
                               (plan.launch.dq_sm90.tma.fwd.on ? " (tma)" : " (cp_async)")
                     : plan.launch.deterministic ? "kernel"
                                                 : "atomic";
  out->backward_grid =
      int64_t(plan.launch.grid_dkdv.x) * plan.launch.grid_dkdv.y * plan.launch.grid_dkdv.z;
  out->backward_smem = static_cast<int64_t>(std::max(
      {plan.launch.smem, plan.launch.dq_strip.launch.smem, plan.launch.dq_sm90.smem}));
  out->backward_rpb_sums = !pr.rpb                     ? ""
                           : plan.launch.d_rpb_global    ? "global"
                           : plan.launch.d_rpb_warps > 0 ? "warps"
                                                         : "shared";
  out->backward_visited_tiles = visited * double(pr.batch) * double(pr.heads);
  const double computed = visited * double(plan.rows.dkdv_keys) * double(plan.rows.dkdv_queries);
  out->backward_needed_fraction = computed > 0 ? fused::needed_pairs(pk.geo) / computed : 0.0;
  out->backward_walk = fused::walk_axes(pr.rank, plan.walk);
  const StripStep& ss = plan.launch.dkdv_strip;
  if (ss.dim != 0) {  // the strip dK / dV kernel: its boxes of keys and 4 x 16-query chunks
    out->backward_config = backward_name(plan, pr.dtype);
    out->backward_family = "strip";
    out->backward_copy = ss.launch.strip_tma.on ? "tma" : "cp_async";
    out->backward_head_dim = ss.dim;
    out->backward_kv_tile = {ss.bh, ss.bw};
    out->backward_q_tile = {fused::kBoxChunkRows, fused::kStripCols};
    out->backward_grid = ss.launch.ctas;
    out->backward_smem = static_cast<int64_t>(
        std::max(ss.launch.smem, plan.launch.dq_strip.launch.smem));
    out->backward_visited_tiles = ss.chunks * double(pr.batch) * double(pr.heads);
    out->backward_needed_fraction = ss.computed > 0 ? fused::needed_pairs(pk.geo) / ss.computed
                                                    : 0.0;
  }
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
