// cuda-fused forward: the plan (every choice of what runs once the configuration is chosen, in
// fwd_choice.cu: its schedule, copy engine, walk, grid and shared memory), layout checks, the
// autotuner's front, fused_plan and the launch, a call through the plan's table row. The kernels
// are instantiated from the configuration table (configs/forward.h) by the files CMake generates.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backends.h"
#include "cuda/common/mma.cuh"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "cuda/fused/plan/fwd_choice.h"
#include "cuda/fused/plan/fwd_cost.h"
#include "cuda/fused/plan/fwd_simt.h"
#include "cuda/fused/plan/fwd_tma.h"
#include "cuda/fused/plan/autotune_device.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace detail {

namespace {

using fused::FwdEntry;
using fused::FwdFamily;
using fused::FwdLaunch;
using fused::FwdParams;
using fused::kAxes;
using fwd_cost::wg_skip_on;


Status unsupported(const std::string& msg) { return {Code::unsupported, "backend=cuda-fused: " + msg}; }
Status invalid(const std::string& msg) { return {Code::invalid_argument, msg}; }

// The vectorized path copies 16-byte row chunks: unit stride on the head dim, 16-byte aligned
// base and every other stride a multiple of `vec` elements (16 bytes; dims of extent 1 never move
// the pointer).
Status check_rows(const char* name, const TensorRef& t, int ndim, const int64_t* extents,
                  int vec) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    return unsupported(std::string(name) + " pointer is not 16-byte aligned");
  if (t.strides[ndim - 1] != 1)
    return unsupported(std::string(name) + " stride[" + std::to_string(ndim - 1) + "]=" +
                       std::to_string(t.strides[ndim - 1]) + " (head dim) must be 1");
  for (int d = 0; d < ndim - 1; ++d)
    if (extents[d] > 1 && t.strides[d] % vec != 0)
      return unsupported(std::string(name) + " stride[" + std::to_string(d) + "]=" +
                         std::to_string(t.strides[d]) + " is not a multiple of " +
                         std::to_string(vec) + " elements");
  return Status::Ok();
}

// [B, L.., H] strides lifted to [B, axis 0, axis 1, axis 2, H].
void lift_strides(const TensorRef& t, int rank, int64_t (&out)[5]) {
  out[0] = t.strides[0];
  for (int ax = 0; ax < kAxes; ++ax) {
    const int src = ax - (kAxes - rank);
    out[1 + ax] = src < 0 ? 0 : t.strides[1 + src];
  }
  out[4] = t.strides[1 + rank];
}


// FwdParams of a call (args null: dense placeholder tensors, for planning without a call).
void fill_params(const Problem& p, const ForwardArgs* a, const Options& opt, FwdParams* fp) {
  *fp = FwdParams{};
  const fused::Geometry geo = geometry_of(p);
  if (a != nullptr) {
    fp->q = a->q.data;
    fp->k = a->k.data;
    fp->v = a->v.data;
    fp->o = a->o.data;
    fp->lse = static_cast<float*>(a->lse.data);
    fp->add_k = a->add_k.data;
    fp->add_v = a->add_v.data;
    lift_strides(a->q, p.rank, fp->q_stride);
    lift_strides(a->k, p.rank, fp->k_stride);
    lift_strides(a->v, p.rank, fp->v_stride);
    lift_strides(a->o, p.rank, fp->o_stride);
    if (a->lse.data != nullptr) lift_strides(a->lse, p.rank, fp->lse_stride);
    if (p.num_additional > 0)
      for (int i = 0; i < 3; ++i) {
        fp->add_k_stride[i] = a->add_k.strides[i];
        fp->add_v_stride[i] = a->add_v.strides[i];
      }
  } else {
    // Dense [B, L.., H, D] tensors at an aligned placeholder address (the TMA maps are encoded,
    // never used).
    alignas(256) static char placeholder[256];
    auto dense = [&](int64_t heads, int64_t dim, int64_t (&st)[5]) {
      const int64_t h = dim, x2 = heads * dim;
      st[4] = h;
      st[3] = x2;
      st[2] = x2 * geo.axis[2].length;
      st[1] = st[2] * geo.axis[1].length;
      st[0] = st[1] * geo.axis[0].length;
    };
    fp->q = fp->k = fp->v = placeholder;
    fp->o = placeholder;
    dense(p.heads, p.dim, fp->q_stride);
    dense(p.heads_kv, p.dim, fp->k_stride);
    dense(p.heads_kv, p.dim_v, fp->v_stride);
    dense(p.heads, p.dim_v, fp->o_stride);
    if (p.num_additional > 0) fp->add_k = fp->add_v = placeholder;
  }
  static_cast<fused::ProblemBlock&>(*fp) = fused::problem_block(p, opt.scale);
  if (a != nullptr && a->rpb.data != nullptr)
    fused::set_bias(*fp, p.rank, a->rpb.data, p.kernel_size);
  // Q, O and LSE hold the query region only: their pointers move back by the region's offset so
  // that the kernels address a query by its global coordinates (they touch no row outside the
  // region: q_row_src, store_row).
  if (a != nullptr && fp->region) {
    const int64_t e = dtype_size(p.dtype);
    fp->q = fused::moved(fp->q, -fused::region_elements(*fp, fp->q_stride + 1), e);
    fp->o = fused::moved(fp->o, -fused::region_elements(*fp, fp->o_stride + 1), e);
    if (fp->lse != nullptr)
      fp->lse = fused::moved(fp->lse, -fused::region_elements(*fp, fp->lse_stride + 1), 4);
  }
}

