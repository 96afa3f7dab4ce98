// The parts of the fused forward that the mma.sync kernel (fwd_sm80.cuh) and the wgmma kernel
// (fwd_sm90.cuh) share: the CTA's place in the launch, the row sources of the tile copies, the
// per-thread softmax state, the border-tile mask, the online softmax and the epilogue. They work
// on the mma.sync accumulator layout per warp (two rows per 16-row m-tile), which is also the
// per-warp layout of a wgmma m64 accumulator. `Tr` supplies kMT, kStepN, kD, kQ, kThreads,
// kWarpRows, kFirstAxis, kQInRegs, kF32 and Elem.
#pragma once

#include <cmath>
#include <type_traits>

#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace fused {

// Offset (elements) of the token at local coordinates `c` of group `gr`, for lifted strides
// s[1..3]; axes below kFirst are lifted (coordinate 0).
template <int kFirst>
__device__ __forceinline__ int64_t token_offset(const Geometry& geo, const Group& gr,
                                                const int (&c)[kAxes], const int64_t* s) {
  int64_t off = 0;
#pragma unroll
  for (int ax = kFirst; ax < kAxes; ++ax) off += int64_t(gr.global(geo, ax, c[ax])) * s[1 + ax];
  return off;
}

// Per-thread state of the online softmax: two rows per m-tile (lane / 4 and lane / 4 + 8 of its
// 16), O accumulators over the padded head dim.
template <class Tr>
struct FwdState {
  float o[Tr::kMT][Tr::kD / 8][4];
  float m[Tr::kMT][2];  // running max of scale * log2(e) * s
  float l[Tr::kMT][2];  // running sum of exp2(.. - m), partial over this thread's columns
  uint32_t qf[Tr::kQInRegs ? Tr::kMT : 1][Tr::kQInRegs ? Tr::kD / 16 : 1][4];
};

// The key/value tile currently processed: a neighborhood tile (origin per axis) or a tile of
// additional keys (first additional token).
struct KvTile {
  int origin[kAxes];
  int add_begin;  // >= 0 for additional-key tiles
  bool inside;    // neighborhood tile wholly inside every window: no mask
};

template <class Tr, class KT>
__device__ __forceinline__ KvTile kv_tile(const KvSpan& span, int n_nbr, int it) {
  KvTile t;
  if (it < n_nbr) {
    t.inside = kv_tile_at<KT>(span, it, t.origin);
    t.add_begin = -1;
  } else {
    t.inside = false;
    t.add_begin = (it - n_nbr) * Tr::kN;
  }
  return t;
}

// The tile after `t` (tile number it) of the walk kv_tile(.., 0), kv_tile(.., 1), ...: an
// odometer step over the span (last axis fastest), with no division per tile.
template <class Tr, class KT>
__device__ __forceinline__ KvTile kv_tile_next(const KvSpan& s, int n_nbr, const KvTile& t,
                                               int it) {
  KvTile n;
  if (it + 1 >= n_nbr) {
#pragma unroll
    for (int ax = 0; ax < kAxes; ++ax) n.origin[ax] = 0;
    n.inside = false;
    n.add_begin = (it + 1 - n_nbr) * Tr::kN;
    return n;
  }
  // The axes a rank below three lifts (length, kernel and tile extent 1: one tile, inside every
  // window) keep their origin; walking them too held their span in registers (the head-dim-64
  // 192-query 1-D kernel spilled 180 bytes, 28 without).
  bool carry = true, inside = true;
#pragma unroll
  for (int ax = 0; ax < Tr::kFirstAxis; ++ax) n.origin[ax] = t.origin[ax];
#pragma unroll
  for (int ax = kAxes - 1; ax >= Tr::kFirstAxis; --ax) {
    int o = t.origin[ax];
    if (carry) {
      o += KT::ext(ax);
      carry = o >= s.origin[ax] + s.count[ax] * KT::ext(ax);
      if (carry) o = s.origin[ax];
    }
    n.origin[ax] = o;
    inside = inside && o >= s.inner_begin[ax] && o + KT::ext(ax) <= s.inner_end[ax];
  }
  n.inside = inside;
  n.add_begin = -1;
  return n;
}

