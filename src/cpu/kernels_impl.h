// The CPU tile kernels, written once with GCC vector extensions (which clang also takes) and
// compiled once per instruction set: each kernels_<isa>.cpp defines FNA_CPU_ISA (a namespace) and
// FNA_CPU_VW (floats per vector), sets the target (`#pragma GCC target`; clang: `#pragma clang
// attribute`), and includes this file AFTER every standard header, so that nothing shared (inline
// std functions) is ever compiled with a wider ISA than the CPU may have.
// No std:: templates are used below for the same reason.
//
// Queries are processed in groups of up to kGroup neighbors whose windows fit in one span of
// columns (13-wide windows of 4 consecutive queries fit one 16-lane vector). Scores are vectorized
// over key columns: the keys of a row are stored transposed ([d][column]), so each loaded key
// vector feeds kGroup FMAs (one broadcast of q[d] per query) with all accumulators in registers;
// lanes outside a query's own window are masked to -inf, so P is exactly 0 there. P V, dQ, dK and
// dV are vectorized over the head dim in the same grouped way. Softmax is exact (two passes over
// the buffered scores of the whole window) rather than online: a query's window always fits in
// the score buffer, so there is nothing to rescale. One call can take two tiles of one shape (the
// same tile of two adjacent lines): their scores are computed together, each key vector of a row
// both boxes hold feeding 2 * kGroup FMAs (tile_scores).
//
// Caveat of the span design: P V (and dS K in the backward) multiplies exact zeros with the value
// (key) rows of the other windows of the query's group, so a non-finite V (K) entry there (inf,
// NaN) would leak as NaN into its neighbors. Scores of masked lanes are replaced, not multiplied.

#include "cpu/kernels_vector.h"

