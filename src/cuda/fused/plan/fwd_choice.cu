// cuda-fused forward: which configuration a call runs, the one named (Options::config) or the
// heuristic's (the cost model of fwd_cost.h / fwd_simt.h over the candidates that fit the problem
// and the device), and the candidate lists (fna::fused_configs, the autotuner's). The plan that
// follows from the choice is made in forward.cu.
#include "cuda/fused/plan/fwd_choice.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backends.h"
#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "cuda/fused/plan/fwd_cost.h"
#include "cuda/fused/plan/fwd_simt.h"

namespace fna {
namespace detail {

namespace {

using fused::FwdEntry;
using fused::FwdFamily;
using fused::kAxes;
using fwd_cost::ctas_of;
using fwd_cost::kBoxModel;
using fwd_cost::kStripModel;
using fwd_cost::model_cost;
using fwd_cost::resident_ctas;
using fwd_cost::sm80_cost;
using fwd_cost::tiled_cost;

Status unsupported(const std::string& msg) { return {Code::unsupported, "backend=cuda-fused: " + msg}; }
Status invalid(const std::string& msg) { return {Code::invalid_argument, msg}; }

}  // namespace

// Entries of one (rank, dtype, precision); `tf32` only matters for float32.
static bool matches(const FwdEntry& e, int rank, DType dtype, bool tf32) {
  return e.rank == rank && e.dtype == dtype && e.tf32 == (tf32 && dtype == DType::f32);
}

// The smallest compiled head dim that holds max(D, D_v); 0 when none does.
static int dim_bucket(int rank, DType dtype, bool tf32, int64_t need) {
  int best = 0;
  for (const FwdEntry& e : fused::forward_table())
    if (matches(e, rank, dtype, tf32) && e.dim >= need && (best == 0 || e.dim < best))
      best = e.dim;
  return best;
}

std::vector<const FwdEntry*> candidates(int rank, DType dtype, bool tf32, int64_t need) {
  std::vector<const FwdEntry*> out;
  const int bucket = dim_bucket(rank, dtype, tf32, need);
  for (const FwdEntry& e : fused::forward_table())
    if (matches(e, rank, dtype, tf32) && e.dim == bucket) out.push_back(&e);
  return out;
}

// The configurations listed for a head dim (fna::fused_configs): the bucket's entries and, where
// that bucket has no wgmma kernel (head dim 32), the smallest bucket that has one: padded to 64,
// the wgmma kernels ran a 2-D 13x13 problem at head dim 32 in 0.23 ms against 0.40 for the
// mma.sync kernels of its own bucket (H200), so on compute capability 9.0 the plan chooses among
// both (plan_candidates) and time no longer grows as the head dim shrinks.
std::vector<const FwdEntry*> listed_candidates(int rank, DType dtype, bool tf32, int64_t need) {
  std::vector<const FwdEntry*> out = candidates(rank, dtype, tf32, need);
  for (const FwdEntry* e : out)
    if (e->wgmma()) return out;
  int up = 0;
  for (const FwdEntry& e : fused::forward_table())
    if (matches(e, rank, dtype, tf32) && e.dim >= need && e.wgmma() && (up == 0 || e.dim < up))
      up = e.dim;
  if (up == 0) return out;
  for (const FwdEntry* e : candidates(rank, dtype, tf32, up)) out.push_back(e);
  return out;
}

// The candidates the plan chooses among on device `dev` (the upper bucket on Hopper only).
std::vector<const FwdEntry*> plan_candidates(int rank, DType dtype, bool tf32, int64_t need,
                                             const DeviceProps& dev) {
  return dev.hopper() ? listed_candidates(rank, dtype, tf32, need)
                      : candidates(rank, dtype, tf32, need);
}

fused::Geometry geometry_of(const Problem& p) {
  return fused::Geometry::lift(p.rank, p.shape, p.kernel_size, p.dilation, p.stride, p.is_causal);
}

// 192-query tiles (three frames) pay off where the first axis's windows are deep enough that each
// frame-warpgroup's run of key tiles is long (3d-video's 18 frames); on windows of 5-7 frames
// the 2-frame tiles ran 1.08-1.39x faster (H200, bench/heuristic_quality.py random problems).
// At rank 2 (24x8 queries, a warpgroup's 8 rows of 8) the cost model decides alone: 24x8 / 8x8
// ran 2d-k3 1.14x, 2d-k7 1.18x and 2d-large 1.09x faster than the 8x16 tiles the plan took
// before (H200, tools/experiments/fwd_configs.py). At rank 1 (64 consecutive rows per warpgroup) windows of 32
// or more are offered them (1d-long: 1.19x).
// At head dim 64 (configs/forward.h): q192 / kv128 for 1-D windows of 1024 or more (1.14-1.17x
// faster than q128 / kv128 from 2049 up, 1.07x slower than q64 / kv64 at 513, where the cost
// model would take it); 3x8x8 / 2x8x8 only where every window is its whole dilation group on
// every axis, so that no key tile is masked: there it ran 1.07x faster than the plain 2x8x8
// tiles, on masked tiles (whose path spills) 1.02-1.17x slower.
static bool deep_enough(const FwdEntry& e, const fused::Geometry& geo) {
  if (e.q_size() != 192) return true;
  if (e.dim == 64 && e.rank == 1) return geo.axis[kAxes - 1].kernel >= 1024;
  if (e.dim == 64) {
    for (const nbr::Axis& a : geo.axis)
      if (a.causal || int64_t(a.kernel) * a.dilation < a.length) return false;
    return true;
  }
  if (e.rank == 2) return true;
  return geo.axis[kAxes - e.rank].kernel >= (e.rank == 3 ? 9 : 32);
}

// Whether the box forward takes this problem on this device (its plan in `bp`); `why` says why
// not.
bool box_applies(const FwdEntry& e, const Problem& p, const fused::Geometry& geo, int smem_optin,
                 fused::BoxPlan* bp, std::string* why) {
  if (p.num_additional > 0) {
    *why = "num_additional=" + std::to_string(p.num_additional) +
           " (the box forward takes no additional keys)";
    return false;
  }
  if (p.has_query_region()) {
    *why = "a query region (query_offset / query_shape; the box forward computes whole grids)";
    return false;
  }
  *bp = fused::box_plan(geo, e.q, e.dim);
  if (!bp->ok) {
    *why = bp->why;
    return false;
  }
  if (p.rpb) {  // the head's bias table is staged after the halo
    size_t bytes = 0;
    if (!fused::box_bias_bytes(geo, &bytes, why)) return false;
    bp->smem = fused::bias_stage_offset(bp->smem) + bytes;
  }
  if (bp->smem > static_cast<size_t>(smem_optin)) {
    *why = "its halo needs " + std::to_string(bp->smem) + " bytes of shared memory, the device has " +
           std::to_string(smem_optin);
    return false;
  }
  return true;
}

// Whether the strip forward takes this problem on this device (its plan in `sp`).
bool strip_applies(const FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                   const DeviceProps& dev, fused::StripPlan* sp, std::string* why) {
  if (p.num_additional > 0) {
    *why = "num_additional=" + std::to_string(p.num_additional) +
           " (the strip forward takes no additional keys)";
    return false;
  }
  if (p.has_query_region()) {
    *why = "a query region (query_offset / query_shape; the strip forward computes whole grids)";
    return false;
  }
  *sp = fused::strip_plan(geo, e.kv[1], e.kv[2], e.q[1] / e.kv[1], dev.sms, dev.smem_optin,
                          double(p.batch) * double(p.heads), e.dim, p.rpb);
  if (!sp->ok) *why = sp->why;
  return sp->ok;
}

// Next to the mma.sync kernels (devices without wgmma) the box forward replaces the tiled choice
// when it multiplies at most this fraction of its pairs and its chunks' 16 columns are on average
// at least 3/4 inside their boxes' unions (windows of 9+ on the last axis): 13x13 and 11x11
// windows (0.57 of the pairs) ran 1.02-1.09x faster with it, 7x7 and 9x9 (0.75) 0.79-0.95x, 5x5
// (half the columns outside the unions) 0.93x (H100, bf16, head dim 64, against the wgmma
// kernels; on Hopper the cost model decides instead).
constexpr double kBoxPairsRatio = 0.6;
// The strip forward multiplies the box forward's pairs without re-copying a halo per CTA tile,
// so there it takes the box forward's place and, with a looser ratio, some of the tiled kernels':
// 13x13 with dilation 2 (0.62 of the tiled choice's pairs) ran 1.063x over the tiled kernel,
// 9x9 / 7x7 (0.75) 0.81-0.95x (H100, bf16, head dim 64).
constexpr double kStripPairsRatio = 0.65;

// Pairs a tiled configuration multiplies per (batch, head): visited key tiles x tile sizes.
static double tiled_pairs(const FwdEntry& e, const fused::Geometry& geo) {
  return fused::tiling_stats(geo, e.q, e.kv).visited * double(e.q_size()) * double(e.kv_size());
}

// The strip forward's query rows in flight (box rows x 4, 4 warps per box row) that the plan
// takes: 12 rows (3 box rows, 12 warps) wherever they fit, the fastest strip or within 2% of it on
// all nine rank-2 head-dim-64 problems that run it (16 rows ran random-33 1.12x slower though their
// halo fit the ring with four bands to spare; H200, bench/heuristic_quality.py); else the most
// whose halo rows (their union, 4 P + box_rows - 4 rows for P box rows) fit the ring with four
// bands to spare (ring_rows >= q[1] + box_rows + 4), else the fewest. With the bands handed back
// without fences the copies' lookahead counts more than the warps: 12 warps ran 2d-nat 0.416 ms
// against 0.426 for 16 and 0.467 for 8 (H100, bf16). Except where a CTA's row segment is taller
// than 12 rows but one step of more rows covers it (a grid or dilation group of 13-16 rows): then
// the fewest rows that do, where the halo fits as above. nat-late (14x14, head dim 32): 14 rows
// 0.0335 ms, 16 rows 0.0337, 12 rows (two steps, the second of 2 rows) 0.0367; nat-t (56 rows)
// stays at 12: 0.0871 against 0.0947 for 14 and 0.0920 for 16 (H100, bf16,
// bench/heuristic_quality.py, 2026-11-27).
static int strip_rows_score(const FwdEntry& e, const fused::StripPlan& sp) {
  const bool fits = sp.sp.ring_rows >= e.q[1] + sp.box_rows + 2 * fused::kStripBandRows;
  const int rows = sp.sp.seg_rows;
  if (fits && rows > 12 && rows <= e.q[1]) return 3000 - e.q[1];
  if (e.q[1] == 12) return 2000;
  return fits ? 1000 + e.q[1] : -e.q[1];
}


static std::string join_names(const std::vector<const FwdEntry*>& es) {
  std::string s;
  for (const FwdEntry* e : es) s += (s.empty() ? "" : ", ") + e->name();
  return s.empty() ? "(none)" : s;
}

// Options::config's entry (an error when it does not fit the call or the device).
Status named_config(const Problem& p, const Options& opt, const fused::Geometry& geo,
                    const DeviceProps& dev, const FwdEntry** out) {
  const int64_t need = std::max(p.dim, p.dim_v);
  const Tuning& t = opt.tuning;
  if (t.fwd_schedule != FwdSchedule::automatic || t.fwd_strip != Switch::automatic ||
      t.fwd_box != Switch::automatic || t.fwd_simt != Switch::automatic)
    return invalid("config='" + opt.config + "' names the forward configuration, while tuning " +
                   tuning_string(t) + " would choose among configurations: give one or the other");
  const FwdEntry* cfg = nullptr;
  for (const FwdEntry& e : fused::forward_table())
    if (e.name() == opt.config && matches(e, p.rank, p.dtype, opt.allow_tf32) && e.dim >= need)
      cfg = &e;
  if (cfg == nullptr)
    return invalid("config='" + opt.config +
                   "' is not a cuda-fused forward configuration for rank=" + std::to_string(p.rank) +
                   ", dtype=" + dtype_name(p.dtype) + ", dim=" + std::to_string(need) +
                   "; valid: " + join_names(listed_candidates(p.rank, p.dtype, opt.allow_tf32, need)));
  if (cfg->wgmma() && !dev.hopper())
    return unsupported("config='" + opt.config + "' is a Hopper (wgmma) configuration: it needs "
                       "compute capability 9.0, device " + std::to_string(opt.device_index) +
                       " has " + std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
  if (cfg->boxes()) {
    fused::BoxPlan bp;
    fused::StripPlan sp;
    std::string why;
    const bool ok = cfg->family == FwdFamily::box ? box_applies(*cfg, p, geo, dev.smem_optin, &bp, &why)
                                                  : strip_applies(*cfg, p, geo, dev, &sp, &why);
    if (!ok) return unsupported("config='" + opt.config + "' cannot run this problem: " + why);
  }
  if (cfg->simt()) {
    fused::SimtPlan sp;
    std::string why;
    if (!fwd_simt::applies(*cfg, p, geo, dev, &sp, &why))
      return unsupported("config='" + opt.config + "' cannot run this problem: " + why);
  }
  *out = cfg;
  return Status::Ok();
}

// The heuristic's configuration: the candidate of the least modelled time (model_cost) among
// those that fit the device's shared memory and run on it: on compute capability 9.0 the wgmma
// kernels (both schedules, or the one the caller names), the box forward's 16-warp entry and the
// strip forward's entry of strip_rows_score; elsewhere, and where no wgmma kernel is compiled for
// the head dim, the mma.sync ones by their work (sm80_cost), replaced by the box or strip forward
// under the pair-ratio rules; the SIMT forward by its model on Hopper. Ties go to the earlier
// entry. Tuning can ask for the box / strip / SIMT forward wherever they apply (the SIMT, else the
// strip, else the box, is taken) or rule them out, and fwd_schedule=mma_sync asks for the tiled
// mma.sync kernels alone on any device.
Status heuristic_config(const Problem& p, const Options& opt, const fused::Geometry& geo,
                        const DeviceProps& dev, const FwdEntry** out) {
  const int64_t need = std::max(p.dim, p.dim_v);
  const Tuning& t = opt.tuning;
  // fwd_schedule=mma_sync: the tiled mma.sync kernels by their work alone, as on a device without
  // wgmma (the box, strip and SIMT forwards out).
  const bool mma_sync = t.fwd_schedule == FwdSchedule::mma_sync;
  if (mma_sync)
    for (const auto& [key, sw] : {std::pair<const char*, Switch>{"fwd_box", t.fwd_box},
                                  {"fwd_strip", t.fwd_strip}, {"fwd_simt", t.fwd_simt}})
      if (sw == Switch::on)
        return invalid(std::string("tuning ") + key + "='on' contradicts fwd_schedule='mma_sync' "
                       "(the tiled mma.sync kernels)");
  const std::vector<const FwdEntry*> cands =
      mma_sync ? candidates(p.rank, p.dtype, opt.allow_tf32, need)
               : plan_candidates(p.rank, p.dtype, opt.allow_tf32, need, dev);
  if (cands.empty())
    return unsupported("dim=" + std::to_string(need) + " exceeds the largest compiled head dim");
  const bool named_schedule = t.fwd_schedule == FwdSchedule::plain ||
                              t.fwd_schedule == FwdSchedule::warp_specialized;
  const FwdFamily want = t.fwd_schedule == FwdSchedule::plain ? FwdFamily::sm90 : FwdFamily::sm90ws;
  if (named_schedule && !dev.hopper())
    return invalid("tuning fwd_schedule names a Hopper (wgmma) schedule, but device " +
                   std::to_string(opt.device_index) + " has compute capability " +
                   std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
  auto fits = [&](const FwdEntry* e) { return e->smem() <= static_cast<size_t>(dev.smem_optin); };
  auto takes_wgmma = [&](const FwdEntry* e) {
    return e->wgmma() && fits(e) && deep_enough(*e, geo) && (!named_schedule || e->family == want);
  };
  bool any90 = false;
  if (dev.hopper() && !mma_sync)
    for (const FwdEntry* e : cands) any90 = any90 || takes_wgmma(e);
  if (named_schedule && !any90)
    return unsupported("no " + std::string(fused::family_name(want)) + " configuration for rank=" +
                       std::to_string(p.rank) + ", dtype=" + dtype_name(p.dtype) +
                       ", dim=" + std::to_string(need) + " fits the device");
  const FwdEntry* cfg = nullptr;
  double best = 0;
  const fused::QueryBox box = fused::query_box(p);
  for (const FwdEntry* e : cands) {
    if (e->boxes() || e->simt() || !fits(e)) continue;
    if (any90 ? !takes_wgmma(e) : e->wgmma()) continue;
    const double c = any90 ? tiled_cost(*e, p, geo, t, dev) : sm80_cost(*e, geo, box);
    if (cfg == nullptr || c < best) {
      cfg = e;
      best = c;
    }
  }
  // The box and strip forwards (mma.sync, rank 2): on Hopper by the same model against the tiled
  // choice; next to the mma.sync kernels by the pair-ratio rules (kBoxPairsRatio); wherever they
  // apply when Tuning asks for them or nothing tiled fits.
  const double tiled = cfg != nullptr ? tiled_pairs(*cfg, geo) : 0;
  const double heads = double(p.batch) * double(p.heads);
  if (!named_schedule && !mma_sync) {
    // The box forward: its 16-warp entry (the smaller CTA tiles copy 1.4-2x the halo rows per
    // query; wherever the box forward ran fastest they ran 1.1-1.6x slower than it).
    const FwdEntry* box = nullptr;
    double box_cost = 0;
    for (const FwdEntry* e : cands) {
      if (e->family != FwdFamily::box || t.fwd_box == Switch::off || e->warps < 16 ||
          (p.rpb && t.fwd_rpb_stage == Switch::off))
        continue;
      fused::BoxPlan bp;
      std::string why;
      if (!box_applies(*e, p, geo, dev.smem_optin, &bp, &why)) continue;
      const double ctas = ctas_of(p, geo, e->q);
      const int resident = resident_ctas(e->family, bp.smem, e->warps, dev);
      const double c =
          ctas <= 0 ? 0 : model_cost(kBoxModel, ctas, bp.chunks * heads / ctas, 0, resident, dev);
      const bool pays = any90 ? c < best
                              : bp.computed <= kBoxPairsRatio * tiled && bp.fast_fill >= 0.75;
      if (cfg != nullptr && t.fwd_box != Switch::on && !pays) continue;
      if (box == nullptr || c < box_cost) {
        box = e;
        box_cost = c;
      }
    }
    if (box != nullptr) {
      cfg = box;
      best = box_cost;
    }
    // The strip forward: its entry of strip_rows_score, where it applies and pays; among entries
    // of the same score the least modelled time (the warp box with fewer chunks), then the
    // smaller head dim (the same chunks with half the products).
    const FwdEntry* strip = nullptr;
    int strip_score = 0;
    double strip_cost = 0;
    fused::StripPlan strip_sp;
    for (const FwdEntry* e : cands) {
      // (The box and strip forwards stage a bias table: not under fwd_rpb_stage off.)
      if (e->family != FwdFamily::strip || t.fwd_strip == Switch::off ||
          (p.rpb && t.fwd_rpb_stage == Switch::off))
        continue;
      fused::StripPlan sp;
      std::string why;
      if (!strip_applies(*e, p, geo, dev, &sp, &why)) continue;
      const int score = strip_rows_score(*e, sp);
      const double ctas = heads * geo.num_groups() * double(sp.sp.strips) * double(sp.sp.segs);
      const double c =
          ctas <= 0 ? 0
                    : model_cost(kStripModel, ctas,
                                 sp.box.chunks * heads / ctas * fwd_cost::strip_chunk_weight(e->dim),
                                 0, resident_ctas(e->family, sp.smem, e->warps, dev), dev);
      if (strip != nullptr &&
          (score < strip_score ||
           (score == strip_score && (c > strip_cost || (c == strip_cost && e->dim >= strip->dim)))))
        continue;
      strip = e;
      strip_score = score;
      strip_sp = sp;
      strip_cost = c;
    }
    if (strip != nullptr) {
      const bool pays =
          any90 ? strip_cost < best
                : box != nullptr || tiled == 0 ||
                      (strip_sp.box.computed <= kStripPairsRatio * tiled &&
                       strip_sp.box.fast_fill >= 0.75);
      if (cfg == nullptr || t.fwd_strip == Switch::on || pays) {
        cfg = strip;
        best = strip_cost;
      }
    }
    // The SIMT forward: its cheapest entry by fwd_simt::cost, where it applies and (on Hopper,
    // against the model's other picks) pays; elsewhere only when asked for or nothing else fits
    // (its model is fitted to Hopper).
    const FwdEntry* simt = nullptr;
    double simt_cost = 0;
    for (const FwdEntry* e : cands) {
      // (With a bias it reads the table in global memory: not under fwd_rpb_stage on / off.)
      if (!e->simt() || t.fwd_simt == Switch::off ||
          (p.rpb && t.fwd_rpb_stage != Switch::automatic))
        continue;
      fused::SimtPlan sp;
      std::string why;
      if (!fwd_simt::applies(*e, p, geo, dev, &sp, &why)) continue;
      const double c = fwd_simt::cost(*e, p, geo, sp, dev);
      if (simt == nullptr || c < simt_cost) {
        simt = e;
        simt_cost = c;
      }
    }
    if (simt != nullptr && (cfg == nullptr || t.fwd_simt == Switch::on || (any90 && simt_cost < best)))
      cfg = simt;
  }
  if (cfg == nullptr)
    return unsupported("no configuration for dim=" + std::to_string(need) + " fits the device's " +
                       std::to_string(dev.smem_optin) + " bytes of shared memory per block");
  *out = cfg;
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