// The thread's two rows per m-tile of the window table (lane / 4 and lane / 4 + 8 of each 16).
template <class Tr>
__device__ __forceinline__ void load_row_windows(const RowWindow* sWin,
                                                 RowWindow (&rw)[Tr::kMT][2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rw[mt][r] = sWin[warp * Tr::kWarpRows + mt * 16 + (lane >> 2) + 8 * r];
}

// Border-tile mask. Per query row and axis, the window clipped to the tile becomes a bit set over
// the tile's positions on that axis; a key is in when its bit is set on every axis. The thread's
// columns are j * 8 + 2 * (lane % 4) + e, so when the fastest tile axis is a multiple of 8 every
// coordinate but that axis's 2 * (lane % 4) is a compile-time constant: each element costs a few
// constant-position bit tests, and only one row's bit sets are live at a time. The row windows
// come in registers (load_row_windows); apply_mask reads them from the CTA's table.
template <class Tr, class KT>
__device__ __forceinline__ void apply_mask_rw(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                              const KvTile& tile, const RowWindow (&rw)[Tr::kMT][2],
                                              int num_add, int col0) {
  constexpr int kN = Tr::kStepN;
  const int lane = threadIdx.x & 31;
  const int t2 = 2 * (lane & 3);
  if (tile.add_begin >= 0) {
    // Additional keys: only the count bounds the last tile.
    const int rem = num_add - tile.add_begin - col0 - t2;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (j * 8 + (i & 1) >= rem) s[mt][j][i] = -INFINITY;
    return;
  }
  // One bit per key-tile position on an axis: 32-bit sets unless an axis is longer (64-bit shifts
  // cost two instructions each).
  constexpr int kMaxExt = KT::kExt[0] > KT::kExt[1]
                              ? (KT::kExt[0] > KT::kExt[2] ? KT::kExt[0] : KT::kExt[2])
                              : (KT::kExt[1] > KT::kExt[2] ? KT::kExt[1] : KT::kExt[2]);
  using Bits = typename std::conditional<(kMaxExt > 32), unsigned long long, unsigned>::type;
  constexpr int kBits = sizeof(Bits) * 8;
  constexpr bool kFastAxis8 = KT::kExt[kAxes - 1] % 8 == 0;
  if constexpr (kMaxExt > 64) {
    // Longer axes (1-D tiles of 128 keys): per element, a range test per axis of its coordinate
    // (compile-time but for the fast axis's t2 + e) against the row's window clipped to the tile.
    static_assert(kFastAxis8, "tiles with an axis over 64 keys need a fast axis of 8k");
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const RowWindow& w = rw[mt][r];
        int lo[kAxes];
        unsigned len[kAxes];
#pragma unroll
        for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax) {
          lo[ax] = w.begin[ax] - tile.origin[ax] - (ax == kAxes - 1 ? t2 : 0);
          const int hi = w.end[ax] - tile.origin[ax] - (ax == kAxes - 1 ? t2 : 0);
          len[ax] = hi > lo[ax] ? unsigned(hi - lo[ax]) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            int c[kAxes];
            KT::coord(col0 + j * 8, c);  // compile-time after unrolling
            c[kAxes - 1] += e;
            bool in = true;
#pragma unroll
            for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax)
              in = in && unsigned(c[ax] - lo[ax]) < len[ax];
            if (!in) s[mt][j][2 * r + e] = -INFINITY;
          }
        }
      }
    }
    return;
  }
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const RowWindow& w = rw[mt][r];
      Bits bits[kAxes];