namespace fna {
namespace cpu {
namespace FNA_CPU_ISA {

// Softmax pieces over the scores of a query group (kernels_products.h: Group): NQ queries' planes, qstride
// floats apart, each R rows of Wspan floats, of which the lanes [lo[g], hi[g]) hold query g's
// scores (the others belong to other queries of the group: masked, i.e. never computed with, and
// replaced by exact zeros). The queries run interleaved, NQ independent dependency chains.
template <int NQ>
struct GroupLanes {
  vi in[NQ];  // per query, which lanes of span vector c are its own
  GroupLanes(const int* lo, const int* hi, int c) {
    const vi l = lanes() + c;
    for (int g = 0; g < NQ; ++g) in[g] = (l >= lo[g]) & (l < hi[g]);
  }
};

// m[g] = the max of query g's lanes (rows first, unmasked: the lanes' masks do not depend on the row).
template <int NQ>
static void group_max(const float* s, int64_t qstride, int R, int Wspan, const int* lo, const int* hi, float* m) {
  const vf ninf = splat(-__builtin_inff());
  vf mv[NQ];
  for (int g = 0; g < NQ; ++g) mv[g] = ninf;
  for (int c = 0; c < Wspan; c += kVW) {
    const GroupLanes<NQ> gl(lo, hi, c);
    vf mr[NQ];
    for (int g = 0; g < NQ; ++g) mr[g] = ninf;
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < NQ; ++g) mr[g] = vmax(mr[g], ld(s + g * qstride + static_cast<int64_t>(r) * Wspan + c));
    for (int g = 0; g < NQ; ++g) mv[g] = vmax(mv[g], gl.in[g] ? mr[g] : ninf);
  }
  for (int g = 0; g < NQ; ++g) m[g] = hmax(mv[g]);
}

// s <- 2^(s - sub[g]) on query g's lanes, exact zeros on the others; l[g] = the sum. The scores
// are already scaled (base 2; tile_scores) and sub[g] is the max of the same stored floats, so
// s - sub[g] <= 0 exactly: no rounded max is subtracted from an unrounded (fused) product, whose
// difference went positive at large scores (2^+512: inf, or a wrapped exponent; issue 28).
template <int NQ>
static void group_exp(float* s, int64_t qstride, int R, int Wspan, const int* lo, const int* hi,
                      const float* sub, float* l) {
  const vf zero = vf{};
  vf sum[NQ], sv[NQ];
  for (int g = 0; g < NQ; ++g) sum[g] = zero, sv[g] = splat(sub[g]);
  for (int c = 0; c < Wspan; c += kVW) {
    const GroupLanes<NQ> gl(lo, hi, c);
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < NQ; ++g) {
        float* row = s + g * qstride + static_cast<int64_t>(r) * Wspan + c;
        const vf p = gl.in[g] ? exp2v(ld(row) - sv[g]) : zero;
        st(row, p);
        sum[g] += p;
      }
  }
  for (int g = 0; g < NQ; ++g) l[g] = hsum(sum[g]);
}

// The two above for nq <= kGroup queries (max: m != nullptr, else exp).
static void group_softmax_step(int nq, float* s, int64_t qstride, int R, int Wspan, const int* lo, const int* hi,
                               float* m, const float* sub, float* l) {
#define FNA_CPU_STEP(NQ)                                                       \
  if (m) group_max<NQ>(s, qstride, R, Wspan, lo, hi, m);                       \
  else group_exp<NQ>(s, qstride, R, Wspan, lo, hi, sub, l);
  switch (nq) {
    case 1: FNA_CPU_STEP(1) break;
    case 2: FNA_CPU_STEP(2) break;
    case 3: FNA_CPU_STEP(3) break;
    default: FNA_CPU_STEP(4) break;
  }
#undef FNA_CPU_STEP
}

// A tile's prefetch hints (tile.h: Prefetch), issued one at a time from inside the FMA loops
// (every few iterations), so that they trickle out while the math runs and never stall on full
// line-fill buffers the way a burst does; finish() issues whatever is left.
struct Hints {
  const char* const* p;
  int n, lines, i = 0, l = 0;
  explicit Hints(const Prefetch& pf) : p(pf.rows), n(pf.n), lines(pf.lines) {}
  inline void one() {
    if (i < n) {
      __builtin_prefetch(p[i] + 64 * l, 0, 2);  // to L2 (prefetcht1)
      if (++l == lines) l = 0, ++i;
    }
  }
  void finish() {
    while (i < n) one();
  }
};

#include "cpu/kernels_products.h"

// ---- Whole tiles. All groups of a tile read the same key box shifted by a few columns, so the
// loops run chunk-major (a chunk of the head dim, or of the rows, for every group) to reuse the
// box from L1 instead of streaming it from L2 once per group.
#ifndef FNA_CPU_DCHUNK  // tuning knobs (compile-time overridable for experiments)
#define FNA_CPU_DCHUNK 64  // measured (13x13, D = 64, key panels in L2): 64 beats 32 and 16
#endif
#ifndef FNA_CPU_RCHUNK
#define FNA_CPU_RCHUNK 8
#endif
constexpr int kDChunk = FNA_CPU_DCHUNK;
constexpr int kRChunk = FNA_CPU_RCHUNK;

static int tile_groups(const TileShape& s, Group* out) {
  int n = 0;
  for (int t0 = 0; t0 < s.T; t0 = out[n++].t1) out[n] = next_group(s, t0);
  return n;
}

// dst[d * xs + g] = x[g * xpitch + d] for 4 rows (g < 4) and d < dc rounded up to kVW (the rows
// are readable that far: padded to the vector width), xs = 4 or 8: the queries of a group
// interleaved for group_dot, by in-register shuffles (a scalar loop was ~5% of the forward).
struct Interleave4Masks {
  int m[4][kVW];
};
static constexpr Interleave4Masks make_interleave4_masks() {
  Interleave4Masks r{};
  for (int m = 0; m < kVW / 2; ++m) {  // pairs (a[m], b[m]) of the low / high halves
    r.m[0][2 * m] = m, r.m[0][2 * m + 1] = kVW + m;
    r.m[1][2 * m] = kVW / 2 + m, r.m[1][2 * m + 1] = kVW + kVW / 2 + m;
  }
  for (int m = 0; m < kVW / 4; ++m)  // quads from pairs m (low half) / kVW / 4 + m (high half)
    for (int e = 0; e < 4; ++e) {
      r.m[2][4 * m + e] = (e < 2 ? 0 : kVW - 2) + 2 * m + e;
      r.m[3][4 * m + e] = (e < 2 ? 0 : kVW - 2) + 2 * (m + kVW / 4) + e;
    }
  return r;
}
static constexpr Interleave4Masks kInterleave4 = make_interleave4_masks();
#if defined(__clang__)
template <int W>
struct Il4 {
  static constexpr int at(int l) { return kInterleave4.m[W][l]; }
};
#endif
#if !defined(__clang__)
static inline vi interleave4_mask(int w) {
  vi v;
  __builtin_memcpy(&v, kInterleave4.m[w], sizeof(v));
  return v;
}
#endif
static_assert(kDChunk % kVW == 0, "interleave4 writes whole vectors of d");
static inline void interleave4(const float* x, int64_t xpitch, int dc, float* dst, int xs, float mult) {
  const vf mv = splat(mult);
#if !defined(__clang__)
  const vi m0 = interleave4_mask(0), m1 = interleave4_mask(1), m2 = interleave4_mask(2), m3 = interleave4_mask(3);
#endif
  for (int d = 0; d < dc; d += kVW) {
    const vf a0 = ld(x + d), a1 = ld(x + xpitch + d), a2 = ld(x + 2 * xpitch + d), a3 = ld(x + 3 * xpitch + d);
#if defined(__clang__)
    const vf p = shuffle2<Il4<0>>(a0, a1), q = shuffle2<Il4<1>>(a0, a1);
    const vf r = shuffle2<Il4<0>>(a2, a3), t = shuffle2<Il4<1>>(a2, a3);
    vf out[4] = {shuffle2<Il4<2>>(p, r) * mv, shuffle2<Il4<3>>(p, r) * mv,
                 shuffle2<Il4<2>>(q, t) * mv, shuffle2<Il4<3>>(q, t) * mv};
#else
    const vf p = __builtin_shuffle(a0, a1, m0), q = __builtin_shuffle(a0, a1, m1);
    const vf r = __builtin_shuffle(a2, a3, m0), t = __builtin_shuffle(a2, a3, m1);
    vf out[4] = {__builtin_shuffle(p, r, m2) * mv, __builtin_shuffle(p, r, m3) * mv,
                 __builtin_shuffle(q, t, m2) * mv, __builtin_shuffle(q, t, m3) * mv};
#endif
    float* o = dst + static_cast<int64_t>(d) * xs;
    if (xs == 4) {
      for (int j = 0; j < 4; ++j) st(o + j * kVW, out[j]);
    } else {  // 4 floats per d, xs apart
      const float* f = reinterpret_cast<const float*>(out);
      for (int j = 0; j < kVW; ++j) __builtin_memcpy(o + j * xs, f + 4 * j, 4 * sizeof(float));
    }
  }
}

// One tile's part in a score pass (tile_scores): its queries' rows x[t] = xs + t * xpitch, its
// box rows, and its score buffer.
struct ScoreSide {
  const float* xs;
  int xpitch;
  const float* const* rows;
  float* buf;
};

// A run of n box rows: [a, a + n) of tile 0 and / or [b, b + n) of tile 1 (-1: none of its rows),
// the same panel rows when both.
struct RowRun {
  int a, b, n;
};

// The rows of tiles 0 and 1 (R each, in the same order, those both read being the same
// pointers) as runs: shared, then each tile's own (rows_b null: one run of tile 0's).
static int row_runs(const float* const* ra, const float* const* rb, int R, RowRun* out) {
  if (!rb) {
    out[0] = {0, -1, R};
    return 1;
  }
  auto find = [R](const float* const* rows, int from, const float* p) {
    for (int i = from; i < R; ++i)
      if (rows[i] == p) return true;
    return false;
  };
  int n = 0, i = 0, j = 0;
  while (i < R || j < R) {
    RowRun run;
    if (i < R && j < R && ra[i] == rb[j]) {
      run = {i, j, 0};
      while (i < R && j < R && ra[i] == rb[j]) ++i, ++j, ++run.n;
    } else if (j == R || (i < R && !find(rb, j, ra[i]))) {
      run = {i++, -1, 1};
    } else {
      run = {-1, j++, 1};
    }
    const RowRun* last = n > 0 ? &out[n - 1] : nullptr;  // one tile's rows in a row: one run
    if (last && run.n == 1 && (run.a < 0) == (last->a < 0) && (run.b < 0) == (last->b < 0) &&
        (run.a < 0 || run.a == last->a + last->n) && (run.b < 0 || run.b == last->b + last->n))
      ++out[n - 1].n;
    else
      out[n++] = run;
  }
  return n;
}

// side[k].buf[t0 * plane + g * R * Wspan ..] = scores of every group (each query value times
// `mult` first: the softmax's scale * log2(e), so that the scores come out scaled and in base 2
// without a product left to fuse with the max's subtraction), for n <= 2 tiles of one
// shape (the same last-axis window geometry: the same groups): box rows both tiles read (two
// lines' windows overlap in all but a row or two) are loaded once for both tiles' queries,
// 2 * kGroup FMAs per key vector instead of kGroup (which the split key loads needed).
// Loop order: a chunk of D, then a batch of rows, then every group, so that the keys all groups
// read (the batch's rows x the chunk's dims x the tile's columns) are reused from L1 / L2 while
// the groups sweep over them, instead of being streamed once per group.
static void tile_scores(const TileShape& s, const Group* grs, int ng, int D, int pitch, const ScoreSide* side,
                        int n, int64_t plane, float mult, Hints* hints) {
  constexpr int kMaxRows = 256;
  if (n > 1 && s.R > kMaxRows) {  // (more rows than runs[] holds: each tile alone)
    for (int k = 0; k < n; ++k) tile_scores(s, grs, ng, D, pitch, side + k, 1, plane, mult, hints);
    return;
  }
  RowRun runs[2 * kMaxRows];
  const int nr = row_runs(side[0].rows, n > 1 ? side[1].rows : nullptr, s.R, runs);
  const int xs = n * kGroup;  // per group: both tiles' queries of a d, then the next d
  float xi[kTileQueries * 2 * kGroup * kDChunk];
  for (int d0 = 0; d0 < D; d0 += kDChunk) {
    const int d1 = D - d0 < kDChunk ? D : d0 + kDChunk, dc = d1 - d0;
    for (int k = 0; k < n; ++k)
      for (int i = 0; i < ng; ++i) {
        const int nq = grs[i].t1 - grs[i].t0;
        float* dst = xi + i * xs * kDChunk + k * nq;
        const float* x = side[k].xs + static_cast<int64_t>(grs[i].t0) * side[k].xpitch + d0;
        if (nq == 4)
          interleave4(x, side[k].xpitch, dc, dst, xs, mult);
        else
          for (int g = 0; g < nq; ++g)
            for (int d = 0; d < dc; ++d) dst[d * xs + g] = x[static_cast<int64_t>(g) * side[k].xpitch + d] * mult;
      }
    for (int u = 0; u < nr; ++u) {
      const RowRun& run = runs[u];
      const int tiles = run.a >= 0 && run.b >= 0 ? 2 : 1;
      for (int r0 = 0; r0 < run.n;) {
        const int r1 = batch_end(r0, run.n, max_np(tiles * kGroup));
        for (int i = 0; i < ng; ++i) {
          const Group& gr = grs[i];
          const int nq = gr.t1 - gr.t0;
          const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
          float* out[2 * kGroup];
          int m = 0;
          if (run.a >= 0)
            for (int g = 0; g < nq; ++g) out[m++] = side[0].buf + gr.t0 * plane + g * qstride + run.a * gr.Wspan;
          if (run.b >= 0)
            for (int g = 0; g < nq; ++g) out[m++] = side[1].buf + gr.t0 * plane + g * qstride + run.b * gr.Wspan;
          const float* const* rows = run.a >= 0 ? side[0].rows + run.a : side[1].rows + run.b;
          const float* x = xi + i * xs * kDChunk + (run.a >= 0 ? 0 : nq);
          group_scores(hints, 4, m, x, xs, d0, d1, rows, r0, r1, pitch, gr.cb, gr.Wspan, out);
        }
        r0 = r1;
      }
    }
  }
}

// out[t] = sum over rows and span columns of the group's weights x rows[r][cb + c][:].
static void tile_weighted_rows(const TileShape& s, const Group* grs, int ng, const float* buf,
                               int64_t plane, const float* const* rows, int64_t rpitch, int nvec,
                               float* outs, int opitch, Hints* hints) {
  for (int r0 = 0; r0 < s.R; r0 += kRChunk) {
    const int r1 = s.R - r0 < kRChunk ? s.R : r0 + kRChunk;
    for (int i = 0; i < ng; ++i) {
      const Group& gr = grs[i];
      float* out[kGroup];
      for (int g = 0; g < gr.t1 - gr.t0; ++g) out[g] = outs + static_cast<int64_t>(gr.t0 + g) * opitch;
      group_weighted_rows(hints, gr.t1 - gr.t0, gr.diag, buf + gr.t0 * plane + static_cast<int64_t>(r0) * gr.Wspan,
                          r1 - r0, gr.Wspan, gr.span, rows + r0, rpitch, gr.cb, nvec, out, r0 > 0,
                          static_cast<int64_t>(s.R) * gr.Wspan);
    }
  }
}

// rows[r][cb + c][:] += sum_t w_t[r][c] * mult * x_t for every group (dK, dV).
static void tile_outer(const TileShape& s, const Group* grs, int ng, const float* buf,
                       int64_t plane, const float* xs, int xpitch, float mult,
                       float* const* rows, int rpitch, int nvec, Hints* hints) {
  for (int r0 = 0; r0 < s.R; r0 += kRChunk) {
    const int r1 = s.R - r0 < kRChunk ? s.R : r0 + kRChunk;
    for (int i = 0; i < ng; ++i) {
      const Group& gr = grs[i];
      const float* x[kGroup];
      for (int g = 0; g < gr.t1 - gr.t0; ++g) x[g] = xs + static_cast<int64_t>(gr.t0 + g) * xpitch;
      group_outer_all(hints, gr.t1 - gr.t0, gr.diag, buf + gr.t0 * plane + static_cast<int64_t>(r0) * gr.Wspan,
                      static_cast<int64_t>(s.R) * gr.Wspan, r1 - r0, gr.Wspan, gr.span, x, mult, rows + r0,
                      rpitch, gr.cb, nvec);
    }
  }
}

// Room per query in the score buffers: R rows of the widest group span.
static int64_t tile_plane(const TileShape& s) {
  int wmax = 0;
  for (int t = 0; t < s.T; ++t) wmax = s.col_count[t] > wmax ? s.col_count[t] : wmax;
  return static_cast<int64_t>(s.R) * padded_window(wmax + kGroup, kVW);
}

// ---- Panel conversion: out[e][c] = rows[c][e] for c < kVW, e < dim (rows: n <= kVW rows,
// row_pitch floats apart, readable up to dim rounded up to kVW; rows c >= n read as zeros; out
// rows are pitch floats apart).
// An in-register transpose of kVW x kVW blocks: log2(kVW) stages, each swapping one bit of the
// row index with the same bit of the lane index, one two-input shuffle per row.
#if defined(__clang__)
template <int S>
struct StageLo {
  static constexpr int at(int l) { return (l & S) ? kVW + l - S : l; }
};
template <int S>
struct StageHi {
  static constexpr int at(int l) { return (l & S) ? kVW + l : l + S; }
};
template <int S>
static inline void transpose_stage(vf* a) {
  for (int i = 0; i < kVW; ++i)
    if (!(i & S)) {
      const vf x = a[i], y = a[i + S];
      a[i] = shuffle2<StageLo<S>>(x, y);
      a[i + S] = shuffle2<StageHi<S>>(x, y);
    }
}
#else
template <int S>
static inline void transpose_stage(vf* a) {
  vi lo, hi;  // lanes of the pair (i, i + S): from a[i] / a[i + S] (second operand: + kVW)
  for (int l = 0; l < kVW; ++l) {
    lo[l] = (l & S) ? kVW + l - S : l;
    hi[l] = (l & S) ? kVW + l : l + S;
  }
  for (int i = 0; i < kVW; ++i)
    if (!(i & S)) {
      const vf x = a[i], y = a[i + S];
      a[i] = __builtin_shuffle(x, y, lo);
      a[i + S] = __builtin_shuffle(x, y, hi);
    }
}
#endif

void transpose_rows(const float* rows, int row_pitch, int n, int dim, float* out, int64_t pitch) {
  for (int e0 = 0; e0 < dim; e0 += kVW) {
    vf a[kVW];
    for (int c = 0; c < kVW; ++c) a[c] = c < n ? ld(rows + static_cast<int64_t>(c) * row_pitch + e0) : vf{};
    transpose_stage<1>(a);
    transpose_stage<2>(a);
#if FNA_CPU_VW >= 8
    transpose_stage<4>(a);
#endif
#if FNA_CPU_VW >= 16
    transpose_stage<8>(a);
#endif
    const int ne = dim - e0 < kVW ? dim - e0 : kVW;
    for (int e = 0; e < ne; ++e) st(out + static_cast<int64_t>(e0 + e) * pitch, a[e]);
  }
}

// The relative positional bias (tile.h: TileBias) added to the scores in `buf` (base 2, like
// the table), whole vectors of each group's span: a query's own lanes [lo, hi) get its entries;
// its other lanes get neighbouring entries of the padded table (cpu/driver.h: BiasTables), which
// nothing reads as scores (group_max and group_exp mask them, and exp writes exact zeros there).
static void tile_add_bias(const TileShape& s, const Group* grs, int ng, int64_t plane, const TileBias& b,
                          float* buf) {
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    for (int t = gr.t0; t < gr.t1; ++t) {
      float* sq = buf + gr.t0 * plane + (t - gr.t0) * qstride;
      const float* src_t = b.table + b.col[t] + gr.cb;
      for (int r = 0; r < s.R; ++r) {
        float* row = sq + static_cast<int64_t>(r) * gr.Wspan;
        const float* src = src_t + b.row[r];
        for (int c = 0; c < gr.Wspan; c += kVW) st(row + c, ld(row + c) + ld(src + c));
      }
    }
  }
}

