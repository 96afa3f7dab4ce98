// The production CPU backend's backward (the driver's other half; backend.cpp has the forward and
// the kernel-set choice, driver.h what both share).
#include "cpu/driver.h"

#include <atomic>
#include <thread>

namespace fna {
namespace cpu {

using namespace driver;

// Head gi of the KV group of tile ts.tg: points b's Q, dO, O, dQ at the caller's float32 rows or
// at ts's buffers (Q, dO, O loaded), and b's d_lse at the rows' LSE gradients (gathered; null
// when d_lse is absent). Returns whether dQ is written in place (else the caller stores ts's
// buffer). (The LSE is not read: the kernels recompute each row's statistics,
// kernels_impl.h: backward_finish.)
static bool backward_rows(const Plan& plan, const Strided& q, const Strided& d_o, const Strided& o,
                          const Strided& dq, const Strided& d_lse, TileScratch& ts, int64_t gi, int D,
                          int Dv, BackwardTile* b) {
  const TileGeom& tg = ts.tg;
  const int T = tg.s.T, Dp = tg.s.Dp, Dvp = tg.s.Dvp;
  const int64_t h = tg.hk * plan.group + gi;
  float* qb = sized(ts.q, static_cast<int64_t>(T) * Dp);
  float* dob = sized(ts.d_o, static_cast<int64_t>(T) * Dvp);
  float* ob = sized(ts.o, static_cast<int64_t>(T) * Dvp);
  float* dqb = sized(ts.dq, static_cast<int64_t>(T) * Dp);
  const float* qd = direct_rows<const float>(q, D, Dp, plan, tg, h, &b->q_pitch);
  const float* dod = direct_rows<const float>(d_o, Dv, Dvp, plan, tg, h, &b->do_pitch);
  const float* od = direct_rows<const float>(o, Dv, Dvp, plan, tg, h, &b->o_pitch);
  float* dqd = direct_rows<float>(dq, D, Dp, plan, tg, h, &b->dq_pitch);
  b->q = qd ? qd : qb;
  b->d_o = dod ? dod : dob;
  b->o = od ? od : ob;
  b->dq = dqd ? dqd : dqb;
  if (!qd) b->q_pitch = Dp;
  if (!dod) b->do_pitch = Dvp;
  if (!od) b->o_pitch = Dvp;
  if (!dqd) b->dq_pitch = Dp;
  float* dlb = d_lse.present() ? sized(ts.d_lse, T) : nullptr;
  b->d_lse = dlb;
  for (int t = 0; t < T; ++t) {
    const int64_t tok = tg.q_token[t];
    if (dlb) dlb[t] = static_cast<float>(d_lse.load(d_lse.token_offset(tg.b, tok, h)));
    if (!qd) load_row(q, q.token_offset(tg.b, tok, h), D, Dp, qb + static_cast<int64_t>(t) * Dp);
    if (!dod) load_row(d_o, d_o.token_offset(tg.b, tok, h), Dv, Dvp, dob + static_cast<int64_t>(t) * Dvp);
    if (!od) load_row(o, o.token_offset(tg.b, tok, h), Dv, Dvp, ob + static_cast<int64_t>(t) * Dvp);
  }
  return dqd != nullptr;
}

// dK / dV accumulated in per-worker rings (the K / V panel rings' slots: panel id in slot
// id % slots) instead of per-worker copies of every panel: a slot is zeroed when a panel enters
// it and its sums go to the caller's dK / dV when it leaves (or at the end), the first worker's
// stored, later ones added under a per-panel lock. The full copies cost a zeroing pass and a
// summing pass over every touched panel (each ~38 MB per worker at issue 2's problem, through
// memory). float32 problems, not in deterministic mode (whose sums keep worker order).
class AccRing {
 public:
  AccRing(const Plan& plan, const Panels& panels, const Strided& dk, const Strided& dv, int64_t panel_k,
          int64_t panel_v)
      : plan_(plan), panels_(panels), dk_(dk), dv_(dv), panel_k_(panel_k), panel_v_(panel_v),
        state_(static_cast<size_t>(panels.count)) {}
  // Adds the sums of panel id (dK rows k, dV rows v: Dp / Dvp floats apart) to the outputs.
  void flush(int64_t id, const float* k, const float* v) {
    std::atomic<unsigned char>& st = state_[static_cast<size_t>(id)];
    bool first = false;
    for (;;) {  // 0: nothing stored yet, 1: a worker is at it, 2: stored
      unsigned char x = st.load(std::memory_order_acquire);
      if (x != 1 && st.compare_exchange_weak(x, 1, std::memory_order_acquire)) {
        first = x == 0;
        break;
      }
      std::this_thread::yield();
    }
    rows(id, [&](int j, int64_t ok, int64_t ov) {
      put(dk_, ok, static_cast<int>(plan_.p.dim), k + j * (panel_k_ / panels_.pitch), first);
      put(dv_, ov, static_cast<int>(plan_.p.dim_v), v + j * (panel_v_ / panels_.pitch), first);
    });
    st.store(2, std::memory_order_release);
  }
  // Zeros for the panels no worker flushed (keys no query attends). After every flush.
  void zero_rest() {
    std::vector<float> zeros(static_cast<size_t>(std::max(plan_.p.dim, plan_.p.dim_v)), 0.f);
    for (int64_t id = 0; id < panels_.count; ++id)
      if (state_[static_cast<size_t>(id)].load() == 0)
        rows(id, [&](int, int64_t ok, int64_t ov) {
          store_row(dk_, ok, static_cast<int>(plan_.p.dim), zeros.data());
          store_row(dv_, ov, static_cast<int>(plan_.p.dim_v), zeros.data());
        });
  }

