// Internal to the CPU backend: the driver's per-worker scratch and task helpers shared by the
// forward (backend.cpp) and the backward (backward.cpp); the plan and tile geometry are in
// cpu/plan.h, the K / V panels in cpu/panels.h.
#pragma once

#include "cpu/panels.h"

namespace fna {
namespace cpu {
namespace driver {

// Per worker: the state of each tile of a work item (see Plan::per_item), and what they share.
struct TileScratch {
  Floats add_k, add_v, q, o, d_o, dq, work, work2;
  std::vector<float> lse, delta, d_lse;
  std::vector<float> d_add_k, d_add_v, p_add, ds_add;
  std::vector<int64_t> key_line, panel_ids;
  std::vector<const float*> r1, r2, r3;
  std::vector<float*> r4, r5;
  TileGeom tg, next;  // this item's geometry; the next item's, built ahead by plan_hints
  int64_t next_task = -1;
};
struct Scratch {
  std::vector<float> tmp;  // Panels::convert's block
  // Prefetch hints (tile.h: Prefetch): this item's list; the source lines of the panels the
  // next band converts, shared out over the tasks of the band starting at task `ahead_first`.
  HintRows hints, ahead;
  int64_t ahead_first = -1;
  TileScratch tile[2];
};

template <typename V>
typename V::value_type* sized(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// ForwardArgs::rpb (float32 [H, 2 K_a - 1 ..], any strides) as dense tables, one per head, times
// `mult` (log2(e): the kernels' scores are base 2); empty without a bias. Each head's `n` entries
// sit between `pad` zeros on either side: the kernels add whole vectors of a query group's span,
// whose lanes outside a query's own window read up to a span (< K_last + 4 + 2 vectors) beyond
// the query's entries (kernels_impl.h: tile_add_bias).
struct BiasTables {
  std::vector<float> data;
  int64_t n = 0, pad = 0, stride = 0;  // entries per head, zeros on either side, floats per head
  bool empty() const { return data.empty(); }
  const float* head(int64_t h) const { return data.data() + h * stride + pad; }
  BiasTables(const Problem& p, const TensorRef& rpb, float mult) {
    n = bias_elements(p) / p.heads;
    pad = p.kernel_size[p.rank - 1] + 64;
    stride = n + 2 * pad;
    if (!rpb.data) return;
    data.assign(static_cast<size_t>(stride * p.heads), 0.f);
    const float* src = static_cast<const float*>(rpb.data);
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t e = 0; e < n; ++e)
        data[static_cast<size_t>(h * stride + pad + e)] = src[bias_offset(p, rpb, h * n + e)] * mult;
  }
};

// The bias arguments of a tile of head h (TileBias; none without tables).
inline TileBias tile_bias(const BiasTables& tables, const TileGeom& tg, int64_t h) {
  TileBias b;
  if (tables.empty()) return b;
  b.table = tables.head(h);
  b.row = tg.bias_row.data();
  b.col = tg.bias_col;
  return b;
}

inline int max_count(const TileShape& s) {
  int w = 0;
  for (int t = 0; t < s.T; ++t) w = s.col_count[t] > w ? s.col_count[t] : w;
  return w;
}

inline void key_lines(const TileGeom& tg, int64_t last_len, std::vector<int64_t>* out) {
  out->resize(tg.row_token.size());
  for (size_t r = 0; r < tg.row_token.size(); ++r) (*out)[r] = tg.row_token[r] / last_len;
}

// Makes the panels of the tile's box rows ready (converting them with convert(id) as needed);
// `ahead` is the panel of the line after the box's last row, which the next line's tiles need.
// Fills ts.key_line and ts.panel_ids.
template <typename Convert>
void ensure_box(PanelStore& store, int worker, const Panels& panels, const TileGeom& tg, TileScratch& ts,
                Convert&& convert) {
  const int R = tg.s.R;
  key_lines(tg, panels.pl.p.shape[panels.pl.la], &ts.key_line);
  ts.panel_ids.resize(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    ts.panel_ids[static_cast<size_t>(r)] = panels.id_of(tg, ts.key_line[static_cast<size_t>(r)]);
  const int64_t next = ts.key_line[static_cast<size_t>(R - 1)] + 1;
  const int64_t ahead = next < panels.pl.lines ? panels.id_of(tg, next) : -1;
  store.ensure(worker, ts.panel_ids.data(), R, ahead, convert);
}

// The caller's float32 rows of a tile's queries in tensor x (head h), read or written in place:
// query t's row at the result + t * *pitch. Null when x needs a conversion: another dtype, strided
// elements, a padded row (n < n_pad: the kernels read and write n_pad floats), or rows that
// overlap.
template <typename T>
T* direct_rows(const Strided& x, int n, int n_pad, const Plan& plan, const TileGeom& tg, int64_t h,
               int* pitch) {
  if (!x.present() || x.dtype != DType::f32 || x.se != 1 || n != n_pad) return nullptr;
  const int64_t step = plan.ax[plan.la].dilation * x.sl[x.rank - 1];
  if (step < n && tg.s.T > 1) return nullptr;
  if (step > (int64_t(1) << 30)) return nullptr;
  *pitch = static_cast<int>(step);
  return static_cast<T*>(x.data) + x.token_offset(tg.b, tg.q_token[0], h);
}

// The task's geometry, built when the previous item prefetched it (ts.next) or now.
inline TileGeom& task_geom(const Plan& plan, int64_t task, int D, int Dv, int A, TileScratch& ts) {
  if (ts.next_task == task) {
    std::swap(ts.tg, ts.next);
    ts.next_task = -1;
  } else {
    ts.tg.build(plan, task, D, Dv, A);
  }
  return ts.tg;
}

// The geometries of work item `item`'s tasks (Plan::per_item) in sc.tile[k].tg; returns how many
// tasks it has. *paired: whether one kernel call takes them: two tiles of one shape whose boxes'
// panels are all readable at once (with rings: their key rows within `ring_lines` consecutive
// lines of the flattened batch, KV head and line index, the panels of distinct ring slots).
inline int item_geoms(const Plan& plan, int64_t item, int64_t ring_lines, int D, int Dv, int A, Scratch& sc,
                      bool* paired) {
  const int64_t t0 = item * plan.per_item();
  const int n = static_cast<int>(std::min<int64_t>(plan.per_item(), plan.tasks() - t0));
  for (int k = 0; k < n; ++k) task_geom(plan, t0 + k, D, Dv, A, sc.tile[k]);
  *paired = false;
  if (n == 2) {
    const TileShape &a = sc.tile[0].tg.s, &b = sc.tile[1].tg.s;
    *paired = a.T == b.T && a.R == b.R && a.M == b.M;
    for (int t = 0; t < a.T && *paired; ++t)
      *paired = a.col_begin[t] == b.col_begin[t] && a.col_count[t] == b.col_count[t];
    if (*paired && plan.strips) {  // the same tile and head, lines < ring_lines apart
      const TileGeom &ga = sc.tile[0].tg, &gb = sc.tile[1].tg;
      *paired = ga.b == gb.b && ga.tile == gb.tile && ga.hk == gb.hk;
      if (*paired && ring_lines > 0) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (int k = 0; k < 2; ++k)
          for (int64_t tok : sc.tile[k].tg.row_token) {
            lo = std::min(lo, tok / plan.p.shape[plan.la]);
            hi = std::max(hi, tok / plan.p.shape[plan.la]);
          }
        *paired = hi - lo < ring_lines;
      }
    } else if (*paired && ring_lines > 0) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int k = 0; k < 2; ++k) {
        const TileGeom& tg = sc.tile[k].tg;
        const int64_t base = (tg.b * plan.p.heads_kv + tg.hk) * plan.lines;
        for (int64_t tok : tg.row_token) {
          lo = std::min(lo, base + tok / plan.p.shape[plan.la]);
          hi = std::max(hi, base + tok / plan.p.shape[plan.la]);
        }
      }
      *paired = hi - lo < ring_lines;
    }
  }
  return n;
}

// Fills sc.hints for work item `item` of a range of consecutive items ending at `chunk_end`
// (exclusive; one worker runs them in order; < 0: items are not chunked, no hints): the `rows`
// tensors' lines of the next item's query tokens (every head of the KV group), and, with rings,
// this item's share of the source lines of the panels that the next band's tasks will convert
// (those the worker's ring does not hold), of every tensor in `panel_src`.
inline void plan_hints(const Plan& plan, int64_t item, int64_t chunk_end, int worker, const PanelStore& store,
                       const Panels& panels, const std::vector<std::pair<const Strided*, int>>& rows,
                       const std::vector<std::pair<const Strided*, int>>& panel_src, int D, int Dv, int A,
                       Scratch& sc) {
  sc.hints.clear();
  if (chunk_end < 0) return;
  const Problem& p = plan.p;
  const nbr::Axis& L = plan.ax[plan.la];
  const int per = plan.per_item();
  // (Plan::strips with rings: the next band's query rows, every head, are listed with its panels
  // below instead: the band's items read and write the same token rows head after head.)
  const bool band_rows = plan.strips && store.slots() > 0;
  if (item + 1 < chunk_end && !band_rows)
    for (int k = 0; k < per && (item + 1) * per + k < plan.tasks(); ++k) {
      TileScratch& ts = sc.tile[k];
      const TileGeom& nx = ts.next;
      ts.next_task = (item + 1) * per + k;
      ts.next.build(plan, ts.next_task, D, Dv, A);
      for (int64_t gi = 0; gi < plan.group; ++gi)
        for (const auto& r : rows) {  // a tile's queries: consecutive in the group, dilation apart
          const Strided& x = *r.first;
          if (x.present())
            sc.hints.add(x, x.token_offset(nx.b, nx.q_token[0], nx.hk * plan.group + gi),
                         L.dilation * x.sl[x.rank - 1], nx.s.T, r.second);
        }
    }
  if (store.slots() == 0) return;
  // Bands (Plan::band) of band * nt tasks: the next band's lines convert their new panels when
  // their first tiles run (tile-column-major: the band's first tasks).
  const int64_t nt = static_cast<int64_t>(plan.last_tiles.size());
  const int64_t per_line = PanelStore::tasks_per_line(plan), per_band = plan.band * per_line;
  const int64_t task = item * per, first = task - task % per_band;
  if (sc.ahead_first != first) {
    sc.ahead_first = first;
    sc.ahead.clear();
    const int64_t next = first + per_band;
    int64_t next_lines = std::min<int64_t>(plan.band, plan.tasks() / nt - next / nt);
    if (plan.strips) {  // (the band's lines within its strip)
      const int64_t in_strip = next % (plan.qlines * per_line);
      next_lines = std::min<int64_t>(plan.band, plan.qlines - in_strip / per_band * plan.band);
    }
    if (plan.strips && next < chunk_end * per && next < plan.tasks()) {
      // The rows the next band reads: its query rows (Q, O) and the source rows of every KV
      // head's strip panels its boxes add (its first tasks are its lines' tasks of head 0), each
      // token's heads as one run where they are contiguous (heads-last rows read whole).
      auto whole = [](const Strided& x, int64_t heads, int n) {
        return x.sh == n ? static_cast<int>((heads - 1) * x.sh + n) : 0;
      };
      std::vector<int64_t> seen;
      TileGeom gn;
      for (int64_t l = 0; l < next_lines; ++l) {
        gn.build(plan, next + l, D, Dv, A);
        for (const auto& r : rows) {
          if (!r.first->present()) continue;
          const int w = whole(*r.first, p.heads, r.second);
          for (int64_t h = 0; h < (w ? 1 : p.heads); ++h)
            sc.ahead.add(*r.first, r.first->token_offset(gn.b, gn.q_token[0], h),
                         L.dilation * r.first->sl[r.first->rank - 1], gn.s.T, w ? w : r.second);
        }
        bool all = true;  // every source tensor's heads contiguous
        for (const auto& r : panel_src) all = all && whole(*r.first, p.heads_kv, r.second) > 0;
        auto add_rows = [&](int64_t id, bool every_head) {
          for (const auto& r : panel_src) {
            int64_t off = 0, step = 0;
            int cols = 0;
            panels.source(*r.first, id, &off, &step, &cols);
            sc.ahead.add(*r.first, off, step, cols, every_head ? whole(*r.first, p.heads_kv, r.second) : r.second);
          }
        };
        for (int64_t tok : gn.row_token) {
          bool missing = false;  // some head's panel of this key line
          for (int64_t h = 0; h < p.heads_kv; ++h) {
            gn.hk = h;
            const int64_t id = panels.id_of(gn, tok / p.shape[plan.la]);
            if (store.holds(worker, id) || std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
            seen.push_back(id);
            missing = true;
            if (!all) add_rows(id, false);
          }
          if (all && missing) {  // one run per token: head 0's rows through the last head's
            gn.hk = 0;
            add_rows(panels.id_of(gn, tok / p.shape[plan.la]), true);
          }
        }
      }
    } else if (next < chunk_end * per && next < plan.tasks()) {
      std::vector<int64_t> seen;  // panels already listed
      TileGeom gn;
      for (int64_t l = 0; l < next_lines; ++l) {
        gn.build(plan, next + l, D, Dv, A);  // (tile 0 of the band's line l)
        for (int64_t tok : gn.row_token) {
          const int64_t kl = tok / p.shape[plan.la];
          for (int g = 0; g < L.dilation && g < L.length; ++g) {
            const int64_t id = panels.id(gn.b, gn.hk, kl, g);
            if (store.holds(worker, id) || std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
            seen.push_back(id);
            for (const auto& r : panel_src) {
              const Strided& x = *r.first;
              sc.ahead.add(x, x.token_offset(gn.b, kl * p.shape[plan.la] + g, gn.hk),
                           L.dilation * x.sl[x.rank - 1], nbr::group_length(L, g), r.second);
            }
          }
        }
      }
    }
  }
  const size_t n = sc.ahead.rows.size();
  const int64_t in = task - first;
  sc.hints.rows.insert(sc.hints.rows.end(), sc.ahead.rows.begin() + static_cast<int64_t>(n * in / per_band),
                       sc.ahead.rows.begin() + static_cast<int64_t>(n * std::min(in + per, per_band) / per_band));
  sc.hints.lines = std::max(sc.hints.lines, sc.ahead.lines);
}

}  // namespace driver

// The two halves of the driver (backend.cpp, backward.cpp).
Status forward(const Problem& p, const ForwardArgs& a, const Options& opt);
Status backward(const Problem& p, const BackwardArgs& a, const Options& opt);

}  // namespace cpu
}  // namespace fna