#pragma unroll
      for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax) {
        const int ext = KT::ext(ax);
        int lo = w.begin[ax] - tile.origin[ax], hi = w.end[ax] - tile.origin[ax];
        lo = lo < 0 ? 0 : (lo > ext ? ext : lo);
        hi = hi < 0 ? 0 : (hi > ext ? ext : hi);
        // (hi, lo <= ext: the full-word case exists only for an extent of the word's width)
        const Bits below_hi = (ext >= kBits && hi >= kBits) ? ~Bits(0) : ((Bits(1) << hi) - 1);
        const Bits below_lo = (ext >= kBits && lo >= kBits) ? ~Bits(0) : ((Bits(1) << lo) - 1);
        bits[ax] = below_hi & ~below_lo;
      }
      if constexpr (KT::kExt[kAxes - 1] == 8 && KT::kSize / 8 <= 32) {
        // Fast axis of 8: 8-column block j is one position of the other axes (row-major) and
        // the thread's columns t2 + e of it are fast-axis positions. Word `rows` has bit j set
        // when every other axis's position of block j is in the window, x[e] is all ones when
        // fast-axis position t2 + e is: one three-input test and one select per element.
        const unsigned fast = unsigned(bits[kAxes - 1] >> t2);
        const unsigned x[2] = {(fast & 1u) ? ~0u : 0u, (fast & 2u) ? ~0u : 0u};
        auto word = [&](int ax) { return ax >= Tr::kFirstAxis ? unsigned(bits[ax]) : 1u; };
        constexpr int kE0 = KT::kExt[kAxes - 3], kE1 = KT::kExt[kAxes - 2];
        unsigned rows = 0;
#pragma unroll
        for (int a0 = 0; a0 < kE0; ++a0)
          rows |= ((word(kAxes - 3) >> a0) & 1u) ? word(kAxes - 2) << (a0 * kE1) : 0u;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          const int blk = col0 / 8 + j;  // < KT::kSize / 8 = kE0 * kE1
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if ((rows & (1u << blk) & x[e]) == 0u) s[mt][j][2 * r + e] = -INFINITY;
        }
      } else if constexpr (kFastAxis8) {
        bits[kAxes - 1] >>= t2;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            int c[kAxes];
            KT::coord(col0 + j * 8, c);  // compile-time after unrolling; t2 + e is on the fast axis
            c[kAxes - 1] += e;
            bool in = true;
#pragma unroll
            for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax) in = in && ((bits[ax] >> c[ax]) & 1);
            if (!in) s[mt][j][2 * r + e] = -INFINITY;
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            int c[kAxes];
            KT::coord(col0 + j * 8 + t2 + e, c);
            bool in = true;
#pragma unroll
            for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax) in = in && ((bits[ax] >> c[ax]) & 1);
            if (!in) s[mt][j][2 * r + e] = -INFINITY;
          }
        }
      }
    }
  }
}

template <class Tr, class KT>
__device__ __forceinline__ void apply_mask(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                           const KvTile& tile, const RowWindow* sWin, int num_add,
                                           int col0) {
  RowWindow rw[Tr::kMT][2];
  load_row_windows<Tr>(sWin, rw);
  apply_mask_rw<Tr, KT>(s, tile, rw, num_add, col0);
}

// Online softmax of one step's scores s (in place: s becomes P) and the running max / sum update;
// returns whether a row's reference max moved, i.e. O must be scaled by `alpha` (rescale_o)
// before the step's P V is added. O itself is not touched, so it may be an MMA in flight.
// kMasked: a row of the step may hold only -inf scores (a masked tile, or any tile of a call with
// a bias, whose entries may be -inf or overflow to it once divided by the scale).
template <class Tr, bool kMasked>
__device__ __forceinline__ bool softmax_scores(FwdState<Tr>& st,
                                               float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                               float scale_log2, float (&alpha)[Tr::kMT][2]) {
  constexpr int kN = Tr::kStepN, kMT = Tr::kMT;
  // Online softmax with lazy rescaling: a row's reference max m moves only when the tile's max
  // exceeds it by more than 8 (log2 units), so p stays <= 256 (exact in f32, and relative
  // precision is what 16-bit P keeps) and most steps skip rescaling O, which costs as many
  // instructions as the MMAs of a 32-key step.
  constexpr float kSlack = 8.f;
  bool rescale = false;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float cand = mx * scale_log2;
      const float m_old = st.m[mt][r];
      const bool move = cand > m_old + kSlack;  // false for -inf vs -inf
      const float m_new = move ? cand : m_old;
      // A row with no finite score so far (only where kMasked) keeps m = -inf; exponentiate
      // against 0 then, so every p is exp2(-inf) = 0 and no inf - inf NaN appears.
      const float m_use = (kMasked && m_new == -INFINITY) ? 0.f : m_new;
      alpha[mt][r] = move ? mma::fast_exp2(m_old - m_use) : 1.f;
      rescale = rescale || move;
      st.m[mt][r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        s[mt][j][2 * r] = mma::fast_exp2(fmaf(s[mt][j][2 * r], scale_log2, -m_use));
        s[mt][j][2 * r + 1] = mma::fast_exp2(fmaf(s[mt][j][2 * r + 1], scale_log2, -m_use));
        sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
      }
      st.l[mt][r] = st.l[mt][r] * alpha[mt][r] + sum;
    }
  }
  return rescale;
}