 private:
  template <typename F>
  void rows(int64_t id, F&& f) const {  // f(column, dK offset, dV offset) for the panel's columns
    const Problem& p = plan_.p;
    const nbr::Axis& L = plan_.ax[plan_.la];
    const int g = static_cast<int>(id % L.dilation);
    int64_t rest = id / L.dilation;
    const int64_t line = rest % plan_.lines;
    rest /= plan_.lines;
    const int64_t hk = rest % p.heads_kv, b = rest / p.heads_kv;
    const int lg = nbr::group_length(L, g);
    for (int j = 0; j < lg; ++j) {
      const int64_t token = line * p.shape[plan_.la] + static_cast<int64_t>(j) * L.dilation + g;
      f(j, dk_.token_offset(b, token, hk), dv_.token_offset(b, token, hk));
    }
  }
  static void put(const Strided& x, int64_t off, int n, const float* src, bool first) {
    if (first) {
      store_row(x, off, n, src);
      return;
    }
    float* dst = static_cast<float*>(x.data) + off;  // (float32 only)
    for (int e = 0; e < n; ++e) dst[e * x.se] += src[e];
  }
  const Plan& plan_;
  const Panels& panels_;
  const Strided &dk_, &dv_;
  int64_t panel_k_, panel_v_;
  std::vector<std::atomic<unsigned char>> state_;
};

// Tile ts.tg's kernel arguments but the per-head rows (backward_rows): its panel rows (the dK / dV
// accumulator panels of `acc`, zeroed on the worker's first touch: `mine`), additional keys and
// scratch buffers.
// With a ring (AccRing: `ring`, the worker's slot tags `tags`), acc holds slots * panel floats of
// dK, then of dV: a panel entering a slot flushes the slot's previous one and is zeroed.
static void backward_tile_setup(const Plan& plan, const Panels& panels, const PanelStore& store, const float* kt,
                                const float* kr, const float* vt, float* acc, std::vector<char>* mine,
                                AccRing* ring, std::vector<int64_t>* tags, const Strided& add_k,
                                const Strided& add_v, int A, float scale, TileScratch& ts, BackwardTile* b) {
  const TileGeom& tg = ts.tg;
  const TileShape& s = tg.s;
  const int D = s.D, Dp = s.Dp, Dv = s.Dv, Dvp = s.Dvp;
  const int64_t pitch = panels.pitch;
  const int64_t kt_floats = D * pitch, vt_floats = Dv * pitch, panel_k = pitch * Dp, panel_v = pitch * Dvp;
  const int64_t slots = store.slots();
  const int64_t dv_base = (ring ? slots : panels.count) * panel_k;
  for (int r = 0; r < s.R; ++r) {
    const int64_t id = ts.panel_ids[static_cast<size_t>(r)];
    const int64_t at = ring ? id % slots : id;
    if (ring) {
      int64_t& tag = (*tags)[static_cast<size_t>(at)];
      if (tag == id) continue;
      if (tag >= 0) ring->flush(tag, acc + at * panel_k, acc + dv_base + at * panel_v);
      tag = id;
    } else {
      if ((*mine)[static_cast<size_t>(id)]) continue;
      (*mine)[static_cast<size_t>(id)] = 1;
    }
    std::fill(acc + at * panel_k, acc + (at + 1) * panel_k, 0.f);
    std::fill(acc + dv_base + at * panel_v, acc + dv_base + (at + 1) * panel_v, 0.f);
  }
  const int64_t* kl = ts.key_line.data();
  panels.rows_of(tg, kl, kt, kt_floats, 1, &ts.r1, slots);
  panels.rows_of(tg, kl, kr, panel_k, Dp, &ts.r2, slots);
  panels.rows_of(tg, kl, vt, vt_floats, 1, &ts.r3, slots);
  panels.rows_of(tg, kl, acc, panel_k, Dp, &ts.r4, ring ? slots : 0);
  panels.rows_of(tg, kl, acc + dv_base, panel_v, Dvp, &ts.r5, ring ? slots : 0);
  b->s = s;
  b->pitch = panels.pitch;
  b->scale = scale;
  b->scale_log2 = scale * kLog2e;
  b->kt_rows = ts.r1.data();
  b->k_rows = ts.r2.data();
  b->vt_rows = ts.r3.data();
  b->dk_rows = ts.r4.data();
  b->dv_rows = ts.r5.data();
  float* ak = sized(ts.add_k, static_cast<int64_t>(A) * Dp + 1);
  float* av = sized(ts.add_v, static_cast<int64_t>(A) * Dvp + 1);
  gather_additional(add_k, tg.b, tg.hk, A, D, Dp, ak);
  gather_additional(add_v, tg.b, tg.hk, A, Dv, Dvp, av);
  b->add_k = ak;
  b->add_v = av;
  b->d_add_k = sized(ts.d_add_k, static_cast<int64_t>(A) * Dp + 1);
  b->d_add_v = sized(ts.d_add_v, static_cast<int64_t>(A) * Dvp + 1);
  std::fill(b->d_add_k, b->d_add_k + static_cast<int64_t>(A) * Dp, 0.f);
  std::fill(b->d_add_v, b->d_add_v + static_cast<int64_t>(A) * Dvp, 0.f);
  // Per query: R rows of the widest query-group span (cpu/kernels_impl.h, kGroup = 4).
  const int64_t plane = static_cast<int64_t>(s.R) * padded_window(max_count(s) + 4, plan.vw);
  b->delta = sized(ts.delta, s.T);
  b->p = sized(ts.work, s.T * plane);
  b->ds = sized(ts.work2, s.T * plane);
  b->p_add = sized(ts.p_add, static_cast<int64_t>(s.T) * A + 1);
  b->ds_add = sized(ts.ds_add, static_cast<int64_t>(s.T) * A + 1);
}

Status backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  const Kernels* kp = nullptr;
  if (Status st = select_kernels(opt, &kp); !st.ok()) return st;
  const Kernels& kern = *kp;
  const Tuning& tun = opt.tuning;
  // Bands of 8 lines (Plan::band): a line's five panel sets (K^T, K, V^T, dK, dV: ~2.4 MB at
  // 128 columns, D = 64, 13 rows) overflow a 2 MB L2, one column strip of a band's does not.
  // Measured on the 13x13 benchmark: backward 0.88x of line order in the same minute.
  // Even bands: work items of two adjacent lines' same tile (Plan::per_item).
  // Tuning::cpu_band overrides (1: line order; odd: no pairs), for experiments.
  const Plan plan(p, kern.vector_width, tun.cpu_band > 0 ? tun.cpu_band : 8);
  // A query region is native (see backend.cpp): the tasks are the region's tiles, the Q-role
  // tensors (Q, O, dO, dQ, d_lse) region_in_grid views; dK / dV get the region's queries'
  // contributions only (keys that no region query sees: zeros, like keys no query sees).
  const Strided q = region_in_grid(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = region_in_grid(a.o, p, p.dtype);
  const Strided d_o = region_in_grid(a.d_o, p, p.dtype), dq = region_in_grid(a.dq, p, p.dtype);
  const Strided d_lse = region_in_grid(a.d_lse, p, DType::f32, false);
  const Strided add_k = add_view(a.add_k, p), add_v = add_view(a.add_v, p);
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int A = static_cast<int>(p.num_additional);
  const int Dp = round_up(D, plan.vw), Dvp = round_up(Dv, plan.vw);
  const Panels panels(plan, kern);
  // dK / dV: boxes of different tiles overlap, so every thread accumulates into its own float
  // panels (summed at the end) instead of racing on shared ones. Cap the copies' memory.
  const int64_t panel_k = static_cast<int64_t>(panels.pitch) * Dp;
  const int64_t panel_v = static_cast<int64_t>(panels.pitch) * Dvp;
  const int64_t add_floats = p.batch * A * p.heads_kv;
  const BiasTables bias(p, a.rpb, kLog2e);  // (with a bias: a float64 gradient table per worker)
  const int64_t acc_floats = panels.count * (panel_k + panel_v) + add_floats * (Dp + Dvp) +
                             2 * static_cast<int64_t>(bias.data.size());
  int threads = resolve_threads(opt.num_threads, plan.items());
  const int64_t cap = std::max<int64_t>(1, (int64_t(1) << 28) / std::max<int64_t>(acc_floats, 1));
  threads = static_cast<int>(std::min<int64_t>(threads, cap));
  static thread_local std::vector<Floats> tl_panels;  // K^T, K row-major, V^T
  const int64_t kt_floats = static_cast<int64_t>(D) * panels.pitch;
  const int64_t vt_floats = static_cast<int64_t>(Dv) * panels.pitch;
  PanelStore store(plan, panels.count, threads, {kt_floats, panel_k, vt_floats}, &tl_panels, tun.cpu_panels);
  // Cached per calling thread like the panels: fresh pages cost more than the zeroing.
  static thread_local std::vector<Floats> tl_acc;
  std::vector<Floats>& acc = tl_acc;
  if (acc.size() < static_cast<size_t>(threads)) acc.resize(static_cast<size_t>(threads));
  std::vector<char> used(static_cast<size_t>(threads), 0);  // one byte per worker: no sharing
  // Per worker, the panels its tasks have accumulated into: only those are zeroed (on first
  // touch) and summed; a worker's chunks of lines touch a fraction of them.
  std::vector<std::vector<char>> touched(static_cast<size_t>(threads));
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const float scale = static_cast<float>(opt.scale);
  const Strided dk = grid_view(a.dk, p, p.dtype), dv = grid_view(a.dv, p, p.dtype);
  // dK / dV in rings (AccRing) when the panels are in rings (automatic and on alike).
  // Tuning::cpu_acc_rings off: per-worker copies of every panel (as in deterministic mode; tests
  // run both).
  const bool rings = store.slots() > 0 && !opt.deterministic && p.dtype == DType::f32 &&
                     tun.cpu_acc_rings != Switch::off;
  std::unique_ptr<AccRing> ring(rings ? new AccRing(plan, panels, dk, dv, panel_k, panel_v) : nullptr);
  std::vector<std::vector<int64_t>> tags(static_cast<size_t>(threads));
  const int64_t held = rings ? store.slots() : panels.count;  // accumulator panels per worker
  // Layout of one thread's accumulator: dK panels, dV panels, then additional [B][A][Hkv][Dp + Dvp].
  const int64_t dv_base = held * panel_k, add_base = held * (panel_k + panel_v);
  const int64_t worker_floats = add_base + add_floats * (Dp + Dvp);
  const int64_t nt = static_cast<int64_t>(plan.last_tiles.size());
  const int64_t chunk = std::max<int64_t>(1, store.chunk(nt) / plan.per_item());  // in items
  // The relative positional bias: the forward's tables, and per worker a float64 gradient table
  // of every head (summed in worker order at the end).
  std::vector<std::vector<double>> d_bias(bias.empty() ? 0 : static_cast<size_t>(threads));
  auto run_item = [&](int64_t item, int64_t chunk_end, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    if (!bias.empty() && d_bias[static_cast<size_t>(worker)].empty())
      d_bias[static_cast<size_t>(worker)].assign(bias.data.size(), 0.0);  // (the tables' layout)
    Floats& ac = acc[static_cast<size_t>(worker)];
    std::vector<char>& mine = touched[static_cast<size_t>(worker)];
    if (!used[static_cast<size_t>(worker)]) {
      if (static_cast<int64_t>(ac.size()) < worker_floats) ac.resize(static_cast<size_t>(worker_floats));
      std::fill(ac.data() + add_base, ac.data() + worker_floats, 0.f);
      if (rings)
        tags[static_cast<size_t>(worker)].assign(static_cast<size_t>(held), -1);
      else
        mine.assign(static_cast<size_t>(panels.count), 0);
      used[static_cast<size_t>(worker)] = 1;
    }
    bool paired = false;
    const int n = item_geoms(plan, item, store.ring_lines(), D, Dv, A, sc, &paired);
    float* tmp = sized(sc.tmp, static_cast<int64_t>(Panels::kBlock) * std::max(Dp, Dvp));
    float* kt = store.base(0, worker);
    float* kr = store.base(1, worker);
    float* vt = store.base(2, worker);
    plan_hints(plan, item, chunk_end, worker, store, panels, {{&q, D}, {&d_o, Dv}, {&o, Dv}, {&dq, D}},
               {{&k, D}, {&v, Dv}}, D, Dv, A, sc);
    // Tiles [j0, j0 + m): both in one call when paired, else one after the other.
    for (int j0 = 0; j0 < n; j0 += paired ? 2 : 1) {
      const int m = paired ? 2 : 1;
      BackwardTile bt[2];
      for (int j = j0; j < j0 + m; ++j)
        ensure_box(store, worker, panels, sc.tile[j].tg, sc.tile[j], [&](int64_t id, int64_t at) {
          panels.convert(k, D, Dp, id, kt + at * kt_floats, kr + at * panel_k, tmp);
          panels.convert(v, Dv, Dvp, id, vt + at * vt_floats, nullptr, tmp);
        });
      for (int i = 0; i < m; ++i)
        backward_tile_setup(plan, panels, store, kt, kr, vt, ac.data(), &mine, ring.get(),
                            &tags[static_cast<size_t>(worker)], add_k, add_v, A, scale, sc.tile[j0 + i], &bt[i]);
      if (j0 == 0) {
        bt[0].prefetch.rows = sc.hints.rows.data();
        bt[0].prefetch.n = static_cast<int>(sc.hints.rows.size());
        bt[0].prefetch.lines = sc.hints.lines;
      }
      for (int64_t gi = 0; gi < plan.group; ++gi) {
        bool dq_direct[2] = {};
        for (int i = 0; i < m; ++i) {
          dq_direct[i] = backward_rows(plan, q, d_o, o, dq, d_lse, sc.tile[j0 + i], gi, D, Dv, &bt[i]);
          const TileGeom& tg = sc.tile[j0 + i].tg;
          const int64_t h = tg.hk * plan.group + gi;
          bt[i].bias = tile_bias(bias, tg, h);
          if (!bias.empty())
            bt[i].d_bias = d_bias[static_cast<size_t>(worker)].data() + h * bias.stride + bias.pad;
        }
        kern.backward(bt, m);
        for (int i = 0; i < m; ++i) {
          const TileGeom& tg = sc.tile[j0 + i].tg;
          const int64_t h = tg.hk * plan.group + gi;
          if (!dq_direct[i])
            for (int t = 0; t < tg.s.T; ++t)
              store_row(dq, dq.token_offset(tg.b, tg.q_token[t], h), D, bt[i].dq + static_cast<int64_t>(t) * Dp);
        }
      }
      for (int i = 0; i < m; ++i) {
        const TileGeom& tg = sc.tile[j0 + i].tg;
        for (int a = 0; a < A; ++a) {
          float* dst = ac.data() + add_base + ((tg.b * A + a) * p.heads_kv + tg.hk) * (Dp + Dvp);
          for (int e = 0; e < D; ++e) dst[e] += bt[i].d_add_k[static_cast<int64_t>(a) * Dp + e];
          for (int e = 0; e < Dv; ++e) dst[Dp + e] += bt[i].d_add_v[static_cast<int64_t>(a) * Dvp + e];
        }
      }
    }
  };
  if (chunk > 1)  // (rings) a range of consecutive lines per worker, then stealing (parallel_ranges)
    parallel_ranges(plan.items(), threads, run_item, chunk,
                    store.least_chunk(nt) / plan.per_item(), plan.band * nt / plan.per_item(),
                    opt.deterministic);
  else
    parallel_for(plan.items(), threads, [&](int64_t item, int worker) { run_item(item, -1, worker); }, 1,
                 opt.deterministic);
  // Sum the per-thread accumulators, in worker order, and store: grid keys panel by panel, then
  // additional keys. (Deterministic mode fixes which worker ran which task, so these sums repeat
  // bitwise.) With rings: what the rings still hold, then zeros for the panels nobody touched.
  const Strided dak = add_view(a.d_add_k, p), dav = add_view(a.d_add_v, p);
  const nbr::Axis& L = plan.ax[plan.la];
  const int store_threads = resolve_threads(opt.num_threads, panels.count);
  if (rings) {
    parallel_for(threads, store_threads, [&](int64_t w, int) {
      if (!used[static_cast<size_t>(w)]) return;
      const float* ac = acc[static_cast<size_t>(w)].data();
      const std::vector<int64_t>& tag = tags[static_cast<size_t>(w)];
      for (int64_t at = 0; at < held; ++at)
        if (tag[static_cast<size_t>(at)] >= 0) ring->flush(tag[static_cast<size_t>(at)], ac + at * panel_k, ac + dv_base + at * panel_v);
    });
    ring->zero_rest();
  } else
  parallel_for(panels.count, store_threads, [&](int64_t it, int) {
    const int64_t hk = it % p.heads_kv;  // heads fastest: they share cache lines of dK / dV
    int64_t rest = it / p.heads_kv;
    const int g = static_cast<int>(rest % L.dilation);
    rest /= L.dilation;
    const int64_t line = rest % plan.lines, b = rest / plan.lines;
    const int64_t id = panels.id(b, hk, line, g);
    const int lg = nbr::group_length(L, g);
    std::vector<const float*> from;  // the accumulators of the workers that touched the panel
    for (int w = 0; w < threads; ++w)
      if (used[static_cast<size_t>(w)] && touched[static_cast<size_t>(w)][static_cast<size_t>(id)])
        from.push_back(acc[static_cast<size_t>(w)].data());
    std::vector<float> sk(static_cast<size_t>(Dp)), sv(static_cast<size_t>(Dvp));
    for (int j = 0; j < lg; ++j) {
      const int64_t token = line * p.shape[plan.la] + static_cast<int64_t>(j) * L.dilation + g;
      const int64_t ok = id * panel_k + static_cast<int64_t>(j) * Dp;
      const int64_t ov = dv_base + id * panel_v + static_cast<int64_t>(j) * Dvp;
      if (from.size() == 1) {  // (most panels: one worker's chunks hold all its query lines)
        store_row(dk, dk.token_offset(b, token, hk), D, from[0] + ok);
        store_row(dv, dv.token_offset(b, token, hk), Dv, from[0] + ov);
        continue;
      }
      std::fill(sk.begin(), sk.end(), 0.f);
      std::fill(sv.begin(), sv.end(), 0.f);
      for (const float* ac : from) {
        for (int e = 0; e < D; ++e) sk[static_cast<size_t>(e)] += ac[ok + e];
        for (int e = 0; e < Dv; ++e) sv[static_cast<size_t>(e)] += ac[ov + e];
      }
      store_row(dk, dk.token_offset(b, token, hk), D, sk.data());
      store_row(dv, dv.token_offset(b, token, hk), Dv, sv.data());
    }
  });
  for (int64_t i = 0; i < add_floats; ++i) {
    std::vector<float> sum(static_cast<size_t>(Dp + Dvp), 0.f);
    for (int w = 0; w < threads; ++w) {
      if (!used[static_cast<size_t>(w)]) continue;
      const Floats& ac = acc[static_cast<size_t>(w)];
      const float* src = ac.data() + add_base + i * (Dp + Dvp);
      for (int e = 0; e < Dp + Dvp; ++e) sum[static_cast<size_t>(e)] += src[e];
    }
    const int64_t hk = i % p.heads_kv, n = (i / p.heads_kv) % A, b = i / (p.heads_kv * A);
    store_row(dak, dak.token_offset(b, n, hk), D, sum.data());
    store_row(dav, dav.token_offset(b, n, hk), Dv, sum.data() + Dp);
  }
  if (!bias.empty())  // d_rpb: the workers' tables summed in worker order
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t e = 0; e < bias.n; ++e) {
        double sum = 0;
        for (const std::vector<double>& w : d_bias)
          if (!w.empty()) sum += w[static_cast<size_t>(h * bias.stride + bias.pad + e)];
        static_cast<float*>(a.d_rpb.data)[bias_offset(p, a.d_rpb, h * bias.n + e)] = static_cast<float>(sum);
      }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace fna
