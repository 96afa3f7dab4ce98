// The fused backward's plan (make_bwd_plan, declared in bwd_choice.h): which dK / dV and dQ
// kernels run, their tiles (Options::backward_config's or the heuristic's, pick_tiles), walks,
// grids and shared memory, the bias's d rpb sums and the TMA maps, from the problem, the device and
// the options. Head dims are zero-padded to 64, 128 or 256 (max(D, D_v); above 128 the sm80 dK / dV
// kernel runs as two passes). Anything outside the fast path (head dims > 256, pre-sm_80, too
// little shared memory) answers `unsupported`, so that `auto` falls back to the naive backend
// (unless Options::backward_config names a configuration).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/backends.h"
#include "core/neighborhood.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/kernel/common/bwd_bias.cuh"
#include "cuda/fused/plan/bwd_choice.h"
#include "cuda/fused/plan/bwd_strip.h"
#include "cuda/fused/plan/bwd_tiles.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace bwd {

FNA_BWD_INSTANCES(FNA_BWD_DECLARE)

namespace {

// The most shared memory the dK / dV kernel's per-warp d rpb copies may take (bwd_bias.cuh).
constexpr size_t kRpbWarpCopyBytes = 32 * 1024;
// The most workspace the deterministic backward's per-CTA d rpb slots may take.
constexpr size_t kRpbPartMaxBytes = size_t(1) << 31;

// A grid of `x` columns and `rows` rows: gridDim.y takes at most 65535 rows, so more continue over
// gridDim.z (the kernels' grid_row(); rows past `rows` return at once).
constexpr int64_t kMaxGridRows = int64_t(65535) * 65535;
dim3 fold_rows(int64_t x, int64_t rows) {
  const int64_t z = rows > 65535 ? (rows + 65534) / 65535 : 1;
  return dim3{unsigned(x), unsigned((rows + z - 1) / z), unsigned(z)};
}

// Tile shapes of one kernel: `q` / `kv` (a configuration's, lifted to kAxes) or, when null, the
// heuristic's.
void set_tiles(Params* p, int q_rows, int kv_rows, bool own_kv, const int* q, const int* kv,
               int64_t* n_tiles) {
  if (q != nullptr)
    for (int a = 0; a < kAxes; ++a) p->tq[a] = q[a], p->tkv[a] = kv[a];
  else if (own_kv)
    pick_tiles(p->geo, kv_rows, q_rows, true, p->tkv, p->tq);
  else
    pick_tiles(p->geo, q_rows, kv_rows, false, p->tq, p->tkv);
  *n_tiles = 1;
  for (int a = 0; a < kAxes; ++a) {
    const int t = own_kv ? p->tkv[a] : p->tq[a];
    p->tile0[a] = 0;
    p->tiles[a] = (nbr::group_length(p->geo.axis[a], 0) + t - 1) / t;
    if (!own_kv && p->region) {
      // The dQ kernel's query tiles: those over the query region (as the forward's fill_params).
      const int d = p->geo.axis[a].dilation;
      p->tile0[a] = (p->qlo[a] / d) / t;
      p->tiles[a] = (((p->qhi[a] + d - 1) / d) + t - 1) / t - p->tile0[a];
    }
    *n_tiles *= p->tiles[a];
  }
}

// The order in which the CTAs take the owned tiles (tiling.cuh walk_order, or Tuning::bwd_walk),
// with one CTA per SM resident (the dK / dV kernels' shared memory).
void set_walk(Params* p, bool own_kv, int resident, const std::string& forced, int rank,
              int (&order)[kAxes]) {
  if (forced.empty() || !fused::lifted_walk(forced, rank, order))
    fused::walk_order(p->geo, own_kv ? p->tkv : p->tq, resident, order);
  fused::walk_divisors(p->tiles, order, p->tdiv);
}


// backward_smem (launch/bwd_launch.cuh) of the kernels instantiated for (dtype, padded dim).
template <typename T>
size_t smem_of(int dpad, const BwdLaunch& l) {
  if (dpad == 64) return backward_smem<T, 64>(l);
  if (dpad == 256) return backward_smem<T, 256>(l);
  return backward_smem<T, 128>(l);
}
size_t smem_of(DType dtype, bool tf32, int dpad, const BwdLaunch& l) {
  if (dtype == DType::f32) return tf32 ? smem_of<mma::TF32>(dpad, l) : smem_of<mma::F32>(dpad, l);
  if (dtype == DType::f16) return smem_of<__half>(dpad, l);
  return smem_of<__nv_bfloat16>(dpad, l);
}

// Query tiles the dK / dV kernel's key tile visits on average with the plan's own tiles.
double bwd_visits_per_key_tile(const Problem& pr, const Params& p, int dpad) {
  const TileRows tr = tile_rows(dpad, pr.dtype == DType::f32);
  Params t = p;
  int64_t n_tiles = 0;
  set_tiles(&t, tr.dkdv_queries, tr.dkdv_keys, true, nullptr, nullptr, &n_tiles);
  double visited = 1, key_tiles = 1;
  for (int a = 0; a < kAxes; ++a) {
    visited *= fused::axis_tile_pairs(t.geo.axis[a], t.tkv[a], t.tq[a], true);
    double n = 0;
    for (int g = 0; g < t.geo.axis[a].dilation; ++g)
      n += (nbr::group_length(t.geo.axis[a], g) + t.tkv[a] - 1) / t.tkv[a];
    key_tiles *= n;
  }
  return key_tiles > 0 ? visited / key_tiles : 0.0;
}

}  // namespace