// O *= alpha per row, when any row of the warp needs it (softmax_scores' result).
template <class Tr>
__device__ __forceinline__ void rescale_o(FwdState<Tr>& st, bool rescale,
                                          const float (&alpha)[Tr::kMT][2]) {
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
      for (int j = 0; j < Tr::kD / 8; ++j) {
        st.o[mt][j][0] *= alpha[mt][0];
        st.o[mt][j][1] *= alpha[mt][0];
        st.o[mt][j][2] *= alpha[mt][1];
        st.o[mt][j][3] *= alpha[mt][1];
      }
  }
}

// softmax_scores, then the rescale of O.
template <class Tr, bool kMasked>
__device__ __forceinline__ void softmax_update(FwdState<Tr>& st,
                                               float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                               float scale_log2) {
  float alpha[Tr::kMT][2];
  const bool rescale = softmax_scores<Tr, kMasked>(st, s, scale_log2, alpha);
  rescale_o(st, rescale, alpha);
}

// The CTA's place in the launch: batch, head, dilation group and query-tile origin (local
// coordinates of the group; with a query region the tiles start at the group's first query of
// the region). Query tiles of one (batch, head, group) are adjacent block indices,
// walked in the order of p.q_div (tiling.cuh walk_order), so neighbors share K/V in L2. False when
// the tile starts past a shorter group's end.
struct FwdTile {
  int b, h;
  Group gr;
  int qo[kAxes];
  // The group's queries per axis, local [qlo, qhi): [0, len), or its part of the query region.
  int qlo[kAxes], qhi[kAxes];
};

template <class QT>
__device__ __forceinline__ bool fwd_tile(const FwdParams& p, int block, FwdTile& ft) {
  // block = ((b * heads + h) * groups + group) * q_tiles_total + tile; divisions by
  // multiply-and-shift (FastDiv): they were a third of a small problem's instructions.
  int flat;
  const int tile = p.div_tiles_total.divmod(block, flat);
  const int grp = p.div_groups.divmod(flat, flat);
  ft.h = p.div_heads.divmod(flat, ft.b);
  ft.gr = Group::of(p.geo, grp, p.dil);
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    int unused;
    ft.qo[ax] = p.div_q_tiles[ax].divmod(p.div_q_div[ax].div(tile), unused) * QT::ext(ax);
  }
  if (p.region) {
    // The group's tiles start at its first query of the region, local ceil((qlo - g) / d), and
    // end at its last, below ceil((qhi - g) / d) (dividends >= 0: qlo >= 0, g < d).
#pragma unroll
    for (int ax = 0; ax < kAxes; ++ax) {
      const int d1 = p.geo.axis[ax].dilation - 1 - ft.gr.g[ax];
      ft.qlo[ax] = p.dil[ax].div(p.qlo[ax] + d1);
      ft.qhi[ax] = p.dil[ax].div(p.qhi[ax] + d1);
      ft.qo[ax] += ft.qlo[ax];
    }
  } else {
#pragma unroll
    for (int ax = 0; ax < kAxes; ++ax) ft.qlo[ax] = 0, ft.qhi[ax] = ft.gr.len[ax];
  }
  bool in = true;
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) in = in && ft.qo[ax] < ft.qhi[ax];
  return in;
}

