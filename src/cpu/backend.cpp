// The production CPU backend, fused forward and backward: the driver. It splits the problem into
// tiles of queries along the last axis (see cpu/tile.h), converts the key / value lines the tiles
// read into float panels (dtype and strides; PanelStore), and runs the ISA-specific tile kernels.
// Only the neighborhood is visited: the box comes from nbr::window / nbr::tile_union.
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

// FNA_CPU_KERNELS=generic|avx2|avx512 forces a kernel set (tests run every one the CPU has).
const Kernels& best_kernels() {
  const char* env = std::getenv("FNA_CPU_KERNELS");
  const std::string want = env ? env : "";
  if (want == "generic") return generic_kernels();
  if (want == "avx2" && avx2_kernels()) return *avx2_kernels();
  if ((want.empty() || want == "avx512") && avx512_kernels()) return *avx512_kernels();
  if (avx2_kernels()) return *avx2_kernels();
  return generic_kernels();
}

using namespace driver;

Status forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const Kernels& kern = best_kernels();
  const Plan plan(p, kern.vector_width);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = grid_view(a.o, p, p.dtype);
  const Strided lse = grid_view(a.lse, p, DType::f32, false);
  const Strided add_k = add_view(a.add_k, p), add_v = add_view(a.add_v, p);
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int A = static_cast<int>(p.num_additional);
  const int Dp = round_up(D, plan.vw), Dvp = round_up(Dv, plan.vw);
  const int threads = resolve_threads(opt.num_threads, plan.tasks());
  const Panels panels(plan, kern);
  // Panels are cached per calling thread: re-touching fresh pages on every call costs as much as
  // the conversion itself.
  // Only the padding needs zeros (Panels::convert writes it), so the buffers are not refilled.
  static thread_local std::vector<Floats> tl_panels;
  const int64_t kt_floats = static_cast<int64_t>(D) * panels.pitch;  // K^T, then V row-major
  const int64_t v_floats = static_cast<int64_t>(panels.pitch) * Dvp;
  PanelStore store(plan, panels.count, threads, {kt_floats, v_floats}, &tl_panels);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const float scale_log2 = static_cast<float>(opt.scale) * kLog2e;
  const int64_t chunk = store.chunk(static_cast<int64_t>(plan.last_tiles.size()));
  parallel_for(plan.tasks(), threads, [&](int64_t task, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    const TileGeom& tg = task_geom(plan, task, D, Dv, A, sc);
    const TileShape& s = tg.s;
    key_lines(tg, p.shape[plan.la], &sc.key_line);
    float* tmp = sized(sc.tmp, static_cast<int64_t>(Panels::kBlock) * std::max(Dp, Dvp));
    float* kt = store.base(0, worker);
    float* vr = store.base(1, worker);
    ensure_box(store, worker, panels, tg, sc, [&](int64_t id, int64_t at) {
      panels.convert(k, D, Dp, id, kt + at * kt_floats, nullptr, tmp);
      panels.convert(v, Dv, Dvp, id, nullptr, vr + at * v_floats, tmp);
    });
    plan_hints(plan, task, chunk, worker, store, panels, {{&q, D}, {&o, Dv}}, {{&k, D}, {&v, Dv}}, D,
               Dv, A, sc);
    panels.rows_of(tg, sc.key_line.data(), static_cast<const float*>(kt), kt_floats, 1, &sc.r1,
                   store.slots());
    panels.rows_of(tg, sc.key_line.data(), static_cast<const float*>(vr), v_floats, Dvp, &sc.r2,
                   store.slots());
    ForwardTile ft;
    ft.s = s;
    ft.prefetch.rows = sc.hints.rows.data();
    ft.prefetch.n = static_cast<int>(sc.hints.rows.size());
    ft.prefetch.lines = sc.hints.lines;
    ft.pitch = panels.pitch;
    ft.scale_log2 = scale_log2;
    ft.kt_rows = sc.r1.data();
    ft.v_rows = sc.r2.data();
    float* ak = sized(sc.add_k, static_cast<int64_t>(A) * Dp + 1);
    float* av = sized(sc.add_v, static_cast<int64_t>(A) * Dvp + 1);
    gather_additional(add_k, tg.b, tg.hk, A, D, Dp, ak);
    gather_additional(add_v, tg.b, tg.hk, A, Dv, Dvp, av);
    float* qb = sized(sc.q, static_cast<int64_t>(s.T) * Dp);
    float* ob = sized(sc.o, static_cast<int64_t>(s.T) * Dvp);
    float* lb = sized(sc.lse, s.T);
    ft.add_k = ak;
    ft.add_v = av;
    ft.lse = lb;
    // Scores of the whole tile (cpu/kernels_impl.h): T queries x R rows x the widest group span.
    ft.scratch = sized(sc.work, static_cast<int64_t>(s.T) * s.R * padded_window(max_count(s) + 4, plan.vw) +
                                    static_cast<int64_t>(s.T) * (A + 1));
    for (int64_t gi = 0; gi < plan.group; ++gi) {
      const int64_t h = tg.hk * plan.group + gi;
      const float* qd = direct_rows<const float>(q, D, Dp, plan, tg, h, &ft.q_pitch);
      float* od = direct_rows<float>(o, Dv, Dvp, plan, tg, h, &ft.o_pitch);
      ft.q = qd ? qd : qb;
      ft.o = od ? od : ob;
      if (!qd) {
        ft.q_pitch = Dp;
        for (int t = 0; t < s.T; ++t)
          load_row(q, q.token_offset(tg.b, tg.q_token[t], h), D, Dp, qb + static_cast<int64_t>(t) * Dp);
      }
      if (!od) ft.o_pitch = Dvp;
      kern.forward(ft);
      if (!od)
        for (int t = 0; t < s.T; ++t)
          store_row(o, o.token_offset(tg.b, tg.q_token[t], h), Dv, ob + static_cast<int64_t>(t) * Dvp);
      if (lse.present()) {  // float32; the tile's queries are `step` apart (token_offset divides)
        float* dst = static_cast<float*>(lse.data) + lse.token_offset(tg.b, tg.q_token[0], h);
        const int64_t step = plan.ax[plan.la].dilation * lse.sl[lse.rank - 1];
        for (int t = 0; t < s.T; ++t) dst[t * step] = lb[t];
      }
    }
  }, chunk);
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
