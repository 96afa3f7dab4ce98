// The production CPU backend, fused forward and backward: the driver. It splits the problem into
// tiles of queries along the last axis (see cpu/tile.h), converts the key / value lines the tiles
// read into float panels (dtype and strides; PanelStore), and runs the ISA-specific tile kernels.
// Only the neighborhood is visited: the box comes from nbr::window / nbr::tile_union.
//
// A query region (Problem::query_offset / query_shape) is taken natively, not by running the
// whole grid on scratch copies: the plan (cpu/plan.h) walks only the region's lines and the tiles
// of its stretch of the last axis, each tile's queries keep their grid tokens (so windows, boxes
// and panels are the whole grid's, unchanged), and the Q-role tensors (Q, O, LSE; backward also
// dO, dQ, d_lse) are read and written through region_in_grid views (cpu/strided.h), which map a
// grid token inside the region to the region tensor's element. That is a few lines in the plan
// and the views, where the expansion would copy grid-sized Q / O / dO / dQ scratch and compute
// every query of the grid to keep a few.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cpu/driver.h"
#include "cpu/guarded.h"
#include "core/backends.h"
#include "core/neighborhood.h"
#include "cpu/parallel.h"
#include "cpu/strided.h"
#include "cpu/tile.h"

namespace fna {
namespace cpu {

const Kernels& avx512_kernel_table();
const Kernels& avx2_kernel_table();
const Kernels& generic_kernel_table();

#if FNA_CPU_X86_KERNELS
const Kernels* avx512_kernels() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? &avx512_kernel_table()
                                                                                 : nullptr;
}
const Kernels* avx2_kernels() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2_kernel_table()
                                                                         : nullptr;
}
#else
const Kernels* avx512_kernels() { return nullptr; }
const Kernels* avx2_kernels() { return nullptr; }
#endif
const Kernels& generic_kernels() { return generic_kernel_table(); }

// The best kernel set the CPU and the build have (Tuning::cpu_isa automatic).
const Kernels& best_kernels() {
  if (avx512_kernels()) return *avx512_kernels();
  if (avx2_kernels()) return *avx2_kernels();
  return generic_kernels();
}

const Kernels* kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic: return &best_kernels();
    case CpuIsa::generic: return &generic_kernels();
    case CpuIsa::avx2: return avx2_kernels();
    case CpuIsa::avx512: return avx512_kernels();
  }
  return nullptr;
}

Status select_kernels(const Options& opt, const Kernels** out) {
  *out = kernels_for(opt.tuning.cpu_isa);
  if (*out) return Status::Ok();
  const bool avx512 = opt.tuning.cpu_isa == CpuIsa::avx512;
  return {Code::unsupported,
          std::string("tuning cpu_isa='") + (avx512 ? "avx512" : "avx2") + "': " +
              (FNA_CPU_X86_KERNELS ? "this CPU lacks " : "this build has no x86 kernels for ") +
              (avx512 ? "AVX-512F / AVX-512VL" : "AVX2 / FMA") +
              " (leave cpu_isa automatic, or pick one this CPU has)"};
}

using namespace driver;

// Whether the forward runs in strip order (Plan::strips): on 2-D grids whose heads-last rows hold
// several KV heads, when the tiles' key columns add at most half again to a line's (strip panels
// overlap by the window) and a ring of every head's strip panels (the box's lines and a band)
// takes at most 1.5 MB (of the 2 MB L2 of the CI machine's cores). Tuning::cpu_strips overrides.
static bool strips_fit(const Problem& p, const Kernels& kern, int band) {
  if (p.rank != 2 || p.heads_kv < 2) return false;
  const Plan plan(p, kern.vector_width, band, true);
  const Panels panels(plan, kern);
  const nbr::Axis& L = plan.ax[plan.la];
  int64_t cols = 0;
  for (const Plan::LastTile& lt : plan.last_tiles)
    cols += nbr::tile_union(L, nbr::group_length(L, lt.g), lt.i0, lt.i1).size();
  const int64_t lines = 1 + (p.kernel_size[0] - 1) * p.dilation[0] + plan.band;
  const int64_t floats = static_cast<int64_t>(panels.pitch) * (round_up(static_cast<int>(p.dim), plan.vw) +
                                                                 round_up(static_cast<int>(p.dim_v), plan.vw));
  return 2 * cols <= 3 * p.shape[1] && lines * p.heads_kv * floats * 4 <= (int64_t(3) << 19);
}