// The bias's gradient: d_bias[row[r] + col[t] + m] += dS of every pair of the tile (`ds` laid out
// as the scores).
static void tile_bias_grad(const TileShape& s, const Group* grs, int ng, int64_t plane, const TileBias& b,
                           const float* ds, double* d_bias) {
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    for (int t = gr.t0; t < gr.t1; ++t) {
      const int lo = s.col_begin[t] - gr.cb, hi = lo + s.col_count[t];
      const float* sq = ds + gr.t0 * plane + (t - gr.t0) * qstride;
      for (int r = 0; r < s.R; ++r) {
        const float* row = sq + static_cast<int64_t>(r) * gr.Wspan;
        double* dst = d_bias + b.row[r] + b.col[t] + gr.cb;
        for (int c = lo; c < hi; ++c) dst[c] += row[c];
      }
    }
  }
}

// A forward tile once its scores are in its scratch: softmax, P V, normalization, LSE.
static void forward_finish(const ForwardTile& a, const Group* grs, int ng, int64_t plane, Hints* hints) {
  const TileShape& s = a.s;
  float* sc = a.scratch;
  float* sadd = a.scratch + s.T * plane;
  float l[kTileQueries], m[kTileQueries];
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    int lo[kGroup], hi[kGroup];
    const int nq = group_lanes(s, gr, lo, hi);
    float* sg = sc + gr.t0 * plane;
    group_softmax_step(nq, sg, qstride, s.R, gr.Wspan, lo, hi, m + gr.t0, nullptr, nullptr);
    for (int t = gr.t0; t < gr.t1; ++t) {
      float* ag = sadd + static_cast<int64_t>(t) * s.A;
      const float* x = a.q + static_cast<int64_t>(t) * a.q_pitch;
      for (int n = 0; n < s.A; ++n) {
        ag[n] = scaled_dot(x, a.scale_log2, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp);
        m[t] = ag[n] > m[t] ? ag[n] : m[t];
      }
    }
    group_softmax_step(nq, sg, qstride, s.R, gr.Wspan, lo, hi, nullptr, m + gr.t0, l + gr.t0);
    for (int t = gr.t0; t < gr.t1; ++t)
      for (int n = 0; n < s.A; ++n) {
        float* ag = sadd + static_cast<int64_t>(t) * s.A;
        ag[n] = exp2s(ag[n] - m[t]);
        l[t] += ag[n];
      }
  }
  tile_weighted_rows(s, grs, ng, sc, plane, a.v_rows, s.Dvp, s.Dvp / kVW, a.o, a.o_pitch, hints);
  for (int t = 0; t < s.T; ++t) {
    float* o = a.o + static_cast<int64_t>(t) * a.o_pitch;
    for (int n = 0; n < s.A; ++n)
      axpy(sadd[static_cast<int64_t>(t) * s.A + n], a.add_v + static_cast<int64_t>(n) * s.Dvp, o, s.Dvp);
    const float inv = 1.f / l[t];
    for (int e = 0; e < s.Dvp; e += kVW) st(o + e, ld(o + e) * inv);
    // log2 -> natural log: lse = (m + log2 l) * ln 2.
    a.lse[t] = (m[t] + __builtin_log2f(l[t])) * 0.69314718055994531f;
  }
}

