// Multi-dimensional tiling for the fused kernels (paper section 3.3), shared by forward and
// backward. Every problem is lifted to three axes: a rank-r problem occupies the last r axes and
// the leading ones have length 1, kernel 1 (tile shapes of lower ranks have leading extents of 1),
// so one kernel body serves ranks 1-3 and the compile-time tile shape decides the rest.
//
// All coordinates here are *local* to one dilation group (see core/neighborhood.h): the token at
// local index c of group g on an axis is the global index c * d + g. The window arithmetic itself
// is never rewritten here; it comes from nbr::window / tile_union / tile_intersection /
// inverse_tile_union.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/neighborhood.h"

namespace fna {
namespace fused {

constexpr int kAxes = 3;

// A compile-time tile shape, last axis fastest when flattened.
template <int E0, int E1, int E2>
struct Tile {
  static constexpr int kExt[kAxes] = {E0, E1, E2};
  static constexpr int kSize = E0 * E1 * E2;
  FNA_HD static int ext(int ax) { return ax == 0 ? E0 : (ax == 1 ? E1 : E2); }
  // Flat index in [0, kSize) -> coordinate inside the tile.
  FNA_HD static void coord(int idx, int (&c)[kAxes]) {
    c[2] = idx % E2;
    c[1] = (idx / E2) % E1;
    c[0] = idx / (E1 * E2);
  }
};

// Tile extents per axis as a value (the host's configurations hold them at run time; device code
// builds one from a compile-time Tile with ext_of, so the arithmetic folds).
struct Ext3 {
  int e[kAxes];
  FNA_HD int size() const { return e[0] * e[1] * e[2]; }
};
template <class TT>
FNA_HD Ext3 ext_of() {
  return Ext3{{TT::ext(0), TT::ext(1), TT::ext(2)}};
}

// The first axis a tile of `q` splits into `parts` equal boxes of consecutive rows (its slowest
// axis longer than 1: the warp-specialized forward's warpgroups own such boxes of 64 rows), or
// -1 where that axis does not divide.
FNA_HD constexpr int part_axis(const int (&q)[kAxes], int parts) {
  for (int ax = 0; ax < kAxes; ++ax)
    if (q[ax] > 1) return q[ax] % parts == 0 ? ax : -1;
  return -1;
}

// The lifted problem geometry (only the neighborhood parameters; shapes of heads / dims live in
// the kernels' own params).
struct Geometry {
  nbr::Axis axis[kAxes];
  // Lifts the first `rank` entries of per-axis arrays onto the last `rank` axes.
  FNA_HD static Geometry lift(int rank, const int64_t* length, const int64_t* kernel,
                              const int64_t* dilation, const int64_t* stride, const bool* causal) {
    Geometry g;
    for (int ax = 0; ax < kAxes; ++ax) {
      const int src = ax - (kAxes - rank);
      if (src < 0) {
        g.axis[ax] = nbr::Axis{1, 1, 1, 1, false};
      } else {
        g.axis[ax] = nbr::Axis{static_cast<int>(length[src]), static_cast<int>(kernel[src]),
                               static_cast<int>(dilation[src]), static_cast<int>(stride[src]),
                               causal[src]};
      }
    }
    return g;
  }
  // Dilation groups: the product over axes of d. The group index is flattened last axis fastest.
  FNA_HD int num_groups() const {
    return axis[0].dilation * axis[1].dilation * axis[2].dilation;
  }
  // Largest group length per axis (group 0 is never shorter than any other).
  FNA_HD int max_group_length(int ax) const { return nbr::group_length(axis[ax], 0); }
};

// One dilation group: its index per axis and its local length per axis.
struct Group {
  int g[kAxes];
  int len[kAxes];
  FNA_HD static Group of(const Geometry& geo, int flat) {
    Group gr;
    for (int ax = kAxes - 1; ax >= 0; --ax) {
      const int d = geo.axis[ax].dilation;
      gr.g[ax] = flat % d;
      flat /= d;
      gr.len[ax] = nbr::group_length(geo.axis[ax], gr.g[ax]);
    }
    return gr;
  }
  // The same with the divisions by the dilations done by `dil` (ProblemBlock::dil).
  template <class Div>
  FNA_HD static Group of(const Geometry& geo, int flat, const Div (&dil)[kAxes]) {
    Group gr;
    for (int ax = kAxes - 1; ax >= 0; --ax) {
      int q;
      gr.g[ax] = dil[ax].divmod(flat, q);
      flat = q;
      gr.len[ax] = nbr::group_length(geo.axis[ax], gr.g[ax],
                                     [&](int n) { return dil[ax].div(n); });
    }
    return gr;
  }
  // Global index along `ax` of local index c.
  FNA_HD int global(const Geometry& geo, int ax, int c) const { return c * geo.axis[ax].dilation + g[ax]; }
};

// The queries a call computes per lifted axis, global coordinates [lo, hi): the whole grid, or a
// query region (fna::Problem::query_offset / query_shape). For the host's statistics and plans;
// the kernels take the same bounds from ProblemBlock::qlo / qhi.
struct QueryBox {
  int lo[kAxes], hi[kAxes];
  static QueryBox whole(const Geometry& geo) {
    QueryBox b;
    for (int ax = 0; ax < kAxes; ++ax) b.lo[ax] = 0, b.hi[ax] = geo.axis[ax].length;
    return b;
  }
  // Dilation group g's queries along `ax`, local [ceil((lo - g) / d), ceil((hi - g) / d)) (as
  // fwd_tile; the whole group, [0, group_length), without a region).
  int begin(const Geometry& geo, int ax, int g) const {
    const int d = geo.axis[ax].dilation;
    return (lo[ax] + d - 1 - g) / d;
  }
  int end(const Geometry& geo, int ax, int g) const {
    const int d = geo.axis[ax].dilation;
    return (hi[ax] + d - 1 - g) / d;
  }
  // The most queries any group has along `ax` (group 0's when there is no region).
  int max_length(const Geometry& geo, int ax) const {
    int m = 0;
    for (int g = 0; g < geo.axis[ax].dilation; ++g)
      m = std::max(m, end(geo, ax, g) - begin(geo, ax, g));
    return m;
  }
};

// Number of tiles of extent `ext` covering `len`.
FNA_HD int tiles_over(int len, int ext) { return (len + ext - 1) / ext; }

// The key/value tiles a query tile visits. Per axis they start at the first key of the union of
// the tile's windows (not at a multiple of the tile extent: that never needs more tiles and often
// one fewer) and cover the union. Every tile of that box holds at least one neighbor pair, since
// windows are boxes and the per-axis unions are contiguous. A key tile lying inside the per-axis
// intersection of all windows on every axis is neighbor to every query: it needs no mask.
struct KvSpan {
  int origin[kAxes];       // local coordinate of the first key tile per axis
  int count[kAxes];        // key tiles per axis
  int inner_begin[kAxes];  // per-axis intersection [inner_begin, inner_end) of all windows
  int inner_end[kAxes];
  FNA_HD int total() const { return count[0] * count[1] * count[2]; }
};

// `q_origin` is the query tile's first local coordinate per axis and `q_end` the end of the
// group's queries (its length, or with a query region the end of its part of the region, FwdTile
// qhi); queries at or past it are ignored (a tile may overhang the end of an axis or of the
// region: a region's last tile then loads only the keys its own queries need). kv_span_axis fills
// one axis's entries (the forward kernels compute the axes on different warps, side by side).
FNA_HD void kv_span_axis(const Geometry& geo, const Group& gr, const int (&q_origin)[kAxes], int ax,
                         int q_ext, int kv_ext, int q_end, KvSpan& s) {
  const int i0 = q_origin[ax];
  const int i1 = i0 + q_ext < q_end ? i0 + q_ext : q_end;
  const nbr::Range u = nbr::tile_union(geo.axis[ax], gr.len[ax], i0, i1);
  const nbr::Range x = nbr::tile_intersection(geo.axis[ax], gr.len[ax], i0, i1);
  s.origin[ax] = u.begin;
  s.count[ax] = tiles_over(u.size(), kv_ext);
  s.inner_begin[ax] = x.begin;
  s.inner_end[ax] = x.end;
}

template <class QT, class KT>
FNA_HD void kv_span_axis(const Geometry& geo, const Group& gr, const int (&q_origin)[kAxes],
                         const int (&q_end)[kAxes], int ax, KvSpan& s) {
  kv_span_axis(geo, gr, q_origin, ax, QT::ext(ax), KT::ext(ax), q_end[ax], s);
}

template <class QT, class KT>
FNA_HD KvSpan kv_span(const Geometry& geo, const Group& gr, const int (&q_origin)[kAxes],
                      const int (&q_end)[kAxes]) {
  KvSpan s;
  for (int ax = 0; ax < kAxes; ++ax) kv_span_axis<QT, KT>(geo, gr, q_origin, q_end, ax, s);
  return s;
}

// Key tile number `t` of a span (last axis fastest) -> its first local coordinate per axis, and
// whether it lies wholly inside every query's window (no mask needed).
FNA_HD bool kv_tile_at(const KvSpan& s, int t, Ext3 kv, int (&k_origin)[kAxes]) {
  bool inside = true;
  for (int ax = kAxes - 1; ax >= 0; --ax) {
    const int ti = t % s.count[ax];
    t /= s.count[ax];
    k_origin[ax] = s.origin[ax] + ti * kv.e[ax];
    inside = inside && k_origin[ax] >= s.inner_begin[ax] &&
             k_origin[ax] + kv.e[ax] <= s.inner_end[ax];
  }
  return inside;
}

template <class KT>
FNA_HD bool kv_tile_at(const KvSpan& s, int t, int (&k_origin)[kAxes]) {
  return kv_tile_at(s, t, ext_of<KT>(), k_origin);
}

// What a part of a query tile needs of the tile's key tiles (kv_span): rows [r0, r0 + n) of the
// tile (last axis fastest) lie in a box of it (per axis a run of positions, the whole extent on
// the axes faster than the first one they wrap around), and per axis the union and the
// intersection of that box's windows (as kv_span_axis for the whole tile) bound the key tiles the
// rows need at all and those inside all their windows (no mask). A box with no query of the group
// before `q_end` (kv_span_axis) needs nothing (empty ranges). The warp-specialized forward's compute warpgroups take
// their 64 rows' part (fwd_sm90_ws.cuh).
struct RowsSpan {
  int need_begin[kAxes], need_end[kAxes];
  int inner_begin[kAxes], inner_end[kAxes];
};

FNA_HD RowsSpan rows_span(const Geometry& geo, const Group& gr, const int (&qo)[kAxes],
                          const int (&q_end)[kAxes], Ext3 q, int r0, int n) {
  int c0[kAxes], c1[kAxes];
  const int last = r0 + n - 1;
  c0[2] = r0 % q.e[2], c0[1] = (r0 / q.e[2]) % q.e[1], c0[0] = r0 / (q.e[1] * q.e[2]);
  c1[2] = last % q.e[2], c1[1] = (last / q.e[2]) % q.e[1], c1[0] = last / (q.e[1] * q.e[2]);
  RowsSpan s;
  bool same = true;  // the rows share every slower axis's position
  for (int ax = 0; ax < kAxes; ++ax) {
    const int lo = same ? c0[ax] : 0, hi = same ? c1[ax] + 1 : q.e[ax];
    same = same && c0[ax] == c1[ax];
    const int i0 = qo[ax] + lo;
    const int i1 = qo[ax] + hi < q_end[ax] ? qo[ax] + hi : q_end[ax];
    if (i0 < i1) {
      const nbr::Range u = nbr::tile_union(geo.axis[ax], gr.len[ax], i0, i1);
      const nbr::Range x = nbr::tile_intersection(geo.axis[ax], gr.len[ax], i0, i1);
      s.need_begin[ax] = u.begin, s.need_end[ax] = u.end;
      s.inner_begin[ax] = x.begin, s.inner_end[ax] = x.end;
    } else {
      s.need_begin[ax] = s.need_end[ax] = s.inner_begin[ax] = s.inner_end[ax] = 0;
    }
  }
  return s;
}

// The run of a span's key-tile walk (tile numbers [first, last), kv_tile_at's order) from the
// first tile the rows of `r` need to the last: per axis the needed tiles are a run of the span's,
// so in the walk (last axis fastest) every needed tile lies between those two; tiles between them
// that the rows do not need are visited and masked. The additional-key tiles that follow the
// neighborhood's (numbers n_nbr to n_tiles) are always in.
struct WalkRun {
  int first, last;
};

FNA_HD WalkRun rows_walk(const KvSpan& s, const RowsSpan& r, Ext3 kv, int n_nbr, int n_tiles) {
  int lo = 0, hi = 0;
  bool any = true;
  for (int ax = 0; ax < kAxes; ++ax) {
    // Tiles t with origin + t * ext < need_end and origin + (t + 1) * ext > need_begin.
    const int e = kv.e[ax];
    const int t0 = r.need_begin[ax] > s.origin[ax] ? (r.need_begin[ax] - s.origin[ax]) / e : 0;
    int t1 = r.need_end[ax] > s.origin[ax] ? (r.need_end[ax] - 1 - s.origin[ax]) / e : -1;
    t1 = t1 < s.count[ax] - 1 ? t1 : s.count[ax] - 1;
    any = any && r.need_end[ax] > r.need_begin[ax] && t0 <= t1;
    lo = lo * s.count[ax] + t0;
    hi = hi * s.count[ax] + t1;
  }
  WalkRun w;
  w.first = any ? lo : n_nbr;
  w.last = n_tiles > n_nbr ? n_tiles : (any ? hi + 1 : w.first);
  return w;
}

// The window of one query (local coordinates) on every axis; a query beyond the group's length
// gets an empty window so its row is fully masked.
struct RowWindow {
  int begin[kAxes];
  int end[kAxes];
  FNA_HD static RowWindow of(const Geometry& geo, const Group& gr, const int (&q)[kAxes]) {
    RowWindow w;
    bool valid = true;
    for (int ax = 0; ax < kAxes; ++ax) valid = valid && q[ax] < gr.len[ax];
    for (int ax = 0; ax < kAxes; ++ax) {
      if (valid) {
        const nbr::Range r = nbr::window(geo.axis[ax], gr.len[ax], q[ax]);
        w.begin[ax] = r.begin;
        w.end[ax] = r.end;
      } else {
        w.begin[ax] = 0;
        w.end[ax] = 0;
      }
    }
    return w;
  }
  // Axes below `first_axis` are skipped (lifted axes of a lower-rank problem always match).
  FNA_HD bool contains(const int (&k)[kAxes], int first_axis = 0) const {
    bool in = true;
    for (int ax = first_axis; ax < kAxes; ++ax) in = in && k[ax] >= begin[ax] && k[ax] < end[ax];
    return in;
  }
};

// Tile pairs visited along one axis, summed over its dilation groups (host). Pairs factor over
// axes (tiles are boxes and the per-axis ranges independent), so a problem visits the product.
//   own_kv: key tiles of extent `own` at multiples of it, each visiting the query tiles of extent
//           `other` laid from the start of its inverse neighborhood (the dK/dV kernel's walk,
//           bwd_ktile.cuh key_tile_ranges);
//   else:   query tiles of extent `own`, each visiting the key tiles of extent `other` laid from
//           the start of the union of its windows (kv_span; the dQ kernel).
inline double axis_tile_pairs(const nbr::Axis& a, int own, int other, bool own_kv) {
  double n = 0;
  for (int g = 0; g < a.dilation; ++g) {
    const int len = nbr::group_length(a, g);
    for (int i0 = 0; i0 < len; i0 += own) {
      const int i1 = i0 + own < len ? i0 + own : len;
      const nbr::Range r = own_kv ? nbr::inverse_tile_union(a, len, i0, i1)
                                  : nbr::tile_union(a, len, i0, i1);
      n += tiles_over(r.size(), other);
    }
  }
  return n;
}

// ---- the tile walk -------------------------------------------------------------------------
// The order in which a kernel's CTAs take their tiles within one (batch, head, dilation group):
// tile t lies at (t / div[ax]) % count[ax] on each axis. `order` lists the axes fastest first.
// The CTAs resident at one time are a run of consecutive tiles, and what they read from the other
// tensor (K / V in the forward, Q / dO / dQ in the dK / dV kernel) is the union of their tiles'
// haloes: a run that is compact in units of the halo keeps that union in L2. With windows that
// cover much of an axis (3d-video: 18 of 30 frames, 24 of 48 rows, 24 of 80 columns), walking the
// last axis fastest spreads a run over whole frames, so its haloes reach across most of the
// tensor; walking the axes whose windows cover the most of them fastest keeps the run's haloes
// inside a band of the last axis instead.
inline void walk_divisors(const int (&count)[kAxes], const int (&order)[kAxes], int (&div)[kAxes]) {
  int d = 1;
  for (int i = 0; i < kAxes; ++i) {
    div[order[i]] = d;
    d *= count[order[i]];
  }
}

// Tokens of the other tensor that `resident` consecutive tiles reach, walked in `order`, by the
// box model: the run covers min(count, ceil(resident / tiles of the faster axes)) tiles per axis,
// and its halo reaches kernel - 1 further (local coordinates), within the axis.
inline double walk_footprint(const Geometry& geo, const int (&ext)[kAxes], int resident,
                             const int (&order)[kAxes]) {
  double fp = 1;
  long faster = 1;
  for (int i = 0; i < kAxes; ++i) {
    const nbr::Axis& a = geo.axis[order[i]];
    const int len = geo.max_group_length(order[i]);
    const long count = tiles_over(len, ext[order[i]]);
    const long run = std::min<long>(count, (resident + faster - 1) / faster);
    fp *= double(std::min<long>(len, run * ext[order[i]] + a.kernel - 1));
    faster *= count;
  }
  return fp;
}

// A walk named by the problem's axes (Tuning::fwd_walk / bwd_walk: digits 0..rank-1, fastest
// first, each once) lifted to kAxes: the lifted leading axes, one tile each, go last. False when
// `w` is not such a walk.
inline bool lifted_walk(const std::string& w, int rank, int (&order)[kAxes]) {
  if (static_cast<int>(w.size()) != rank) return false;
  int seen = 0, n = 0;
  for (char c : w) {
    const int ax = c - '0';
    if (ax < 0 || ax >= rank || (seen & (1 << ax))) return false;
    seen |= 1 << ax;
    order[n++] = ax + (kAxes - rank);
  }
  for (int ax = kAxes - rank - 1; ax >= 0; --ax) order[n++] = ax;
  return true;
}

// The walk for tiles of extent `ext` with `resident` CTAs running at once (the SM count): the
// default (2, 1, 0), last (contiguous) axis fastest, unless another order's footprint is under
// 90% of the default's; then the smallest footprint, ties to the order that runs the axes with
// the largest (kernel - 1) / length fastest.
inline void walk_order(const Geometry& geo, const int (&ext)[kAxes], int resident,
                       int (&order)[kAxes]) {
  order[0] = 2, order[1] = 1, order[2] = 0;
  const double base = walk_footprint(geo, ext, resident, order);
  // Candidates: the permutations, the one sorted by coverage (stable from the default) first.
  int by_cov[kAxes] = {2, 1, 0};
  auto cov = [&](int ax) {
    return double(geo.axis[ax].kernel - 1) / double(geo.max_group_length(ax));
  };
  for (int i = 1; i < kAxes; ++i)
    for (int j = i; j > 0 && cov(by_cov[j]) > cov(by_cov[j - 1]); --j)
      std::swap(by_cov[j], by_cov[j - 1]);
  int cands[7][kAxes] = {{by_cov[0], by_cov[1], by_cov[2]}, {0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                         {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  double best = base;
  for (auto& c : cands) best = std::min(best, walk_footprint(geo, ext, resident, c));
  if (best >= 0.9 * base) return;
  for (auto& c : cands)
    if (walk_footprint(geo, ext, resident, c) <= best * 1.001) {
      for (int i = 0; i < kAxes; ++i) order[i] = c[i];
      return;
    }
}

// A walk order over the problem's `rank` axes (axis 0 the first spatial axis), fastest first: the
// lifted leading axes, one tile each, are left out.
inline std::vector<int> walk_axes(int rank, const int (&order)[kAxes]) {
  std::vector<int> out;
  for (int i = 0; i < kAxes; ++i)
    if (order[i] >= kAxes - rank) out.push_back(order[i] - (kAxes - rank));
  return out;
}

// Host-side tiling statistics over the whole problem (all groups and query tiles; with `box`, the
// tiles of its queries, laid from each group's first query of it as the kernels lay them): key
// tiles visited and those needing no mask. Tile counts are separable per axis, so the sums over
// the product of groups and query tiles factor into a product of per-axis sums.
struct TilingStats {
  double visited = 0;
  double unmasked = 0;
};
inline TilingStats tiling_stats(const Geometry& geo, const int (&q_ext)[kAxes],
                                const int (&kv_ext)[kAxes], const QueryBox* box = nullptr) {
  const QueryBox qb = box != nullptr ? *box : QueryBox::whole(geo);
  double visited = 1, unmasked = 1;
  for (int ax = 0; ax < kAxes; ++ax) {
    const nbr::Axis& a = geo.axis[ax];
    const int qe = q_ext[ax], ke = kv_ext[ax];
    double v = 0, u = 0;
    for (int g = 0; g < a.dilation; ++g) {
      const int len = nbr::group_length(a, g);
      const int end = qb.end(geo, ax, g);
      for (int i0 = qb.begin(geo, ax, g); i0 < end; i0 += qe) {
        const int i1 = i0 + qe < end ? i0 + qe : end;
        const nbr::Range un = nbr::tile_union(a, len, i0, i1);
        const nbr::Range x = nbr::tile_intersection(a, len, i0, i1);
        const int n = tiles_over(un.size(), ke);
        v += n;
        for (int t = 0; t < n; ++t) {
          const int o = un.begin + t * ke;
          u += (o >= x.begin && o + ke <= x.end) ? 1 : 0;
        }
      }
    }
    visited *= v;
    unmasked *= u;
  }
  return {visited, unmasked};
}
// Needed (query, key) pairs per (batch, head), over `box`'s queries (every query without one):
// the window is a product over axes, so the count is the product of per-axis sums of window
// lengths over every dilation group.
inline double needed_pairs(const Geometry& geo, const QueryBox* box = nullptr) {
  const QueryBox qb = box != nullptr ? *box : QueryBox::whole(geo);
  double needed = 1;
  for (int ax = 0; ax < kAxes; ++ax) {
    const nbr::Axis& a = geo.axis[ax];
    double sum = 0;
    for (int g = 0; g < a.dilation; ++g) {
      const int len = nbr::group_length(a, g);
      const int end = qb.end(geo, ax, g);
      for (int i = qb.begin(geo, ax, g); i < end; ++i) sum += nbr::window(a, len, i).size();
    }
    needed *= sum;
  }
  return needed;
}

template <class QT, class KT>
inline TilingStats tiling_stats(const Geometry& geo) {
  return tiling_stats(geo, QT::kExt, KT::kExt);
}

// Calls fn(group, query-tile origin, end of the group's queries, key-tile span) for every query
// tile of every dilation group, over `box`'s queries (host; for the statistics below, which do not
// factor over axes).
template <class Fn>
inline void for_each_query_tile(const Geometry& geo, Ext3 q, Ext3 kv, const QueryBox* box,
                                Fn&& fn) {
  const QueryBox qb = box != nullptr ? *box : QueryBox::whole(geo);
  for (int flat = 0; flat < geo.num_groups(); ++flat) {
    const Group gr = Group::of(geo, flat);
    int nt[kAxes], qo[kAxes], q0[kAxes], q1[kAxes];
    for (int ax = 0; ax < kAxes; ++ax) {
      q0[ax] = qb.begin(geo, ax, gr.g[ax]);
      q1[ax] = qb.end(geo, ax, gr.g[ax]);
      nt[ax] = q1[ax] > q0[ax] ? tiles_over(q1[ax] - q0[ax], q.e[ax]) : 0;
    }
    for (int t = 0; t < nt[0] * nt[1] * nt[2]; ++t) {
      qo[0] = q0[0] + (t / (nt[1] * nt[2])) * q.e[0];
      qo[1] = q0[1] + (t / nt[2] % nt[1]) * q.e[1];
      qo[2] = q0[2] + (t % nt[2]) * q.e[2];
      KvSpan span;
      for (int ax = 0; ax < kAxes; ++ax)
        kv_span_axis(geo, gr, qo, ax, q.e[ax], kv.e[ax], q1[ax], span);
      fn(gr, qo, q1, span);
    }
  }
}

// The same statistics for kernels whose parts of `rows` query rows each visit only their own run
// of the key-tile walk (rows_span, rows_walk: the warp-specialized forward's warpgroups), in units
// of whole query tiles (each part's visit counts rows / q.size()); the mask is skipped on tiles
// inside all of the part's windows. Not separable over axes, so this walks every query tile.
inline TilingStats part_tiling_stats(const Geometry& geo, Ext3 q, Ext3 kv, int rows,
                                     const QueryBox* box = nullptr) {
  double visited = 0, unmasked = 0;
  const double share = double(rows) / double(q.size());
  for_each_query_tile(geo, q, kv, box, [&](const Group& gr, const int (&qo)[kAxes],
                                           const int (&q_end)[kAxes], const KvSpan& span) {
    const int n = span.total();
    for (int r0 = 0; r0 < q.size(); r0 += rows) {
      const RowsSpan rs = rows_span(geo, gr, qo, q_end, q, r0, rows);
      const WalkRun run = rows_walk(span, rs, kv, n, n);
      visited += share * (run.last - run.first);
      KvSpan part = span;  // "inside" for the part's rows, as the kernel decides it
      for (int ax = 0; ax < kAxes; ++ax) {
        part.inner_begin[ax] = rs.inner_begin[ax];
        part.inner_end[ax] = rs.inner_end[ax];
      }
      int k[kAxes];
      for (int it = run.first; it < run.last; ++it)
        unmasked += kv_tile_at(part, it, kv, k) ? share : 0.0;
    }
  });
  return {visited, unmasked};
}

// The slowest part of each query tile, summed over the tiles: for kernels whose parts of `rows`
// rows run side by side and end together (the warp-specialized forward's warpgroups), a CTA takes
// as long as its part with the most work, `masked_weight` extra per masked key tile. Per part and
// axis the key tiles of its run and those inside all its windows are counted, and a part's tiles
// are their product (exact for the parts the kernels use, which differ on the tile's slowest
// axis). O(query tiles x parts x axes), so the forward's heuristic can afford it.
inline double part_critical_tiles(const Geometry& geo, Ext3 q, Ext3 kv, int rows,
                                  double masked_weight, const QueryBox* box = nullptr) {
  double total = 0;
  for_each_query_tile(geo, q, kv, box, [&](const Group& gr, const int (&qo)[kAxes],
                                           const int (&q_end)[kAxes], const KvSpan& span) {
    double worst = 0;
    for (int r0 = 0; r0 < q.size(); r0 += rows) {
      const RowsSpan rs = rows_span(geo, gr, qo, q_end, q, r0, rows);
      double n = 1, in = 1;
      for (int ax = 0; ax < kAxes; ++ax) {
        const int e = kv.e[ax], o = span.origin[ax];
        if (rs.need_end[ax] <= rs.need_begin[ax]) {
          n = in = 0;
          break;
        }
        const int t0 = rs.need_begin[ax] > o ? (rs.need_begin[ax] - o) / e : 0;
        const int t1 = std::min((rs.need_end[ax] - 1 - o) / e, span.count[ax] - 1);
        // Inside: o + t * e >= inner_begin and o + (t + 1) * e <= inner_end.
        const int i0 =
            std::max(t0, rs.inner_begin[ax] > o ? (rs.inner_begin[ax] - o + e - 1) / e : 0);
        const int i1 =
            std::min(t1, rs.inner_end[ax] >= o + e ? (rs.inner_end[ax] - o) / e - 1 : -1);
        n *= std::max(0, t1 - t0 + 1);
        in *= std::max(0, i1 - i0 + 1);
      }
      worst = std::max(worst, n + masked_weight * (n - in));
    }
    total += worst;
  });
  return total;
}

}  // namespace fused
}  // namespace fna