// Tuning fields that only a family's kernel has: asked of a problem the plan gives another
// family, `unsupported` naming the field (the call cannot run as asked; no fallback either).
Status check_family_options(const Tuning& t, const fused::FwdPlan& plan) {
  auto needs = [&](const char* what, const char* family) {
    return unsupported(std::string("tuning ") + what + " needs the " + family +
                       " forward, but the plan runs " + plan.config);
  };
  const FwdFamily f = plan.family;
  if (t.persistent == Switch::on && f != FwdFamily::sm90ws)
    return needs("persistent='on'", "warp-specialized Hopper (fna_fwd_sm90ws_*)");
  if (t.fwd_wg_skip != Switch::automatic && f != FwdFamily::sm90ws)
    return needs("fwd_wg_skip", "warp-specialized Hopper (fna_fwd_sm90ws_*)");
  if (t.fwd_spread != Switch::automatic && f != FwdFamily::sm90)
    return needs("fwd_spread", "plain Hopper (fna_fwd_sm90_*)");
  if (t.fwd_copy != CopyEngine::automatic && f != FwdFamily::sm90 && f != FwdFamily::sm90ws &&
      f != FwdFamily::strip)
    return needs("fwd_copy", "Hopper (fna_fwd_sm90_* / fna_fwd_sm90ws_*) or the strip");
  return Status::Ok();
}

}  // namespace