std::string backward_name(const BwdPlan& plan, DType dtype) {
  return plan.launch.dkdv_strip.dim != 0
             ? strip_name(plan.launch.dkdv_strip, fused::StripRole::dkdv, dtype)
             : plan.cfg.name();
}

Status make_bwd_plan(const Problem& pr, const Options& opt, const Params& p, BwdPlan* plan) {
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  if (dmax > 256) return unsupported("head dim " + std::to_string(dmax) + " > 256");
  detail::DeviceProps dev;
  Status st = detail::device_props(opt.device_index, &dev);
  if (!st.ok()) return st;
  if (dev.cc_major < 8) return unsupported("needs sm_80 or newer (mma.sync bf16 / f16 / tf32)");
  const Tuning& t = opt.tuning;
  const int dpad = padded_dim(dmax);
  plan->dpad = dpad;
  BwdLaunch& l = plan->launch;
  l.deterministic = opt.deterministic;
  // The configuration named, or the plan's tiles (filled below) and family.
  const BwdConfig* named = nullptr;
  std::vector<BwdConfig> table;
  if (!opt.backward_config.empty()) {
    table = bwd_configs(pr.rank, pr.dtype, dmax);
    for (const BwdConfig& c : table)
      if (c.name() == opt.backward_config) named = &c;
    if (named == nullptr)  // validate_options lists the valid names; this is a second guard
      return invalid("backward_config='" + opt.backward_config +
                     "' is not a cuda-fused backward configuration for this problem (see "
                     "fna::fused_backward_configs)");
  }
  // Both Hopper kernels (plain and warp-specialized) built for this call: the plan's choice.
  const bool hopper_ok = dev.hopper() && sm90_built(pr.dtype, dpad, fused::BwdFamily::sm90);
  // Padded head dim 256 has only the warp-specialized Hopper kernel (bwd_dkdv_sm90_d256.cuh):
  // forward+backward 1.77x the sm80 kernels' on whole-grid windows (bench/dense_bench.py --dims
  // 256, H200, 2026-11-27: 367-370 against 207-208 TFLOP/s).
  const bool hopper_d256 = dev.hopper() && dpad == 256 &&
                           sm90_built(pr.dtype, dpad, fused::BwdFamily::sm90ws);
  // Deterministic calls run the plain Hopper dK / dV kernel without its dQ, then a dQ kernel (the
  // Hopper one, or a strip one: plan_strips), where the Hopper dQ kernel takes the call; else the
  // sm80 kernels with their dQ kernel. Forward+backward, sm80 / Hopper (H100, 2026-11-28):
  // measured in docs/benchmarks.md.
  bool det_hopper = false;
  Sm90DqStep det_dq;  // (its step, passed on to plan_strips)
  if (opt.deterministic && named == nullptr && hopper_ok && t.bwd_dq_sm90 != Switch::off &&
      t.bwd_q_pairs != Switch::on &&
      (t.bwd_kernel == BwdKernel::automatic || t.bwd_kernel == BwdKernel::sm90)) {
    std::string why;
    det_hopper = plan_dq_sm90(pr, opt, dev, p, &det_dq, &why);
  }
  fused::BwdFamily family = fused::BwdFamily::sm80;
  if (named != nullptr) {
    family = named->family;
    if (t.bwd_kernel != BwdKernel::automatic &&
        static_cast<int>(t.bwd_kernel) - 1 != static_cast<int>(family))
      return invalid("backward_config='" + opt.backward_config + "' names the " +
                     fused::family_name(family) + " kernel, while tuning " + tuning_string(t) +
                     " names another");
  } else if (t.bwd_kernel != BwdKernel::automatic) {
    family = static_cast<fused::BwdFamily>(static_cast<int>(t.bwd_kernel) - 1);
  } else if (hopper_d256 && !opt.deterministic) {
    family = fused::BwdFamily::sm90ws;
  } else if (det_hopper) {
    family = fused::BwdFamily::sm90;
  } else if (hopper_ok && !opt.deterministic) {
    // The warp-specialized kernel where each key tile visits many query tiles (its pipeline's
    // fill and drain amortized: 1d-long, 2d-large, 3d-video, whole-grid windows), else the
    // plain one (1.05-1.18x faster on small windows at 128 and 64; H200,
    // bench/heuristic_quality.py). At padded head dim 64 with whole-grid windows the
    // warp-specialized kernel ran forward+backward 1.40-1.44x faster than the plain one
    // (bench/dense_bench.py, H200, 2026-11-27): the plain kernel's own query-tile copies were
    // 36% of its instructions (Nsight Compute).
    family = bwd_visits_per_key_tile(pr, p, dpad) >= 16.0 ? fused::BwdFamily::sm90ws
                                                          : fused::BwdFamily::sm90;
  }
  if (pr.rpb && dpad == 256) {
    // The bias is in the sm80 and Hopper dK / dV kernels up to padded head dim 128 (and the sm80
    // dQ kernel of the deterministic mode, whose d rpb sums go to per-CTA slots: below); the
    // head-dim-256 kernel (bwd_dkdv_sm90_d256.cuh) has none.
    if (named == nullptr && t.bwd_kernel == BwdKernel::automatic &&
        family == fused::BwdFamily::sm90ws)
      family = fused::BwdFamily::sm80;
    if (family == fused::BwdFamily::sm90ws)
      return unsupported("rpb: the sm90ws backward at padded head dim 256 adds no bias (the sm80 "
                         "kernels do)");
  }
  if (family != fused::BwdFamily::sm80) {
    const std::string what = named != nullptr ? "backward_config='" + opt.backward_config + "'"
                                              : "tuning bwd_kernel='" +
                                                    std::string(fused::family_name(family)) + "'";
    if (opt.deterministic && !(det_hopper && family == fused::BwdFamily::sm90))
      return invalid(what + ": deterministic=true runs the plain Hopper dK / dV kernel (sm90) "
                            "with the Hopper dQ kernel where that takes the call (16-bit, head "
                            "dims up to 128, no bias, tuning bwd_dq_sm90 not 'off'), else the "
                            "sm80 kernels; the others accumulate dQ by atomics");
    if (!sm90_built(pr.dtype, dpad, family))
      return unsupported(what + " needs 16-bit tensors, head dims up to 128 (up to 256: sm90ws) "
                         "and a build for sm_90a");
    if (!dev.hopper())
      return unsupported(what + " needs compute capability 9.0, device " +
                         std::to_string(opt.device_index) + " has " +
                         std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
  }
  l.family = family;
  // Keys per dK / dV tile: the kernels' rows, but for the plain Hopper kernel a named
  // configuration's or, by the heuristic, 64 where that costs less (sm90_key_rows).
  const TileRows tr = family_tile_rows(family, dpad, pr.dtype == DType::f32);
  l.kv_rows = tr.dkdv_keys;
  if (named != nullptr) {
    int rows = 1;
    for (int a = 0; a < kAxes; ++a) rows *= named->kv[a];
    l.kv_rows = rows;
  } else if (family == fused::BwdFamily::sm90) {
    // tuning bwd_q_pairs='on' pairs query tiles wherever it can, so the 128-key tiles it needs.
    l.kv_rows = t.bwd_q_pairs == Switch::on && dpad == 64 && !pr.rpb
                    ? 128
                    : sm90_key_rows(p.geo, dpad, dmax, pr.rpb);
  }
  l.dim_cols = family == fused::BwdFamily::sm90 && l.kv_rows == 64 && dpad == 64 && dmax <= 32
                   ? 32
                   : dpad;
  // Two query tiles per step of the Hopper kernels at padded head dim 64 with 128-key tiles
  // (bwd_dkdv_sm90.cuh), only where tuning asks: on whole-grid windows (H200, 2026-11-27) the
  // plain kernel ran forward+backward 1.02-1.05x faster with them, the warp-specialized one
  // (which the plan runs there) 0.94-0.95x.
  const bool pairs_fit = family != fused::BwdFamily::sm80 && dpad == 64 && l.kv_rows == 128 &&
                         !pr.rpb;
  if (t.bwd_q_pairs == Switch::on && !pairs_fit)
    return unsupported("tuning bwd_q_pairs='on' needs a Hopper backward (sm90, sm90ws) at padded "
                       "head dim 64 with 128-key tiles and no bias; the plan runs " +
                       std::string(fused::family_name(family)) + " at padded head dim " +
                       std::to_string(dpad) + " with " + std::to_string(l.kv_rows) +
                       "-key tiles" + (pr.rpb ? " and a bias" : ""));
  l.q_steps = pairs_fit && t.bwd_q_pairs == Switch::on ? 2 : 1;
  l.smem = smem_of(pr.dtype, opt.allow_tf32, dpad, l);
  int64_t rpb_entries = 1;  // the bias table's entries per head
  for (int a = 0; a < pr.rank; ++a) rpb_entries *= 2 * pr.kernel_size[a] - 1;
  if (pr.rpb) {
    // d rpb: summed per head in shared memory after the kernel's own (bwd_bias.cuh) in a copy
    // per warp (plain adds) where those copies take at most kRpbWarpCopyBytes and fit, else added
    // straight into d rpb (global atomics of the warps' diagonal sums). One shared table (shared
    // atomics: compare-and-swap loops) only where tuning bwd_rpb_sums asks for it: forward +
    // backward with the bias over without, H100, 2026-11-27, global / shared: 1d-long 2.60x /
    // 3.07x, 2-D 256x256 window 31 2.37x / 2.70x, 128x128 window 21 1.97x / 2.20x, 3-D
    // 16x32x32 window 9x11x11 2.01x / 2.49x (per-step boxes of the step's relative positions,
    // tried as well, fell in between: 2.70x, 2.59x, 2.07x, 2.43x). Before the tables: the query
    // rows' table offsets.
    const int64_t elems = rpb_entries;
    const int warps = l.kv_rows / 16;
    const size_t table = size_t(elems * sizeof(float) + 15) / 16 * 16;
    const size_t head = 16 + size_t(bwd::bias_qrel_bytes(tr.dkdv_queries));
    const size_t optin = static_cast<size_t>(dev.smem_optin);
    l.rpb_pitch = static_cast<int>(table / sizeof(float));
    const bool warps_fit = l.smem + head + warps * table <= optin;
    const bool shared_fits = l.smem + head + table <= optin;
    const std::string asked = "tuning bwd_rpb_sums='" +
                              std::string(t.bwd_rpb_sums == RpbSums::warps ? "warps" : "shared") +
                              "': ";
    if (l.deterministic) {
      // Per-warp copies (plain adds; lane by lane where a warp's values do not fall on
      // distinct diagonals: bias_grad_add), summed in order into each CTA's own slots: the same
      // sums every run (shared and global atomics are not).
      if (t.bwd_rpb_sums == RpbSums::shared || t.bwd_rpb_sums == RpbSums::global)
        return invalid(std::string("tuning bwd_rpb_sums='") +
                       (t.bwd_rpb_sums == RpbSums::global ? "global" : "shared") +
                       "' with deterministic=true: only the per-warp tables ('warps') sum d rpb "
                       "deterministically");
      if (!warps_fit)
        return unsupported("deterministic=true with a bias sums d rpb in a shared-memory table "
                           "per warp: " + std::to_string(warps) + " copies of the " +
                           std::to_string(elems) + "-entry table do not fit beside the dK / dV "
                           "kernel (" + std::to_string(l.smem + head + warps * table) +
                           " bytes, the device has " + std::to_string(optin) + ")");
    }
    if (t.bwd_rpb_sums == RpbSums::warps && !warps_fit)
      return unsupported(asked + std::to_string(warps) + " copies of the " +
                         std::to_string(elems) + "-entry table do not fit shared memory");
    if (t.bwd_rpb_sums == RpbSums::shared && !shared_fits)
      return unsupported(asked + "the " + std::to_string(elems) +
                         "-entry table does not fit shared memory");
    l.d_rpb_warps = t.bwd_rpb_sums == RpbSums::warps || l.deterministic ||
                            (t.bwd_rpb_sums == RpbSums::automatic &&
                             warps * table <= kRpbWarpCopyBytes && warps_fit)
                        ? warps
                        : 0;
    l.d_rpb_global = t.bwd_rpb_sums == RpbSums::global ||
                     (t.bwd_rpb_sums == RpbSums::automatic && l.d_rpb_warps == 0);
    l.bias_smem = head + (l.d_rpb_global ? 0 : l.d_rpb_warps > 0 ? warps * table : table);
    l.smem += l.bias_smem;
  }
  if (t.bwd_rpb_sums != RpbSums::automatic && !pr.rpb)
    return unsupported("tuning bwd_rpb_sums needs a relative positional bias (rpb)");
  if (l.smem > static_cast<size_t>(dev.smem_optin))
    return unsupported(std::string(fused::family_name(family)) + " kernels need " +
                       std::to_string(l.smem) + " bytes of shared memory per block, the device has " +
                       std::to_string(dev.smem_optin));

  // Tiles and walks (the sm80 dQ kernel's in deterministic calls on the sm80 kernels).
  const bool dq_sm80 = l.deterministic && family == fused::BwdFamily::sm80;
  plan->rows = tr;
  plan->rows.dkdv_keys = l.kv_rows;
  Params& pk = plan->p_dkdv;
  Params& pq = plan->p_dq;
  pk = pq = p;
  pk.d_rpb_global = l.d_rpb_global ? 1 : 0;
  pk.d_rpb_warps = l.d_rpb_warps;
  pk.rpb_pitch = l.rpb_pitch;
  int64_t n_dkdv = 0, n_dq = 0;
  set_tiles(&pk, tr.dkdv_queries, l.kv_rows, true, named ? named->q : nullptr,
            named ? named->kv : nullptr, &n_dkdv);
  if (dq_sm80)
    set_tiles(&pq, tr.dq_queries, tr.dq_keys, false, named ? named->dq_q : nullptr,
              named ? named->dq_kv : nullptr, &n_dq);
  if (!t.bwd_walk.empty() && static_cast<int>(t.bwd_walk.size()) != pr.rank)
    return invalid("tuning bwd_walk='" + t.bwd_walk + "' must name each of the problem's " +
                   std::to_string(pr.rank) + " axes once, fastest first");
  set_walk(&pk, true, dev.sms, t.bwd_walk, pr.rank, plan->walk);
  if (dq_sm80) {
    int order[kAxes];
    set_walk(&pq, false, dev.sms, t.bwd_walk, pr.rank, order);
  }
  // Grid rows: the dK / dV kernels' per (batch, kv head, group), the dQ kernel's (deterministic
  // mode only; otherwise dQ comes from the dK / dV kernels' atomics) per (batch, query head,
  // group); past gridDim.y's 65535 they continue over gridDim.z (fold_rows, grid_row()).
  const int64_t y_dkdv = int64_t(p.batch) * p.heads_kv * p.groups;
  const int64_t y_dq = int64_t(p.batch) * p.heads * p.groups;
  if (y_dkdv > kMaxGridRows || n_dkdv > INT32_MAX)
    return unsupported("batch * kv heads * dilation groups = " + std::to_string(y_dkdv) +
                       " with " + std::to_string(n_dkdv) + " key tiles each exceeds the "
                       "backward's grid");
  if (dq_sm80 && (y_dq > kMaxGridRows || n_dq > INT32_MAX))
    return unsupported("deterministic=true: batch * heads * dilation groups = " +
                       std::to_string(y_dq) + " with " + std::to_string(n_dq) +
                       " query tiles each exceeds the dQ kernel's grid");
  l.grid_dkdv = fold_rows(n_dkdv, y_dkdv);
  if (pr.rpb && l.deterministic) {
    const double bytes = double(n_dkdv) * double(y_dkdv) * p.heads_per_kv * rpb_entries * 4.0;
    if (bytes > double(kRpbPartMaxBytes))
      return unsupported("deterministic=true with a bias: the dK / dV CTAs' d rpb slots would take " +
                         std::to_string(int64_t(bytes)) + " bytes (at most " +
                         std::to_string(kRpbPartMaxBytes) + ")");
    l.rpb_part_bytes = static_cast<size_t>(bytes);
  }
  l.grid_add = fold_rows((p.num_add + l.kv_rows - 1) / l.kv_rows, int64_t(p.batch) * p.heads_kv);
  l.grid_dq = fold_rows(n_dq, y_dq);
  if (family == fused::BwdFamily::sm90ws && t.bwd_copy != CopyEngine::cp_async) {
    std::string why;
    l.tma = bwd_tma_maps(pk, &why);
    if (!l.tma.on && t.bwd_copy == CopyEngine::tma)
      return unsupported("tuning bwd_copy='tma': TMA cannot load this call's query tiles: " + why);
  }
  st = plan_strips(pr, opt, named != nullptr, dev, pk, det_hopper ? &det_dq : nullptr, &l);
  if (!st.ok()) return st;
  if (t.bwd_copy != CopyEngine::automatic && l.family != fused::BwdFamily::sm90ws &&
      l.dq_strip.dim == 0 && !l.dq_sm90.on)
    return unsupported("tuning bwd_copy needs the warp-specialized Hopper backward (sm90ws), "
                       "the strip backward kernels (tuning bwd_dq_strip / bwd_strip) or the "
                       "Hopper dQ kernel (tuning bwd_dq_sm90), but the plan runs " +
                       std::string(fused::family_name(l.family)));
  // The configuration that runs, by name.
  plan->cfg = BwdConfig{family, pr.rank, pr.dtype, dpad, {}, {}, {}, {}};
  for (int a = 0; a < kAxes; ++a) {
    plan->cfg.kv[a] = pk.tkv[a], plan->cfg.q[a] = pk.tq[a];
    plan->cfg.dq_q[a] = dq_sm80 ? pq.tq[a] : 1;
    plan->cfg.dq_kv[a] = dq_sm80 ? pq.tkv[a] : 1;
  }
  if (named != nullptr) plan->cfg = *named;
  return Status::Ok();
}

}  // namespace bwd
}  // namespace fna
