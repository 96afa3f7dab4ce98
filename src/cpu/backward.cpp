// The production CPU backend's backward (the driver's other half; backend.cpp has the forward and
// the kernel-set choice, driver.h what both share).
#include "cpu/driver.h"

namespace fna {
namespace cpu {

using namespace driver;

Status backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  const Kernels& kern = best_kernels();
  // Bands of 8 lines (Plan::band): a line's five panel sets (K^T, K, V^T, dK, dV: ~2.4 MB at
  // 128 columns, D = 64, 13 rows) overflow a 2 MB L2, one column strip of a band's does not.
  // Measured on the 13x13 benchmark: backward 0.88x of line order in the same minute.
  // FNA_CPU_BAND=n overrides (1: line order), for experiments.
  const char* band_env = std::getenv("FNA_CPU_BAND");
  const Plan plan(p, kern.vector_width, band_env ? std::atoi(band_env) : 8);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = grid_view(a.o, p, p.dtype);
  const Strided d_o = grid_view(a.d_o, p, p.dtype), dq = grid_view(a.dq, p, p.dtype);
  const Strided lse = grid_view(a.lse, p, DType::f32, false);
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
  const int64_t acc_floats = panels.count * (panel_k + panel_v) + add_floats * (Dp + Dvp);
  int threads = resolve_threads(opt.num_threads, plan.tasks());
  const int64_t cap = std::max<int64_t>(1, (int64_t(1) << 28) / std::max<int64_t>(acc_floats, 1));
  threads = static_cast<int>(std::min<int64_t>(threads, cap));
  static thread_local std::vector<Floats> tl_panels;  // K^T, K row-major, V^T
  const int64_t kt_floats = static_cast<int64_t>(D) * panels.pitch;
  const int64_t vt_floats = static_cast<int64_t>(Dv) * panels.pitch;
  PanelStore store(plan, panels.count, threads, {kt_floats, panel_k, vt_floats}, &tl_panels);
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
  // Layout of one thread's accumulator: dK panels, dV panels, then additional [B][A][Hkv][Dp + Dvp].
  const int64_t dv_base = panels.count * panel_k, add_base = panels.count * (panel_k + panel_v);
  const int64_t chunk = store.chunk(static_cast<int64_t>(plan.last_tiles.size()));
  parallel_for(plan.tasks(), threads, [&](int64_t task, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    Floats& ac = acc[static_cast<size_t>(worker)];
    std::vector<char>& mine = touched[static_cast<size_t>(worker)];
    if (!used[static_cast<size_t>(worker)]) {
      if (static_cast<int64_t>(ac.size()) < acc_floats) ac.resize(static_cast<size_t>(acc_floats));
      std::fill(ac.data() + add_base, ac.data() + acc_floats, 0.f);
      mine.assign(static_cast<size_t>(panels.count), 0);
      used[static_cast<size_t>(worker)] = 1;
    }
    const TileGeom& tg = task_geom(plan, task, D, Dv, A, sc);
    const TileShape& s = tg.s;
    // Per query: R rows of the widest query-group span (cpu/kernels_impl.h, kGroup = 4).
    const int64_t plane = static_cast<int64_t>(s.R) * padded_window(max_count(s) + 4, plan.vw);
    key_lines(tg, p.shape[plan.la], &sc.key_line);
    const int64_t* kl = sc.key_line.data();
    float* tmp = sized(sc.tmp, static_cast<int64_t>(Panels::kBlock) * std::max(Dp, Dvp));
    float* kt = store.base(0, worker);
    float* kr = store.base(1, worker);
    float* vt = store.base(2, worker);
    ensure_box(store, worker, panels, tg, sc, [&](int64_t id, int64_t at) {
      panels.convert(k, D, Dp, id, kt + at * kt_floats, kr + at * panel_k, tmp);
      panels.convert(v, Dv, Dvp, id, vt + at * vt_floats, nullptr, tmp);
    });
    plan_hints(plan, task, chunk, worker, store, panels, {{&q, D}, {&d_o, Dv}, {&o, Dv}, {&dq, D}},
               {{&k, D}, {&v, Dv}}, D, Dv, A, sc);
    for (int r = 0; r < s.R; ++r) {
      const int64_t id = sc.panel_ids[static_cast<size_t>(r)];
      if (!mine[static_cast<size_t>(id)]) {
        std::fill(ac.data() + id * panel_k, ac.data() + (id + 1) * panel_k, 0.f);
        std::fill(ac.data() + dv_base + id * panel_v, ac.data() + dv_base + (id + 1) * panel_v, 0.f);
        mine[static_cast<size_t>(id)] = 1;
      }
    }
    const int64_t slots = store.slots();
    panels.rows_of(tg, kl, static_cast<const float*>(kt), kt_floats, 1, &sc.r1, slots);
    panels.rows_of(tg, kl, static_cast<const float*>(kr), panel_k, Dp, &sc.r2, slots);
    panels.rows_of(tg, kl, static_cast<const float*>(vt), vt_floats, 1, &sc.r3, slots);
    panels.rows_of(tg, kl, ac.data(), panel_k, Dp, &sc.r4);
    panels.rows_of(tg, kl, ac.data() + dv_base, panel_v, Dvp, &sc.r5);
    BackwardTile bt;
    bt.s = s;
    bt.prefetch.rows = sc.hints.rows.data();
    bt.prefetch.n = static_cast<int>(sc.hints.rows.size());
    bt.prefetch.lines = sc.hints.lines;
    bt.pitch = panels.pitch;
    bt.scale = scale;
    bt.scale_log2 = scale * kLog2e;
    bt.kt_rows = sc.r1.data();
    bt.k_rows = sc.r2.data();
    bt.vt_rows = sc.r3.data();
    bt.dk_rows = sc.r4.data();
    bt.dv_rows = sc.r5.data();
    float* ak = sized(sc.add_k, static_cast<int64_t>(A) * Dp + 1);
    float* av = sized(sc.add_v, static_cast<int64_t>(A) * Dvp + 1);
    gather_additional(add_k, tg.b, tg.hk, A, D, Dp, ak);
    gather_additional(add_v, tg.b, tg.hk, A, Dv, Dvp, av);
    float* dak = sized(sc.d_add_k, static_cast<int64_t>(A) * Dp + 1);
    float* dav = sized(sc.d_add_v, static_cast<int64_t>(A) * Dvp + 1);
    std::fill(dak, dak + A * Dp, 0.f);
    std::fill(dav, dav + A * Dvp, 0.f);
    float* qb = sized(sc.q, static_cast<int64_t>(s.T) * Dp);
    float* dob = sized(sc.d_o, static_cast<int64_t>(s.T) * Dvp);
    float* ob = sized(sc.o, static_cast<int64_t>(s.T) * Dvp);
    float* lb = sized(sc.lse, s.T);
    float* db = sized(sc.delta, s.T);
    float* dqb = sized(sc.dq, static_cast<int64_t>(s.T) * Dp);
    bt.delta = db;
    bt.lse2 = lb;
    bt.add_k = ak;
    bt.add_v = av;
    bt.d_add_k = dak;
    bt.d_add_v = dav;
    bt.p = sized(sc.work, s.T * plane);
    bt.ds = sized(sc.work2, s.T * plane);
    bt.p_add = sized(sc.p_add, static_cast<int64_t>(s.T) * A + 1);
    bt.ds_add = sized(sc.ds_add, static_cast<int64_t>(s.T) * A + 1);
    for (int64_t gi = 0; gi < plan.group; ++gi) {
      const int64_t h = tg.hk * plan.group + gi;
      int o_pitch = Dvp;
      const float* qd = direct_rows<const float>(q, D, Dp, plan, tg, h, &bt.q_pitch);
      const float* dod = direct_rows<const float>(d_o, Dv, Dvp, plan, tg, h, &bt.do_pitch);
      const float* od = direct_rows<const float>(o, Dv, Dvp, plan, tg, h, &o_pitch);
      float* dqd = direct_rows<float>(dq, D, Dp, plan, tg, h, &bt.dq_pitch);
      bt.q = qd ? qd : qb;
      bt.d_o = dod ? dod : dob;
      bt.dq = dqd ? dqd : dqb;
      if (!qd) bt.q_pitch = Dp;
      if (!dod) bt.do_pitch = Dvp;
      if (!dqd) bt.dq_pitch = Dp;
      const float* lse_row = static_cast<const float*>(lse.data) + lse.token_offset(tg.b, tg.q_token[0], h);
      const int64_t lse_step = plan.ax[plan.la].dilation * lse.sl[lse.rank - 1];
      for (int t = 0; t < s.T; ++t) {
        const int64_t tok = tg.q_token[t];
        if (!qd) load_row(q, q.token_offset(tg.b, tok, h), D, Dp, qb + static_cast<int64_t>(t) * Dp);
        if (!dod) load_row(d_o, d_o.token_offset(tg.b, tok, h), Dv, Dvp, dob + static_cast<int64_t>(t) * Dvp);
        if (!od) load_row(o, o.token_offset(tg.b, tok, h), Dv, Dvp, ob + static_cast<int64_t>(t) * Dvp);
        // rowsum(dO * O) in double, in four independent sums (one chain would wait on each add;
        // sum k takes the elements e = k mod 4). Named locals: an array indexed by e & 3 went
        // through memory, one store-to-load round trip per element.
        double d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        const float* dor = bt.d_o + static_cast<int64_t>(t) * bt.do_pitch;
        const float* orow = (od ? od : ob) + static_cast<int64_t>(t) * o_pitch;
        int e = 0;
        for (; e + 4 <= Dv; e += 4) {
          d0 += static_cast<double>(dor[e]) * orow[e];
          d1 += static_cast<double>(dor[e + 1]) * orow[e + 1];
          d2 += static_cast<double>(dor[e + 2]) * orow[e + 2];
          d3 += static_cast<double>(dor[e + 3]) * orow[e + 3];
        }
        if (e < Dv) d0 += static_cast<double>(dor[e]) * orow[e];
        if (e + 1 < Dv) d1 += static_cast<double>(dor[e + 1]) * orow[e + 1];
        if (e + 2 < Dv) d2 += static_cast<double>(dor[e + 2]) * orow[e + 2];
        db[t] = static_cast<float>((d0 + d1) + (d2 + d3));
        lb[t] = lse_row[t * lse_step] * kLog2e;
      }
      kern.backward(bt);
      if (!dqd)
        for (int t = 0; t < s.T; ++t)
          store_row(dq, dq.token_offset(tg.b, tg.q_token[t], h), D, dqb + static_cast<int64_t>(t) * Dp);
    }
    for (int n = 0; n < A; ++n) {
      float* dst = ac.data() + add_base + ((tg.b * A + n) * p.heads_kv + tg.hk) * (Dp + Dvp);
      for (int e = 0; e < D; ++e) dst[e] += dak[n * Dp + e];
      for (int e = 0; e < Dv; ++e) dst[Dp + e] += dav[n * Dvp + e];
    }
  }, chunk, opt.deterministic);
  // Sum the per-thread accumulators, in worker order, and store: grid keys panel by panel, then
  // additional keys. (Deterministic mode fixes which worker ran which task, so these sums repeat
  // bitwise.)
  const Strided dk = grid_view(a.dk, p, p.dtype), dv = grid_view(a.dv, p, p.dtype);
  const Strided dak = add_view(a.d_add_k, p), dav = add_view(a.d_add_v, p);
  const nbr::Axis& L = plan.ax[plan.la];
  const int store_threads = resolve_threads(opt.num_threads, panels.count);
  parallel_for(panels.count, store_threads, [&](int64_t it, int) {
    const int64_t hk = it % p.heads_kv;  // heads fastest: they share cache lines of dK / dV
    int64_t rest = it / p.heads_kv;
    const int g = static_cast<int>(rest % L.dilation);
    rest /= L.dilation;
    const int64_t line = rest % plan.lines, b = rest / plan.lines;
    const int64_t id = panels.id(b, hk, line, g);
    const int lg = nbr::group_length(L, g);
    std::vector<float> sk(static_cast<size_t>(Dp)), sv(static_cast<size_t>(Dvp));
    for (int j = 0; j < lg; ++j) {
      std::fill(sk.begin(), sk.end(), 0.f);
      std::fill(sv.begin(), sv.end(), 0.f);
      for (int w = 0; w < threads; ++w) {
        if (!used[static_cast<size_t>(w)] || !touched[static_cast<size_t>(w)][static_cast<size_t>(id)]) continue;
        const Floats& ac = acc[static_cast<size_t>(w)];
        const float* srck = ac.data() + id * panel_k + static_cast<int64_t>(j) * Dp;
        const float* srcv = ac.data() + dv_base + id * panel_v + static_cast<int64_t>(j) * Dvp;
        for (int e = 0; e < D; ++e) sk[static_cast<size_t>(e)] += srck[e];
        for (int e = 0; e < Dv; ++e) sv[static_cast<size_t>(e)] += srcv[e];
      }
      const int64_t token = line * p.shape[plan.la] + static_cast<int64_t>(j) * L.dilation + g;
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
  return Status::Ok();
}

}  // namespace cpu
}  // namespace fna