Status forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const Kernels* kp = nullptr;
  if (Status st = select_kernels(opt, &kp); !st.ok()) return st;
  const Kernels& kern = *kp;
  const Tuning& tun = opt.tuning;
  // Bands of 2 lines: work items of two adjacent lines' same tile, one kernel call for both
  // (Plan::per_item). Measured on the 13x13 benchmark: 0.96x of line order with one tile per
  // item (median of 40 paired calls); bands of 4, 8 or 16 were no faster. Tuning::cpu_band
  // overrides (1: line order, one tile per item; odd: no pairs).
  const int band = tun.cpu_band > 0 ? tun.cpu_band : 2;
  const bool strips = tun.cpu_strips == Switch::automatic ? strips_fit(p, kern, band)
                                                          : tun.cpu_strips == Switch::on;
  const Plan plan(p, kern.vector_width, band, strips);
  // A query region is native (Plan: only the region's lines and last-axis tiles are tasks):
  // Q, O and LSE are addressed by grid tokens through region_in_grid views of their region-shaped
  // tensors; K and V are the grid's.
  const Strided q = region_in_grid(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = region_in_grid(a.o, p, p.dtype);
  const Strided lse = region_in_grid(a.lse, p, DType::f32, false);
  const Strided add_k = add_view(a.add_k, p), add_v = add_view(a.add_v, p);
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int A = static_cast<int>(p.num_additional);
  const int Dp = round_up(D, plan.vw), Dvp = round_up(Dv, plan.vw);
  const int threads = resolve_threads(opt.num_threads, plan.items());
  const Panels panels(plan, kern);
  // Panels are cached per calling thread: re-touching fresh pages on every call costs as much as
  // the conversion itself.
  // Only the padding needs zeros (Panels::convert writes it), so the buffers are not refilled.
  static thread_local std::vector<Floats> tl_panels;
  const int64_t kt_floats = static_cast<int64_t>(D) * panels.pitch;  // K^T, then V row-major
  const int64_t v_floats = static_cast<int64_t>(panels.pitch) * Dvp;
  PanelStore store(plan, panels.count, threads, {kt_floats, v_floats}, &tl_panels, tun.cpu_panels);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const float scale_log2 = static_cast<float>(opt.scale) * kLog2e;
  const BiasTables bias(p, a.rpb, kLog2e);
  const int64_t tpl = PanelStore::tasks_per_line(plan);
  const int64_t chunk = std::max<int64_t>(1, store.chunk(tpl) / plan.per_item());  // in items
  auto run_item = [&](int64_t item, int64_t chunk_end, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    bool paired = false;
    const int n = item_geoms(plan, item, store.ring_lines(), D, Dv, A, sc, &paired);
    float* tmp = sized(sc.tmp, static_cast<int64_t>(Panels::kBlock) * std::max(Dp, Dvp));
    float* kt = store.base(0, worker);
    float* vr = store.base(1, worker);
    plan_hints(plan, item, chunk_end, worker, store, panels, {{&q, D}, {&o, Dv}}, {{&k, D}, {&v, Dv}}, D, Dv, A, sc);
    // Tiles [j0, j0 + m): both in one call when paired, else one after the other.
    for (int j0 = 0; j0 < n; j0 += paired ? 2 : 1) {
      const int m = paired ? 2 : 1;
      ForwardTile ft[2];
      for (int j = j0; j < j0 + m; ++j)
        ensure_box(store, worker, panels, sc.tile[j].tg, sc.tile[j], [&](int64_t id, int64_t at) {
          panels.convert(k, D, Dp, id, kt + at * kt_floats, nullptr, tmp);
          panels.convert(v, Dv, Dvp, id, nullptr, vr + at * v_floats, tmp);
        });
      for (int i = 0; i < m; ++i) {
        TileScratch& ts = sc.tile[j0 + i];
        const TileGeom& tg = ts.tg;
        const TileShape& s = tg.s;
        panels.rows_of(tg, ts.key_line.data(), static_cast<const float*>(kt), kt_floats, 1, &ts.r1, store.slots());
        panels.rows_of(tg, ts.key_line.data(), static_cast<const float*>(vr), v_floats, Dvp, &ts.r2,
                       store.slots());
        ForwardTile& f = ft[i];
        f.s = s;
        f.pitch = panels.pitch;
        f.scale_log2 = scale_log2;
        f.kt_rows = ts.r1.data();
        f.v_rows = ts.r2.data();
        float* ak = sized(ts.add_k, static_cast<int64_t>(A) * Dp + 1);
        float* av = sized(ts.add_v, static_cast<int64_t>(A) * Dvp + 1);
        gather_additional(add_k, tg.b, tg.hk, A, D, Dp, ak);
        gather_additional(add_v, tg.b, tg.hk, A, Dv, Dvp, av);
        f.add_k = ak;
        f.add_v = av;
        f.lse = sized(ts.lse, s.T);
        // Scores of the whole tile (cpu/kernels_impl.h): T queries x R rows x the widest group span.
        f.scratch = sized(ts.work, static_cast<int64_t>(s.T) * s.R * padded_window(max_count(s) + 4, plan.vw) +
                                       static_cast<int64_t>(s.T) * (A + 1));
      }
      if (j0 == 0) {
        ft[0].prefetch.rows = sc.hints.rows.data();
        ft[0].prefetch.n = static_cast<int>(sc.hints.rows.size());
        ft[0].prefetch.lines = sc.hints.lines;
      }
      for (int64_t gi = 0; gi < plan.group; ++gi) {
        bool o_direct[2] = {};
        for (int i = 0; i < m; ++i) {
          TileScratch& ts = sc.tile[j0 + i];
          const TileGeom& tg = ts.tg;
          ForwardTile& f = ft[i];
          const int64_t h = tg.hk * plan.group + gi;
          f.bias = tile_bias(bias, tg, h);
          const float* qd = direct_rows<const float>(q, D, Dp, plan, tg, h, &f.q_pitch);
          float* od = direct_rows<float>(o, Dv, Dvp, plan, tg, h, &f.o_pitch);
          o_direct[i] = od != nullptr;
          float* qb = sized(ts.q, static_cast<int64_t>(tg.s.T) * Dp);
          f.q = qd ? qd : qb;
          f.o = od ? od : sized(ts.o, static_cast<int64_t>(tg.s.T) * Dvp);
          if (!qd) {
            f.q_pitch = Dp;
            for (int t = 0; t < tg.s.T; ++t)
              load_row(q, q.token_offset(tg.b, tg.q_token[t], h), D, Dp, qb + static_cast<int64_t>(t) * Dp);
          }
          if (!od) f.o_pitch = Dvp;
        }
        kern.forward(ft, m);
        for (int i = 0; i < m; ++i) {
          const TileGeom& tg = sc.tile[j0 + i].tg;
          const int64_t h = tg.hk * plan.group + gi;
          if (!o_direct[i])
            for (int t = 0; t < tg.s.T; ++t)
              store_row(o, o.token_offset(tg.b, tg.q_token[t], h), Dv, ft[i].o + static_cast<int64_t>(t) * Dvp);
          if (lse.present()) {  // float32; the tile's queries are `step` apart (token_offset divides)
            float* dst = static_cast<float*>(lse.data) + lse.token_offset(tg.b, tg.q_token[0], h);
            const int64_t step = plan.ax[plan.la].dilation * lse.sl[lse.rank - 1];
            for (int t = 0; t < tg.s.T; ++t) dst[t * step] = ft[i].lse[t];
          }
        }
      }
    }
  };
  if (chunk > 1)  // (rings) a range of consecutive lines per worker, then stealing (parallel_ranges)
    parallel_ranges(plan.items(), threads, run_item, chunk, store.least_chunk(tpl) / plan.per_item(),
                    plan.band * tpl / plan.per_item());
  else
    parallel_for(plan.items(), threads, [&](int64_t item, int worker) { run_item(item, -1, worker); });
  return Status::Ok();
}

}  // namespace cpu

namespace detail {

using cpu::guarded;

Status cpu_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  return guarded("forward", [&] { return cpu::forward(p, a, opt); });
}
Status cpu_backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  return guarded("backward", [&] { return cpu::backward(p, a, opt); });
}

}  // namespace detail
}  // namespace fna