Status make_fwd_plan(const Problem& p, const Options& opt, FwdParams* fp, fused::FwdPlan* plan) {
  // Elements per 16-byte chunk: head dims (and strides, checked by the caller) must be multiples.
  const int vec = p.dtype == DType::f32 ? 4 : 8;
  if (p.dim % vec != 0 || p.dim_v % vec != 0)
    return unsupported("dim=" + std::to_string(p.dim) + ", dim_v=" + std::to_string(p.dim_v) +
                       ": head dims must be multiples of " + std::to_string(vec) + " for " +
                       dtype_name(p.dtype));
  // problem_block narrows sizes to int: validate_problem bounds batch, heads, dims and
  // num_additional by 2^30, validate_backend_limits the dilation groups (checked again here:
  // `auto` reaches this plan without them and falls back to cuda-naive on `unsupported`).
  if (Status lim = validate_backend_limits(p, Backend::cuda_fused); !lim.ok())
    return {Code::unsupported, lim.message};
  DeviceProps dev;
  Status st = device_props(opt.device_index, &dev);
  if (!st.ok()) return st;
  if (dev.cc_major < 8)
    return unsupported("needs compute capability 8.0 or newer (mma.sync bf16 / f16 / tf32)");
  const fused::Geometry geo = geometry_of(p);
  const FwdEntry* cfg = nullptr;
  st = opt.config.empty() ? heuristic_config(p, opt, geo, dev, &cfg)
                          : named_config(p, opt, geo, dev, &cfg);
  if (!st.ok()) return st;
  const Tuning& t = opt.tuning;
  *plan = fused::FwdPlan{};
  plan->family = cfg->family;
  plan->config = cfg->name();
  for (int ax = 0; ax < kAxes; ++ax) plan->q[ax] = cfg->q[ax], plan->kv[ax] = cfg->kv[ax];
  plan->warps = cfg->warps;
  plan->launcher = cfg->launch;
  st = check_family_options(t, *plan);
  if (!st.ok()) return st;

  // Work items and the walk over them.
  fused::FwdLaunch& l = plan->launch;
  fp->q_tiles_total = 1;
  for (int ax = 0; ax < kAxes; ++ax) {
    // With a query region [qlo, qhi) a group's tiles cover its part of it, local
    // [ceil((qlo - g) / d), ceil((qhi - g) / d)) (fwd_tile); the most over the groups.
    // (An interval of E coordinates holds at most ceil(E / d) of one residue class mod d.)
    int len = geo.max_group_length(ax);
    if (fp->region) {
      const int d = geo.axis[ax].dilation;
      len = (fp->qhi[ax] - fp->qlo[ax] + d - 1) / d;
    }
    fp->q_tiles[ax] = fused::tiles_over(len, cfg->q[ax]);
    fp->q_tiles_total *= fp->q_tiles[ax];
  }
  if (cfg->family == FwdFamily::strip) {
    // The strip forward's CTAs: row segments (the first axis) fastest, then strips.
    plan->walk[0] = 1, plan->walk[1] = 2, plan->walk[2] = 0;
    if (!t.fwd_walk.empty())
      return unsupported("tuning fwd_walk='" + t.fwd_walk + "': the strip forward (" +
                         plan->config + ") walks row segments, then strips; it takes no walk");
  } else if (t.fwd_walk.empty()) {
    fused::walk_order(geo, cfg->q, dev.sms, plan->walk);
  } else if (!fused::lifted_walk(t.fwd_walk, p.rank, plan->walk)) {
    return invalid("tuning fwd_walk='" + t.fwd_walk + "' must name each of the problem's " +
                   std::to_string(p.rank) + " axes once, fastest first");
  }
  fused::walk_divisors(fp->q_tiles, plan->walk, fp->q_div);
  fp->div_tiles_total = fused::FastDiv(uint32_t(fp->q_tiles_total));
  for (int ax = 0; ax < kAxes; ++ax) {
    fp->div_q_div[ax] = fused::FastDiv(uint32_t(fp->q_div[ax]));
    fp->div_q_tiles[ax] = fused::FastDiv(uint32_t(fp->q_tiles[ax]));
  }
  l.ctas = int64_t(p.batch) * p.heads * fp->groups * fp->q_tiles_total;
  l.smem = cfg->smem();

  // Per family: shared memory, the launch's flags, copy engine.
  std::string why;
  // The Hopper forwards' TMA maps (Tuning::fwd_copy; automatic: where they describe the call).
  // Q's map holds one warpgroup's box of 64 rows (the kernels load one per warpgroup).
  auto hopper_maps = [&]() -> Status {
    if (t.fwd_copy == CopyEngine::cp_async) return Status::Ok();
    int part[kAxes];
    if (!fused::warpgroup_box(cfg->q, part))  // (unreachable: the TMA instances assert the split)
      return unsupported(plan->config + ": query tile not in 64-row boxes");
    l.tma = fused::fwd_tma_maps(*fp, part, cfg->kv, &why);
    if (!l.tma.on && t.fwd_copy == CopyEngine::tma)
      return unsupported("tuning fwd_copy='tma': TMA cannot load this call's tiles: " + why);
    plan->tma = l.tma.on != 0;
    return Status::Ok();
  };
  switch (cfg->family) {
    case FwdFamily::sm80: break;
    case FwdFamily::sm90:
      // Spread copies are cp.async copies: asking for them keeps cp.async.
      if (t.fwd_spread != Switch::automatic) {
        if (t.fwd_copy == CopyEngine::tma)
          return unsupported("tuning fwd_spread concerns cp.async copies, not fwd_copy='tma'");
      } else if (Status ms = hopper_maps(); !ms.ok()) {
        return ms;
      }
      l.spread = !l.tma.on &&
                 (t.fwd_spread == Switch::automatic ? cfg->dim == 64 : t.fwd_spread == Switch::on);
      break;
    case FwdFamily::sm90ws:
      l.wg_skip = wg_skip_on(t);
      l.persistent = t.persistent == Switch::on;
      if (p.rpb) l.smem = cfg->bias_smem();  // the bias slices' buffers (fwd_bias.cuh BiasSlice)
      if (Status ms = hopper_maps(); !ms.ok()) return ms;
      break;
    case FwdFamily::simt: {
      const fused::SimtPlan sp = fused::simt_plan(geo, cfg->q, cfg->dim);
      l.smem = sp.smem;
      l.halo_cap = sp.halo_rows;
      break;
    }
    case FwdFamily::box: {
      const fused::BoxPlan bp = fused::box_plan(geo, cfg->q, cfg->dim);
      l.smem = bp.smem;
      if (p.rpb) {  // its table staged after the halo
        size_t bytes = 0;
        if (!fused::box_bias_bytes(geo, &bytes, &why))
          return unsupported(plan->config + " cannot run this problem: " + why);
        l.smem = fused::bias_stage_offset(bp.smem) + bytes;
      }
      l.halo_cap = bp.halo_rows[1] * bp.halo_rows[2];
      break;
    }
    case FwdFamily::strip: {
      const fused::StripPlan sp =
          fused::strip_plan(geo, cfg->kv[1], cfg->kv[2], cfg->q[1] / cfg->kv[1], dev.sms,
                            dev.smem_optin, double(p.batch) * double(p.heads), cfg->dim, p.rpb);
      l.smem = sp.smem;
      l.strip = sp.sp;
      l.ctas = int64_t(p.batch) * p.heads * fp->groups * sp.sp.strips * sp.sp.segs;
      // TMA bands where the device has TMA and the build has sm_90 code for the kernel (a build
      // whose architectures stop below 9.0 runs Hopper through older PTX, without the TMA path).
#if defined(FNA_WITH_SM90)
      const bool tma_device = dev.cc_major >= 9;
#else
      const bool tma_device = false;
#endif
      if (t.fwd_copy == CopyEngine::tma && !tma_device)
        return unsupported("tuning fwd_copy='tma' needs compute capability 9.0+ and a build for it");
      if (t.fwd_copy != CopyEngine::cp_async && tma_device) {
        l.strip_tma = fused::strip_tma_maps(*fp, sp.sp, &why);
        if (!l.strip_tma.on && t.fwd_copy == CopyEngine::tma)
          return unsupported("tuning fwd_copy='tma': TMA cannot load this call's bands: " + why);
      }
      plan->tma = l.strip_tma.on != 0;
      break;
    }
  }
  // With a bias the one-head-per-CTA tiled kernels (sm80, plain sm90) stage their head's table,
  // divided by the scale, in shared memory after their own where the staged layout takes it (up
  // to kBiasStageBytes, more with guard zones): the scores then take one shared load and one add
  // per element (FwdParams::rpb_staged).
  // Tuning::fwd_rpb_stage asks for one or the other.
  fp->rpb_staged = 0;
  fp->rpb_inv_scale = 0.f;
  fp->rpb_front = 0;
  fp->rpb_tiles = 0;
  const float inv_scale = static_cast<float>(1.0 / double(fp->scale));
  if (t.fwd_rpb_stage != Switch::automatic && !p.rpb)
    return unsupported("tuning fwd_rpb_stage needs a relative positional bias (rpb)");
  if (p.rpb && cfg->family == FwdFamily::sm90 && p.rank == 3 &&
      t.fwd_rpb_stage == Switch::automatic && std::isfinite(inv_scale)) {
    // The plain Hopper kernel at rank 3, whose staged table has no guard zones (a test per
    // score): each key tile's slice instead, as the warp-specialized kernel (fwd_bias.cuh
    // BiasSlice); tuning fwd_rpb_stage 'on' / 'off' still asks for the staged / global table.
    fp->rpb_tiles = 1;
    fp->rpb_inv_scale = inv_scale;
    l.smem = fused::bias_stage_offset(l.smem) +
             fused::bias_slice_bytes(fused::bias_slice_floats(cfg->q[0], cfg->q[1], cfg->q[2],
                                                              cfg->kv[0], cfg->kv[1], cfg->kv[2]),
                                     1);
  } else if (p.rpb && (cfg->family == FwdFamily::sm80 || cfg->family == FwdFamily::sm90)) {
    constexpr size_t kBiasStageBytes = 20 * 1024;
    int ks[kAxes];
    for (int a = 0; a < kAxes; ++a) ks[a] = geo.axis[a].kernel;
    size_t bytes = 0;
    const bool layout = fused::bias_stageable(ks, &bytes);
    const size_t end = fused::bias_stage_offset(l.smem) + bytes;
    const float inv = static_cast<float>(1.0 / double(fp->scale));
    const bool fits = layout && bytes <= kBiasStageBytes &&
                      end <= static_cast<size_t>(dev.smem_optin) && std::isfinite(inv);
    if (t.fwd_rpb_stage == Switch::on && !fits)
      return unsupported("tuning fwd_rpb_stage='on': the bias table does not fit the staged "
                         "layout (windows of at most 16 on the last two axes of a 2-D or 3-D "
                         "problem, at most " + std::to_string(kBiasStageBytes) +
                         " bytes) in shared memory next to " + plan->config + "'s own");
    if (fits && t.fwd_rpb_stage != Switch::off) {
      l.smem = end;
      fp->rpb_staged = 1;
      fp->rpb_inv_scale = inv;
      // Rank 1 and 2 (axis 0 lifted): guard zones around the table so that every pair of a
      // CTA's query tile and the key tiles it visits addresses the copy. Per axis a key of a
      // visited tile lies within K - 1 + stride of some query of the tile (its window), the tile
      // spans q[a] queries and the key tile kv[a] keys, so |k - q| < K + stride + q + kv = g[a]
      // for every pair, rows past the group's end included; the flat index then lies in
      // [-sum g[a] stride_a, sum (2 K_a - 2 + g[a]) stride_a].
      if (p.rank <= 2) {
        int64_t front = 0, back = 0;
        for (int a = 1; a < kAxes; ++a) {
          const int64_t g = geo.axis[a].kernel + geo.axis[a].stride + cfg->q[a] + cfg->kv[a];
          front += g * fused::stage_stride(a);
          back += (2 * int64_t(geo.axis[a].kernel) - 2 + g) * fused::stage_stride(a);
        }
        const size_t guarded = fused::bias_stage_offset(l.smem - bytes) +
                               size_t(front + back + 1) * sizeof(float);
        if (guarded <= static_cast<size_t>(dev.smem_optin) &&
            size_t(front + back + 1) * sizeof(float) <= 2 * kBiasStageBytes) {
          l.smem = guarded;
          fp->rpb_front = static_cast<int>(front);
        }
      }
    }
  } else if (p.rpb && cfg->boxes() && t.fwd_rpb_stage != Switch::off) {
    // The box and strip forwards always stage their head's table (after their K / V rows, in
    // the shared memory their plans size).
    fp->rpb_staged = 1;
    fp->rpb_inv_scale = static_cast<float>(1.0 / double(fp->scale));
    if (!std::isfinite(fp->rpb_inv_scale))
      return unsupported("rpb with scale=" + std::to_string(fp->scale) + ": " + plan->config +
                         " stages the table divided by the scale");
  } else if (p.rpb && cfg->family == FwdFamily::sm90ws && t.fwd_rpb_stage == Switch::automatic) {
    // The warp-specialized forward copies each key tile's slice of the table, divided by the
    // scale, into shared memory and starts the tile's scores from it (fwd_bias.cuh BiasSlice).
    fp->rpb_inv_scale = static_cast<float>(1.0 / double(fp->scale));
    if (!std::isfinite(fp->rpb_inv_scale))
      return unsupported("rpb with scale=" + std::to_string(fp->scale) + ": " + plan->config +
                         " adds the table divided by the scale");
  } else if (t.fwd_rpb_stage != Switch::automatic) {
    return unsupported("tuning fwd_rpb_stage needs the sm80 or plain sm90 forward, but the plan "
                       "runs " + plan->config);
  }
  if (l.smem > static_cast<size_t>(dev.smem_optin))
    return unsupported("config " + plan->config + " needs " + std::to_string(l.smem) +
                       " bytes of shared memory per block, the device has " +
                       std::to_string(dev.smem_optin));
  if (l.ctas > 0x7fffffff)
    return unsupported("batch * heads * dilation groups * tiles = " + std::to_string(l.ctas) +
                       " exceeds the grid");
  l.grid = static_cast<unsigned>(l.persistent ? std::min<int64_t>(l.ctas, dev.sms) : l.ctas);

  // Tiling statistics.
  // Over the call's queries (its region, if any).
  const fused::QueryBox box = fused::query_box(p);
  const double needed = fused::needed_pairs(geo, &box);
  double computed = 0;
  const double heads = double(p.batch) * double(p.heads);
  if (cfg->simt()) {
    // Exactly the needed pairs; "tiles" are the threads' 8-key steps, one set per CTA.
    plan->visited_tiles = double(l.ctas) * fwd_simt::steps(p, geo);
    plan->unmasked_fraction = 1.0;
    computed = needed;
  } else if (cfg->boxes()) {
    // Visited "tiles" are the warps' 64-key chunks, all masked (the strip forward multiplies the
    // box forward's boxes).
    const int q_box[kAxes] = {1, cfg->kv[1], fused::kStripCols};
    const fused::BoxPlan bp =
        cfg->family == FwdFamily::box ? fused::box_plan(geo, cfg->q, cfg->dim)
                                      : fused::box_plan(geo, q_box, cfg->dim, cfg->kv);
    plan->visited_tiles = bp.chunks * heads;
    computed = bp.computed;
  } else {
    // The warp-specialized forward's warpgroups (64 rows) visit only their own run of key tiles
    // when wg_skip is on (tiling.cuh rows_walk).
    const fused::Ext3 qe{{cfg->q[0], cfg->q[1], cfg->q[2]}};
    const fused::Ext3 ke{{cfg->kv[0], cfg->kv[1], cfg->kv[2]}};
    const fused::TilingStats ts = l.wg_skip ? fused::part_tiling_stats(geo, qe, ke, 64, &box)
                                            : fused::tiling_stats(geo, cfg->q, cfg->kv, &box);
    plan->visited_tiles = ts.visited * heads;
    plan->unmasked_fraction = ts.visited > 0 ? ts.unmasked / ts.visited : 0.0;
    computed = ts.visited * double(cfg->q_size()) * double(cfg->kv_size());
  }
  plan->needed_fraction = computed > 0 ? needed / computed : 0.0;
  return Status::Ok();
}