// Row `row` of the CTA's query tile: its coordinates in the group (c) and whether it is one of
// the call's queries (inside the group's [ft.qlo, ft.qhi) on every axis).
template <class QT>
__device__ __forceinline__ bool query_row(const FwdTile& ft, int row, int (&c)[kAxes]) {
  QT::coord(row, c);
  bool ok = true;
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    c[ax] += ft.qo[ax];
    ok = ok && c[ax] >= ft.qlo[ax] && c[ax] < ft.qhi[ax];
  }
  return ok;
}

// Row sources for copy_rows: query row `row` of the tile at `qo`, key/value row `row` of
// neighborhood tile `t`, additional key/value row `row` of tile `t`. False: past the end (the row
// is zero-filled; masked, and 0 * 0 keeps O finite). Query rows: false also outside the group's
// queries [ft.qlo, ft.qhi) (with a query region, Q holds no other rows).
template <class QT, int kFirst, class Elem>
__device__ __forceinline__ bool q_row_src(const FwdParams& p, const FwdTile& ft, const Elem* gQ,
                                          int row, const Elem*& a) {
  int c[kAxes];
  const bool ok = query_row<QT>(ft, row, c);
  a = gQ + token_offset<kFirst>(p.geo, ft.gr, c, p.q_stride);
  return ok;
}

template <class KT, int kFirst, class Elem>
__device__ __forceinline__ bool kv_row_src(const FwdParams& p, const Group& gr, const KvTile& t,
                                           const Elem* gK, const Elem* gV, int row,
                                           const Elem*& k, const Elem*& v) {
  int c[kAxes];
  KT::coord(row, c);
  bool ok = true;
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) {
    c[ax] += t.origin[ax];
    ok = ok && c[ax] < gr.len[ax];
  }
  k = gK + token_offset<kFirst>(p.geo, gr, c, p.k_stride);
  v = gV + token_offset<kFirst>(p.geo, gr, c, p.v_stride);
  return ok;
}

template <class Elem>
__device__ __forceinline__ bool add_row_src(const FwdParams& p, int b, int hkv, const KvTile& t,
                                            int row, const Elem*& k, const Elem*& v) {
  const Elem* gAK =
      static_cast<const Elem*>(p.add_k) + b * p.add_k_stride[0] + hkv * p.add_k_stride[2];
  const Elem* gAV =
      static_cast<const Elem*>(p.add_v) + b * p.add_v_stride[0] + hkv * p.add_v_stride[2];
  const int n = t.add_begin + row;
  k = gAK + n * p.add_k_stride[1];
  v = gAV + n * p.add_v_stride[1];
  return n < p.num_add;
}

// The window of query row `row` of the tile at `qo`.
template <class QT>
__device__ __forceinline__ RowWindow row_window(const Geometry& geo, const Group& gr,
                                                const int (&qo)[kAxes], int row) {
  int q[kAxes];
  QT::coord(row, q);
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax) q[ax] += qo[ax];
  return RowWindow::of(geo, gr, q);
}

// The CTA's key-tile span into shared memory `s` (over the tile's queries before ft.qhi), one axis
// per warp (lane 0 of the last kAxes of
// the CTA's kWarps warps, the ones init_windows leaves idle when the tile has fewer rows than
// threads), so that the axes' integer divisions run side by side instead of one after another on
// one thread. The caller's barrier publishes it.
template <class QT, class KT, int kWarps>
__device__ __forceinline__ void kv_span_by_warps(const Geometry& geo, const FwdTile& ft, KvSpan& s,
                                                 int warp, int lane) {
  if (lane != 0) return;
  if constexpr (kWarps < kAxes) {
    if (warp == 0) s = kv_span<QT, KT>(geo, ft.gr, ft.qo, ft.qhi);
    return;
  }
  // Constant axis numbers, so that the per-axis arrays are indexed statically (no local memory).
  if (warp == kWarps - 1) kv_span_axis<QT, KT>(geo, ft.gr, ft.qo, ft.qhi, 2, s);
  else if (warp == kWarps - 2) kv_span_axis<QT, KT>(geo, ft.gr, ft.qo, ft.qhi, 1, s);
  else if (warp == kWarps - 3) kv_span_axis<QT, KT>(geo, ft.gr, ft.qo, ft.qhi, 0, s);
}

