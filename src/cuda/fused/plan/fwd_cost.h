// The cuda-fused forward plan's cost model of a configuration's time (heuristic_config in
// fwd_choice.cu picks the cheapest candidate by it); bench/heuristic_fit.py mirrors it offline.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/kernel/common/simt_plan.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace detail {
namespace fwd_cost {

using fused::FwdEntry;
using fused::FwdFamily;
using fused::kAxes;

inline bool wg_skip_on(const Tuning& t) { return t.fwd_wg_skip != Switch::off; }

// The forward's cost model: a configuration's time (microseconds on an H200, less a launch cost
// common to every configuration, which does not move the choice) from its plan's grid and
// visited tiles,
//   ceil(m / o) * min(m, o)^share * (cta + n * (tile + pairs * q * kv * D / 64^3)),
// m = ceil(CTAs / SMs) the busiest SM's CTAs, o the CTAs one SM holds (resident_ctas), n the key
// tiles one CTA visits (the warp-specialized kernel: one warpgroup's run; box / strip: 64-key
// chunks), q * kv * D the multiply-adds of one tile. Most problems' kernels run 10-90 us, where
// fixed costs and occupancy decide, which the former work-only estimate (visited tiles x tile
// sizes, a per-tile overhead) missed both ways: the plain kernel holds two to four CTAs per SM
// (one's barriers and softmax overlap the others' MMAs: `share` < 1), the warp-specialized one a
// single CTA that pays a pipeline fill per CTA but multiplies 1.5x faster; so the latter wins
// where each SM gets one CTA (grids up to the SM count: random-0/26/27/38/49) or long runs of key
// tiles (1d-long, 2d-large, 3d-video), the former where two or more CTAs share an SM over short
// runs (random-3/8/12/24 1.07-1.14x, 2d-k7 1.08x, 1d-small 1.25x). A per-tile cost apart from the
// pairs makes fewer, larger key tiles win where they halve the tile count (3d-small 1.13x,
// random-1) but not where they cut it by 1.5x (random-6/17). The box forward's many small CTAs
// and the strip forward's few long ones compete by the same form (their chunks' pairs are fixed).
// Fitted by bench/heuristic_fit.py --fit (least squares on log time, centred per problem and
// weighted to the configurations near each one's best) on every candidate's time of the 61
// problems of bench/heuristic_quality.py (H200, 2026-11-26, bf16 / fp16, head dims 64 / 128): its
// pick is within 5% of the fastest on 58/61 (the former estimate: 44/61), 57/61 left out of the
// fit one at a time, 55.4/61 on halves held out of it (5 random splits, both ways); measured on
// the GPU with this model, 57/61 (docs/benchmarks.md). The misses: random-36 (3-D, head dim 64,
// 144 CTAs: warp-specialized 1.18x faster), random-44 / random-23 (rank-2 dilated, ~10-30 us:
// smaller plain tiles, box 1.07-1.09x faster), random-16 (1.05x).
struct CostModel {
  double cta;    // per CTA: prologue, pipeline fill, epilogue
  double tile;   // per visited key tile (chunk): its copy's wait, barriers, softmax bookkeeping
  double pairs;  // per 64^3 multiply-adds of a tile (both GEMMs)
  double share;  // o resident CTAs of one SM take o^share as long as one
};
constexpr CostModel kPlainModel{0.0, 0.584, 0.527, 0.525};
constexpr CostModel kWsModel{2.63, 0.284, 0.362, 0.0};
constexpr CostModel kBoxModel{0.0, 0.257, 0.0, 0.0};
constexpr CostModel kStripModel{1.40, 0.174, 0.0, 0.0};
// The strip forward's chunk at head dim 128 (two ring planes: twice the products and copies)
// against 32 / 64, where kStripModel was fitted. On the 21 rank-1-3 problems timed at head dim 128
// (H100, 2026-11-27, bench/heuristic_quality.py --dim 128 --random 16, every configuration; the
// file replayed by bench/heuristic_fit.py) a weight of 1.5 or 2 takes the fastest configuration
// wherever the strip competes (2d-k3, 2d-k7, nat-t there; tiled on dinat-t and random-2 / 13 /
// 15); 1 takes the strip on random-2 / 13 / 15 (1.3-1.5x slower), 3 misses 2d-k7 (1.4x).
inline double strip_chunk_weight(int dim) { return dim > 64 ? 2.0 : 1.0; }
// The SIMT forward (fwd_simt.h): n = 8-key steps of a thread, q * kv * D = its CTA's FMAs of one
// step for S (as many again for O); o = CTAs its registers, threads and shared memory let an SM
// hold. `cta` and `tile` fitted on their own (the other families fixed; `pairs` held at 2 and
// `share` at 0, which the data left undetermined) by bench/heuristic_fit.py --fit --families simt
// on the H100 run of 2026-11-26 (bench/heuristic_quality.py: the small-window set and 50 random
// problems): it takes the SIMT forward on short 1-D problems with small windows (4-20 us, where it
// ran up to 1.3x faster than the best tensor-core configuration) and nowhere on the small-window set,
// where it ran 1.2-4x slower (docs/benchmarks.md).
constexpr CostModel kSimtModel{4.253, 1.519, 2.0, 0.0};

// CTAs of one configuration an SM holds: the plain Hopper kernel's launch bound (Sm90Traits
// kMinBlocks: shared memory, 128 registers a thread, at most 4), the box forward's (3 CTAs of 4
// warps), the SIMT forward's (shared memory, threads, its registers at padded head dim `dim`); the
// warp-specialized kernel and the strip take all registers / shared memory.
inline int resident_ctas(FwdFamily f, size_t smem, int warps, const DeviceProps& dev,
                         int dim = 0) {
  const int by_smem = int((size_t(dev.smem_optin) + 1024) / (smem + 1024));
  const int threads = 32 * warps;
  int o = 1;
  if (f == FwdFamily::sm90) o = std::min({4, by_smem, 65536 / (threads * 128)});
  if (f == FwdFamily::box) o = std::min(by_smem, threads <= 128 ? 3 : 1);
  if (f == FwdFamily::simt)
    o = std::min({by_smem, 2048 / threads, 65536 / (threads * fused::simt_registers(dim))});
  return std::max(o, 1);
}

inline double model_cost(const CostModel& m, double ctas, double tiles_per_cta,
                         double tile_macs, int resident, const DeviceProps& dev) {
  const double busiest = std::ceil(ctas / double(std::max(dev.sms, 1)));
  const double waves = std::ceil(busiest / resident);
  const double together = std::min(busiest, double(resident));
  return waves * std::pow(together, m.share) *
         (m.cta + tiles_per_cta * (m.tile + m.pairs * tile_macs / (64.0 * 64.0 * 64.0)));
}

// CTAs of a tiled launch: query tiles over the call's queries (its region, if any; make_fwd_plan).
inline double ctas_of(const Problem& p, const fused::Geometry& geo, const int (&q)[kAxes]) {
  const fused::QueryBox box = fused::query_box(p);
  double tiles = 1;
  for (int ax = 0; ax < kAxes; ++ax) tiles *= fused::tiles_over(box.max_length(geo, ax), q[ax]);
  return double(p.batch) * double(p.heads) * geo.num_groups() * tiles;
}

// A tiled Hopper configuration's modelled time: its visited key tiles as the plan counts them
// (make_fwd_plan: the warp-specialized kernel's warpgroups walk only their own rows' run).
inline double tiled_cost(const FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                         const Tuning& t, const DeviceProps& dev) {
  const double ctas = ctas_of(p, geo, e.q);
  if (ctas <= 0) return 0;
  const bool ws = e.family == FwdFamily::sm90ws;
  const fused::Ext3 qe{{e.q[0], e.q[1], e.q[2]}}, ke{{e.kv[0], e.kv[1], e.kv[2]}};
  // Over the call's queries: a query region's tiles start at its first query and stop at its end.
  const fused::QueryBox box = fused::query_box(p);
  const double visited = ws && wg_skip_on(t)
                             ? fused::part_tiling_stats(geo, qe, ke, 64, &box).visited
                             : fused::tiling_stats(geo, e.q, e.kv, &box).visited;
  const double per_cta = visited * double(p.batch) * double(p.heads) / ctas;
  return model_cost(ws ? kWsModel : kPlainModel, ctas, per_cta,
                    double(e.q_size()) * double(e.kv_size()) * double(e.dim),
                    resident_ctas(e.family, e.smem(), e.warps, dev), dev);
}

// Work estimate of an mma.sync configuration (devices without wgmma, and head dim 32, which only
// they compile): every visited key tile costs kQ * kN score pairs, border tiles about a quarter
// more for the mask, and each tile's copy and barrier about as much as 32 more query rows would (so
// smaller query tiles pay for re-reading K/V).
inline double sm80_cost(const FwdEntry& e, const fused::Geometry& geo,
                        const fused::QueryBox& box) {
  const fused::TilingStats s = fused::tiling_stats(geo, e.q, e.kv, &box);
  const double masked = s.visited - s.unmasked;
  return ((s.visited + 0.25 * masked) * double(e.q_size()) + 32.0 * s.visited) *
         double(e.kv_size());
}

}  // namespace fwd_cost
}  // namespace detail
}  // namespace fna