namespace {

// Tuning::mode = autotune without a named configuration: the configuration the autotuner picks
// for the call ("" = the plan's own pick). `call` holds the call's parameters (its tensors, timed
// on its stream when timing is allowed); null when only planning (fused_plan: the cached choice,
// else the plan's, never timing).
Status autotuned_config(const Problem& p, const Options& opt, const FwdParams* call,
                        std::string* out) {
  out->clear();
  const Tuning& t = opt.tuning;
  if (t.fwd_schedule != FwdSchedule::automatic || t.fwd_strip != Switch::automatic ||
      t.fwd_box != Switch::automatic || t.fwd_simt != Switch::automatic)
    return invalid("tuning mode='auto' chooses the forward configuration, while tuning " +
                   tuning_string(t) + " would choose among configurations too: give one or the other");
  const std::string sig = autotune_signature("fwd", p, opt);
  const std::string key = sig + "|" + t.autotune_cache_dir;
  if (AutotuneMemo::get().find(key, out)) return Status::Ok();
  FwdParams fp;
  if (call != nullptr)
    fp = *call;
  else
    fill_params(p, nullptr, opt, &fp);
  Options h = opt;
  h.tuning.mode = TuningMode::heuristic;
  fused::FwdPlan heur;
  Status st = make_fwd_plan(p, h, &fp, &heur);
  if (!st.ok()) return st;
  // A candidate's plan (the heuristic's under its own name, the others as named configurations).
  auto plan_of = [&](const std::string& name, FwdParams* f, fused::FwdPlan* pl) {
    Options o = h;
    if (name != heur.config) o.config = name;
    *f = fp;
    return make_fwd_plan(p, o, f, pl).ok();
  };
  std::vector<std::string> cands = {heur.config};
  DeviceProps dev;
  if (!(st = device_props(opt.device_index, &dev)).ok()) return st;
  for (const FwdEntry* e :
       plan_candidates(p.rank, p.dtype, opt.allow_tf32, std::max(p.dim, p.dim_v), dev)) {
    FwdParams f;
    fused::FwdPlan pl;
    if (e->name() != heur.config && plan_of(e->name(), &f, &pl)) cands.push_back(e->name());
  }
  AutotuneRequest r = autotune_request(sig, opt);
  r.candidates = cands;
  const cudaStream_t stream = stream_of(opt);
  r.may_time = call != nullptr && autotune_may_time(stream);
  r.fits = [&](const std::string& name) {
    FwdParams f;
    fused::FwdPlan pl;
    return plan_of(name, &f, &pl);
  };
  r.time_ms = [&](const std::string& name) {
    FwdParams f;
    fused::FwdPlan pl;
    if (!plan_of(name, &f, &pl)) return -1.0;
    if (pl.launch.ctas == 0) return 0.0;
    return autotune_time(stream, [&] {
      return cuda_status(pl.launcher(f, pl.launch, stream), "autotuning the forward");
    });
  };
  AutotuneResult res;
  if (!(st = autotune(r, &res)).ok()) return st;
  if (res.choice != heur.config) *out = res.choice;
  // A choice made without timing (planning, graph capture) is not remembered: a later call times.
  if (res.timed || res.from_cache) AutotuneMemo::get().put(key, *out);
  return Status::Ok();
}

// The options a call runs with: under Tuning::mode = autotune, the autotuned configuration
// named (the autotuner's fields, which a named configuration does not need, cleared).
Status resolve_autotune(const Problem& p, const Options& opt, const FwdParams* call,
                        Options* out) {
  *out = opt;
  if (opt.tuning.mode != TuningMode::autotune || !opt.config.empty()) return Status::Ok();
  std::string choice;
  Status st = autotuned_config(p, opt, call, &choice);
  if (!st.ok()) return st;
  out->config = choice;
  return Status::Ok();
}

}  // namespace