// n <= 2 tiles of one shape (tile.h: Kernels::forward).
void forward_tiles(const ForwardTile* a, int n) {
  const TileShape& s = a[0].s;
  Group grs[kTileQueries] = {};
  const int ng = tile_groups(s, grs);
  const int64_t plane = tile_plane(s);
  Hints hints(a[0].prefetch);
  ScoreSide side[2] = {};
  for (int k = 0; k < n; ++k) side[k] = {a[k].q, a[k].q_pitch, a[k].kt_rows, a[k].scratch};
  tile_scores(s, grs, ng, s.D, a[0].pitch, side, n, plane, a[0].scale_log2, &hints);
  for (int k = 0; k < n; ++k)
    if (a[k].bias.table) tile_add_bias(s, grs, ng, plane, a[k].bias, a[k].scratch);
  for (int k = 0; k < n; ++k) forward_finish(a[k], grs, ng, plane, &hints);
  hints.finish();
}

// A backward tile once P's scores and dP are in its scratch: dS, dQ = dS K, dK += scale dS^T Q,
// dV += P^T dO. Masked lanes hold P = dS = 0, so the span-wide products add exact zeros (the box
// panels have slack columns beyond M for the span's padding).
// P is exp2(s - m) / l with the row's max m and sum l recomputed here, as the forward did (the
// whole window is in the buffer), not exp2(s - LSE) from the saved float32 LSE: that LSE is only
// good to |LSE| * 2^-24, which multiplies every weight by up to e^(|LSE| * 2^-24) (1e-4 at
// scores ~1e3; 0 or inf beyond ~1e9). The LSE input is not read.
static void backward_finish(const BackwardTile& a, const Group* grs, int ng, int64_t plane, Hints* hints) {
  const TileShape& s = a.s;
  // D_i = rowsum(dO * O), less the gradient into the row's LSE (d LSE / d s_ij = P_ij, so it adds
  // P_ij * d_lse_i to dS_ij).
  for (int t = 0; t < s.T; ++t)
    a.delta[t] = static_cast<float>(dot_f64(a.d_o + static_cast<int64_t>(t) * a.do_pitch,
                                            a.o + static_cast<int64_t>(t) * a.o_pitch, s.Dvp) -
                                    (a.d_lse ? static_cast<double>(a.d_lse[t]) : 0.0));
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    int lo[kGroup], hi[kGroup];
    float m[kGroup], l[kGroup];
    const int nq = group_lanes(s, gr, lo, hi);
    float* pg0 = a.p + gr.t0 * plane;
    group_softmax_step(nq, pg0, qstride, s.R, gr.Wspan, lo, hi, m, nullptr, nullptr);
    for (int t = gr.t0; t < gr.t1; ++t) {  // the additional keys' scores (into p_add)
      float* pa = a.p_add + static_cast<int64_t>(t) * s.A;
      const float* x = a.q + static_cast<int64_t>(t) * a.q_pitch;
      float& mt = m[t - gr.t0];
      for (int n = 0; n < s.A; ++n) {
        pa[n] = scaled_dot(x, a.scale_log2, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp);
        mt = pa[n] > mt ? pa[n] : mt;
      }
    }
    group_softmax_step(nq, pg0, qstride, s.R, gr.Wspan, lo, hi, nullptr, m, l);
    for (int t = gr.t0; t < gr.t1; ++t) {
      float* pa = a.p_add + static_cast<int64_t>(t) * s.A;
      float& lt = l[t - gr.t0];
      for (int n = 0; n < s.A; ++n) {
        pa[n] = exp2s(pa[n] - m[t - gr.t0]);
        lt += pa[n];
      }
      const float inv = 1.f / lt;
      for (int n = 0; n < s.A; ++n) pa[n] *= inv;
      float* pg = pg0 + (t - gr.t0) * qstride;
      float* dg = a.ds + gr.t0 * plane + (t - gr.t0) * qstride;
      const vf delta = splat(a.delta[t]), vinv = splat(inv);
      for (int64_t c = 0; c < qstride; c += kVW) {
        const vf p = ld(pg + c) * vinv;
        st(pg + c, p);
        st(dg + c, p * (ld(dg + c) - delta));
      }
    }
  }
  if (a.bias.table) tile_bias_grad(s, grs, ng, plane, a.bias, a.ds, a.d_bias);
  tile_weighted_rows(s, grs, ng, a.ds, plane, a.k_rows, s.Dp, s.Dp / kVW, a.dq, a.dq_pitch, hints);
  tile_outer(s, grs, ng, a.ds, plane, a.q, a.q_pitch, a.scale, a.dk_rows, s.Dp, s.Dp / kVW, hints);
  tile_outer(s, grs, ng, a.p, plane, a.d_o, a.do_pitch, 1.f, a.dv_rows, s.Dvp, s.Dvp / kVW, hints);
  for (int t = 0; t < s.T; ++t) {
    const float* y = a.d_o + static_cast<int64_t>(t) * a.do_pitch;
    float* dq = a.dq + static_cast<int64_t>(t) * a.dq_pitch;
    for (int n = 0; n < s.A; ++n) {
      const float pn = a.p_add[static_cast<int64_t>(t) * s.A + n];
      const float dpn = dot(y, a.add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
      const float dsn = pn * (dpn - a.delta[t]);
      a.ds_add[static_cast<int64_t>(t) * s.A + n] = dsn;
      axpy(dsn, a.add_k + static_cast<int64_t>(n) * s.Dp, dq, s.Dp);
    }
    const vf sc = splat(a.scale);
    for (int e = 0; e < s.Dp; e += kVW) st(dq + e, ld(dq + e) * sc);
  }
  for (int n = 0; n < s.A; ++n)
    for (int t = 0; t < s.T; ++t) {
      axpy(a.ds_add[static_cast<int64_t>(t) * s.A + n] * a.scale, a.q + static_cast<int64_t>(t) * a.q_pitch,
           a.d_add_k + static_cast<int64_t>(n) * s.Dp, s.Dp);
      axpy(a.p_add[static_cast<int64_t>(t) * s.A + n], a.d_o + static_cast<int64_t>(t) * a.do_pitch,
           a.d_add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
    }
}

// n <= 2 tiles of one shape (tile.h: Kernels::backward): P's scores and dP, then the rest.
void backward_tiles(const BackwardTile* a, int n) {
  const TileShape& s = a[0].s;
  for (int k = 0; k < n; ++k)  // O is first read at the end (rowsum(dO * O)): ask for it now
    for (int t = 0; t < s.T; ++t)
      for (int e = 0; e < s.Dvp; e += 64 / static_cast<int>(sizeof(float)))
        __builtin_prefetch(a[k].o + static_cast<int64_t>(t) * a[k].o_pitch + e);
  Group grs[kTileQueries] = {};
  const int ng = tile_groups(s, grs);
  const int64_t plane = tile_plane(s);
  Hints hints(a[0].prefetch);
  ScoreSide side[2] = {};
  for (int k = 0; k < n; ++k) side[k] = {a[k].q, a[k].q_pitch, a[k].kt_rows, a[k].p};
  tile_scores(s, grs, ng, s.D, a[0].pitch, side, n, plane, a[0].scale_log2, &hints);
  for (int k = 0; k < n; ++k)
    if (a[k].bias.table) tile_add_bias(s, grs, ng, plane, a[k].bias, a[k].p);
  for (int k = 0; k < n; ++k) side[k] = {a[k].d_o, a[k].do_pitch, a[k].vt_rows, a[k].ds};
  tile_scores(s, grs, ng, s.Dv, a[0].pitch, side, n, plane, 1.f, &hints);  // dP
  for (int k = 0; k < n; ++k) backward_finish(a[k], grs, ng, plane, &hints);
  hints.finish();
}

}  // namespace FNA_CPU_ISA
}  // namespace cpu
}  // namespace fna