// Every query row's window, once per CTA (made visible by the next barrier).
template <class Tr, class QT>
__device__ __forceinline__ void init_windows(const Geometry& geo, const Group& gr,
                                             const int (&qo)[kAxes], RowWindow* sWin) {
  for (int row = threadIdx.x; row < Tr::kQ; row += Tr::kThreads)
    sWin[row] = row_window<QT>(geo, gr, qo, row);
}

template <class Tr>
__device__ __forceinline__ void init_state(FwdState<Tr>& st) {
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt) {
#pragma unroll
    for (int j = 0; j < Tr::kD / 8; ++j)
      st.o[mt][j][0] = st.o[mt][j][1] = st.o[mt][j][2] = st.o[mt][j][3] = 0.f;
    st.m[mt][0] = st.m[mt][1] = -INFINITY;
    st.l[mt][0] = st.l[mt][1] = 0.f;
  }
}

// The row sum of row r of m-tile mt of this thread, finished across the quad (every lane calls
// it: shuffles).
template <class Tr>
__device__ __forceinline__ float row_sum(const FwdState<Tr>& st, int mt, int r) {
  float l = st.l[mt][r];
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l;
}

// Epilogue of one query row (row r of m-tile mt of this thread, row sum l from row_sum):
// normalize, store O (and LSE) at local coordinates `q`, nothing past an axis's end or outside
// the query region.
// kRegion = false: the caller never runs with a query region (the strip and box forwards, which
// the plan rules out for one) and may leave ft.qlo / qhi unset: rows are tested against the group.
template <class Tr, class T, bool kRegion = true>
__device__ __forceinline__ void store_row(const FwdState<Tr>& st, const FwdParams& p,
                                          const FwdTile& ft, int mt, int r, float l,
                                          const int (&q)[kAxes], int lane) {
  using Elem = typename Tr::Elem;
  constexpr int kFirst = Tr::kFirstAxis;
  Elem* gO = static_cast<Elem*>(p.o) + ft.b * p.o_stride[0] + ft.h * p.o_stride[4];
  bool valid = true;
#pragma unroll
  for (int ax = 0; ax < kAxes; ++ax)
    valid = valid && (kRegion ? q[ax] >= ft.qlo[ax] && q[ax] < ft.qhi[ax] : q[ax] < ft.gr.len[ax]);
  if (!valid) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  Elem* row = gO + token_offset<kFirst>(p.geo, ft.gr, q, p.o_stride);
#pragma unroll
  for (int j = 0; j < Tr::kD / 8; ++j) {
    const int col = j * 8 + 2 * (lane & 3);
    if (col >= p.dim_v) continue;
    if constexpr (Tr::kF32)
      *reinterpret_cast<float2*>(row + col) =
          make_float2(st.o[mt][j][2 * r] * inv, st.o[mt][j][2 * r + 1] * inv);
    else
      *reinterpret_cast<uint32_t*>(row + col) =
          mma::pack2<T>(st.o[mt][j][2 * r] * inv, st.o[mt][j][2 * r + 1] * inv);
  }
  if (p.lse != nullptr && (lane & 3) == 0) {
    float* lse = p.lse + ft.b * p.lse_stride[0] + ft.h * p.lse_stride[4] +
                 token_offset<kFirst>(p.geo, ft.gr, q, p.lse_stride);
    *lse = (st.m[mt][r] + log2f(l)) * 0.69314718055994531f;
  }
}

// Epilogue: every row of the warp's m-tiles (row_sum, store_row). `row0`: the warp's first row in the
// query tile.
template <class Tr, class T, class QT>
__device__ __forceinline__ void store_output(const FwdState<Tr>& st, const FwdParams& p,
                                             const FwdTile& ft, int row0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = row_sum(st, mt, r);
      int q[kAxes];
      QT::coord(row0 + mt * 16 + (lane >> 2) + 8 * r, q);
#pragma unroll
      for (int ax = 0; ax < kAxes; ++ax) q[ax] += ft.qo[ax];
      store_row<Tr, T>(st, p, ft, mt, r, l, q, lane);
    }
  }
}

}  // namespace fused
}  // namespace fna