std::vector<std::string> cuda_fused_configs(int rank, DType dtype, int64_t dim) {
  std::vector<std::string> names;
  // float32: the split-TF32 entries (the plain TF32 ones carry the same names).
  for (const FwdEntry* e : listed_candidates(rank, dtype, false, dim)) names.push_back(e->name());
  return names;
}

Status cuda_fused_plan(const Problem& p, const Options& opt_in, FusedPlan* out) {
  Options opt;
  Status st = resolve_autotune(p, opt_in, nullptr, &opt);
  if (!st.ok()) return st;
  FwdParams fp;
  fill_params(p, nullptr, opt, &fp);
  fused::FwdPlan plan;
  st = make_fwd_plan(p, opt, &fp, &plan);
  if (!st.ok()) return st;
  *out = FusedPlan{};
  out->config = plan.config;
  out->family = fused::family_name(plan.family);
  out->copy = plan.tma ? "tma" : "cp_async";
  out->persistent = plan.launch.persistent;
  out->spread = plan.launch.spread;
  out->wg_skip = plan.launch.wg_skip;
  out->q_tile.assign(plan.q + kAxes - p.rank, plan.q + kAxes);
  out->kv_tile.assign(plan.kv + kAxes - p.rank, plan.kv + kAxes);
  out->warps = plan.warps;
  out->grid = plan.launch.grid;
  out->smem = plan.launch.smem;
  out->tuning = tuning_string(opt.tuning);
  out->visited_tiles = plan.visited_tiles;
  out->unmasked_fraction = plan.unmasked_fraction;
  out->needed_fraction = plan.needed_fraction;
  out->walk = fused::walk_axes(p.rank, plan.walk);
  out->rpb_table = !p.rpb                                             ? ""
                   : fp.rpb_staged                                    ? "shared"
                   : fp.rpb_tiles || plan.family == FwdFamily::sm90ws ? "tiles"
                                                                      : "global";
  // The backward's plan; a problem the fused backward does not take leaves its fields empty,
  // unless the caller asked something of the backward (then its answer is the call's).
  FusedPlan bwd = *out;
  st = cuda_fused_backward_plan(p, opt, &bwd);
  const Tuning& t = opt.tuning;
  const bool asked = !opt.backward_config.empty() || t.bwd_kernel != BwdKernel::automatic ||
                     t.bwd_copy != CopyEngine::automatic || !t.bwd_walk.empty() ||
                     t.bwd_rpb_sums != RpbSums::automatic || t.bwd_q_pairs != Switch::automatic ||
                     t.bwd_dq_strip != Switch::automatic || t.bwd_dq_sm90 != Switch::automatic ||
                     t.bwd_strip != Switch::automatic;
  if (st.ok())
    *out = bwd;
  else if (asked || st.code == Code::invalid_argument)
    return st;
  return Status::Ok();
}

Status cuda_fused_forward(const Problem& p, const ForwardArgs& a, const Options& opt_in) {
  const int vec = p.dtype == DType::f32 ? 4 : 8;  // elements per 16-byte chunk
  // Layout of every tensor the kernel reads with 16-byte copies or writes with 4-byte (16-bit
  // pairs) or 8-byte (float32 pairs) stores.
  int64_t ext[kMaxDims];
  int n = 0;
  ext[n++] = p.batch;
  for (int i = 0; i < p.rank; ++i) ext[n++] = p.shape[i];
  ext[n++] = p.heads;
  ext[n++] = p.dim;
  const int nd = n;
  Status st = check_rows("query", a.q, nd, ext, vec);
  if (!st.ok()) return st;
  ext[nd - 1] = p.dim_v;
  if (!(st = check_rows("output", a.o, nd, ext, vec)).ok()) return st;
  ext[nd - 2] = p.heads_kv;
  if (!(st = check_rows("value", a.v, nd, ext, vec)).ok()) return st;
  ext[nd - 1] = p.dim;
  if (!(st = check_rows("key", a.k, nd, ext, vec)).ok()) return st;
  if (p.num_additional > 0) {
    const int64_t add_ext[4] = {p.batch, p.num_additional, p.heads_kv, p.dim};
    const int64_t add_ext_v[4] = {p.batch, p.num_additional, p.heads_kv, p.dim_v};
    if (!(st = check_rows("additional_keys", a.add_k, 4, add_ext, vec)).ok()) return st;
    if (!(st = check_rows("additional_values", a.add_v, 4, add_ext_v, vec)).ok()) return st;
  }
  if (a.rpb.data != nullptr) {
    if (!fused::dense_bias(p.rank, a.rpb.strides, p.kernel_size))
      return unsupported("rpb: the fused kernels need a dense (contiguous) bias table");
    fused::ProblemBlock b = fused::problem_block(p, 1.0);
    if (!fused::set_bias(b, p.rank, a.rpb.data, p.kernel_size))
      return unsupported("rpb: the bias table has more than 2^31 elements");
  }
  DeviceGuard guard;
  if (!(st = guard.set(opt_in.device_index)).ok()) return st;
  FwdParams fp;
  fill_params(p, &a, opt_in, &fp);
  Options opt;
  if (!(st = resolve_autotune(p, opt_in, &fp, &opt)).ok()) return st;
  fused::FwdPlan plan;
  if (!(st = make_fwd_plan(p, opt, &fp, &plan)).ok()) return st;
  record_forward_launch(plan.config, plan.launch.tma.on || plan.launch.strip_tma.on,
                        plan.launch.grid, plan.launch.smem);
  if (plan.launch.ctas == 0) return Status::Ok();
  return cuda_status(plan.launcher(fp, plan.launch, stream_of(opt)),
                     ("launching " + plan.config).c_str());
}

}  // namespace detail

}  // namespace fna
