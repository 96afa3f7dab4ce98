// The CPU tile kernels, written once with GCC vector extensions and compiled once per instruction
// set: each kernels_<isa>.cpp defines FNA_CPU_ISA (a namespace) and FNA_CPU_VW (floats per vector),
// sets `#pragma GCC target`, and includes this file AFTER every standard header, so that nothing
// shared (inline std functions) is ever compiled with a wider ISA than the CPU may have.
// No std:: templates are used below for the same reason.
//
// Queries are processed in groups of up to kGroup neighbors whose windows fit in one span of
// columns (13-wide windows of 4 consecutive queries fit one 16-lane vector). Scores are vectorized
// over key columns: the keys of a row are stored transposed ([d][column]), so each loaded key
// vector feeds kGroup FMAs (one broadcast of q[d] per query) with all accumulators in registers;
// lanes outside a query's own window are masked to -inf, so P is exactly 0 there. P V, dQ, dK and
// dV are vectorized over the head dim in the same grouped way. Softmax is exact (two passes over
// the buffered scores of the whole window) rather than online: a query's window always fits in
// the score buffer, so there is nothing to rescale.
//
// Caveat of the span design: P V (and dS K in the backward) multiplies exact zeros with the value
// (key) rows of the other windows of the query's group, so a non-finite V (K) entry there (inf,
// NaN) would leak as NaN into its neighbors. Scores of masked lanes are replaced, not multiplied.

namespace fna {
namespace cpu {
namespace FNA_CPU_ISA {

constexpr int kVW = FNA_CPU_VW;
typedef float vf __attribute__((vector_size(kVW * 4)));
typedef int vi __attribute__((vector_size(kVW * 4)));

static inline vf ld(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
static inline void st(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(v)); }
static inline vf splat(float x) { return vf{} + x; }
// Broadcast of a float in memory. The x86 forms fold into the FMA as an embedded / memory
// broadcast (a load-port uop); `splat(*p)` compiled to a register broadcast, which competes with
// the FMAs for port 5 on AVX-512 cores.
static inline vf splat_load(const float* p) {
#if FNA_CPU_VW == 16
  return (vf)_mm512_set1_ps(*p);
#elif FNA_CPU_VW == 8
  return (vf)_mm256_broadcast_ss(p);
#else
  return vf{} + *p;
#endif
}
static inline vi lanes() {  // 0, 1, .., kVW - 1 (from memory: a loop-built vector is not folded)
  static const int kLanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  vi l;
  __builtin_memcpy(&l, kLanes, sizeof(l));
  return l;
}
// Horizontal sum / max: log2(kVW) steps, each combining lanes l and l ^ h (literal shuffle
// masks: a loop-built index vector is not folded into a constant).
#if FNA_CPU_VW == 16
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7})); \
  v = OP(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11})); \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}))
#elif FNA_CPU_VW == 8
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3})); \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6}))
#else
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2}))
#endif
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline float hsum(vf v) {
  FNA_CPU_FOLD(v, vadd);
  return v[0];
}
static inline float hmax(vf v) {
  FNA_CPU_FOLD(v, vmax);
  return v[0];
}
#undef FNA_CPU_FOLD

// 2^x for x <= 0 (scores minus their max), relative error ~1e-7 (float rounding; 2e-9 before):
// x = n + f with n integer, f in [-0.5, 0.5]; 2^f by a degree-6 minimax polynomial.
static inline vf exp2v(vf x) {
#if FNA_CPU_VW == 16
  // AVX-512: one rounding and one scaling instruction instead of four integer / float steps;
  // scalef takes any n (2^n underflows to zero), so x needs no clamp.
  const vf n = (vf)_mm512_maskz_roundscale_ps(__mmask16(0xffff), (__m512)x,
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  x = x < -126.f ? splat(-126.f) : x;  // the exponent bits below must stay a normal float's
  const vf n = (x + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23 trick)
#endif
  const vf f = x - n;
  vf p = splat(1.5345810970757157e-4f);
  p = p * f + 1.3399930903688073e-3f;
  p = p * f + 9.618489071726799e-3f;
  p = p * f + 5.550328642129898e-2f;
  p = p * f + 2.4022646248340607e-1f;
  p = p * f + 6.931471824645996e-1f;
  p = p * f + 1.0f;
#if FNA_CPU_VW == 16
  return (vf)_mm512_maskz_scalef_ps(__mmask16(0xffff), (__m512)p, (__m512)n);
#else
  const vi e = __builtin_convertvector(n, vi) << 23;
  vi bits;
  __builtin_memcpy(&bits, &p, sizeof(p));
  bits += e;
  vf out;
  __builtin_memcpy(&out, &bits, sizeof(out));
  return out;
#endif
}
static inline float exp2s(float x) { return exp2v(splat(x))[0]; }

static float dot(const float* a, const float* b, int n) {  // n is a multiple of kVW (padded)
  vf acc = vf{};
  for (int e = 0; e < n; e += kVW) acc += ld(a + e) * ld(b + e);
  return hsum(acc);
}

static void axpy(float a, const float* x, float* y, int n) {  // n padded
  const vf b = splat(a);
  for (int e = 0; e < n; e += kVW) st(y + e, ld(y + e) + b * ld(x + e));
}

// Softmax pieces over the scores of a query group (see Group below): NQ queries' planes, qstride
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

// s <- 2^(s * scale - sub[g]) on query g's lanes, exact zeros on the others; l[g] = the sum.
template <int NQ>
static void group_exp(float* s, int64_t qstride, int R, int Wspan, const int* lo, const int* hi, float scale,
                      const float* sub, float* l) {
  const vf zero = vf{};
  vf sum[NQ], sv[NQ];
  for (int g = 0; g < NQ; ++g) sum[g] = zero, sv[g] = splat(sub[g]);
  for (int c = 0; c < Wspan; c += kVW) {
    const GroupLanes<NQ> gl(lo, hi, c);
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < NQ; ++g) {
        float* row = s + g * qstride + static_cast<int64_t>(r) * Wspan + c;
        const vf p = gl.in[g] ? exp2v(ld(row) * scale - sv[g]) : zero;
        st(row, p);
        sum[g] += p;
      }
  }
  for (int g = 0; g < NQ; ++g) l[g] = hsum(sum[g]);
}

// The two above for nq <= kGroup queries (max: m != nullptr, else exp).
static void group_softmax_step(int nq, float* s, int64_t qstride, int R, int Wspan, const int* lo, const int* hi,
                               float* m, float scale, const float* sub, float* l) {
#define FNA_CPU_STEP(NQ)                                                       \
  if (m) group_max<NQ>(s, qstride, R, Wspan, lo, hi, m);                       \
  else group_exp<NQ>(s, qstride, R, Wspan, lo, hi, scale, sub, l);
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

// ---- Query groups: up to kGroup consecutive queries whose windows fit in one span of columns.
// Each loaded key / value vector then feeds kGroup FMAs instead of one (the windows of
// neighboring queries overlap almost entirely), which takes the loads off the critical path.
constexpr int kGroup = 4;
// Accumulator budget: kGroup x kGroupPairs score vectors, kGroup x kGroupVecs output vectors.
constexpr int kGroupPairs = kVW >= 16 ? 6 : (kVW >= 8 ? 3 : 2);
constexpr int kGroupVecs = kVW >= 16 ? 4 : 2;

// xi: the group's query values interleaved, xi[(d - d0) * kGroup + g] (one pointer for all the
// broadcasts: with one pointer per query the loop ran out of registers and reloaded its key
// pointers from the stack / vector registers on every step, the latter through the FMA port).
template <int NQ, int NP>
static inline void group_dot(const float* xi, int d0, int d1, const float* const* base, int pitch,
                             float* const* out, bool accumulate) {
  vf acc[NQ][NP];
  for (int g = 0; g < NQ; ++g)
    for (int i = 0; i < NP; ++i) acc[g][i] = accumulate ? ld(out[g] + i * kVW) : vf{};
  const float* b0[NP];
  for (int i = 0; i < NP; ++i) b0[i] = base[i] + static_cast<int64_t>(d0) * pitch;
  for (int d = 0; d < d1 - d0; ++d) {
    vf kv[NP];
    const int64_t off = static_cast<int64_t>(d) * pitch;
    for (int i = 0; i < NP; ++i) kv[i] = ld(b0[i] + off);
    for (int g = 0; g < NQ; ++g) {
      const vf b = splat_load(xi + d * kGroup + g);
      for (int i = 0; i < NP; ++i) acc[g][i] += b * kv[i];
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int i = 0; i < NP; ++i) st(out[g] + i * kVW, acc[g][i]);
}

template <int NQ>
static void group_dot_np(int np, const float* xi, int d0, int d1, const float* const* base, int pitch,
                         float* const* out, bool acc) {
  switch (np) {
    case 1: group_dot<NQ, 1>(xi, d0, d1, base, pitch, out, acc); break;
    case 2: group_dot<NQ, 2>(xi, d0, d1, base, pitch, out, acc); break;
#if FNA_CPU_VW >= 8
    case 3: group_dot<NQ, 3>(xi, d0, d1, base, pitch, out, acc); break;
#endif
#if FNA_CPU_VW >= 16
    case 4: group_dot<NQ, 4>(xi, d0, d1, base, pitch, out, acc); break;
    case 5: group_dot<NQ, 5>(xi, d0, d1, base, pitch, out, acc); break;
    case 6: group_dot<NQ, 6>(xi, d0, d1, base, pitch, out, acc); break;
#endif
    default: break;
  }
}

// End of the batch starting at i0 when [0, n) is cut into the fewest batches of at most `most`,
// as even as possible (13 rows of 6: 5 + 4 + 4, not 6 + 6 + 1, whose one-vector call is
// latency-bound). Stateless: the rest [i0, n) is again cut evenly into ceil(left / most) batches.
static inline int batch_end(int i0, int n, int most) {
  const int left = n - i0, rest = (left + most - 1) / most;
  return i0 + (left + rest - 1) / rest;
}

// out[g][r][0 .. Wspan) (+)= sum_{d0 <= d < d1} x[g][d] * rows[r][d][cb .. cb + Wspan) for the
// rows [r0, r1), for nq <= kGroup queries given interleaved (xi, see group_dot), accumulating
// when d0 > 0 (callers split D into cache-sized chunks). Issues `hint_count` prefetch hints.
static void group_scores(Hints* h, int hint_count, int nq, const float* xi, int d0, int d1,
                         const float* const* rows, int r0, int r1, int R, int pitch, int cb, int Wspan,
                         float* out) {
  const int nv = Wspan / kVW, first = r0 * nv, total = r1 * nv;
  const int64_t qstride = static_cast<int64_t>(R) * Wspan;
  const float* base[kGroupPairs];
  float* dst[kGroup];
  for (int i0 = first; i0 < total;) {
    const int i1 = first + batch_end(i0 - first, total - first, kGroupPairs), n = i1 - i0;
    for (int i = 0; i < n; ++i) {
      const int r = (i0 + i) / nv, v = (i0 + i) % nv;
      base[i] = rows[r] + cb + v * kVW;
    }
    for (int g = 0; g < nq; ++g) dst[g] = out + g * qstride + i0 * kVW;
    for (int k = 0; k < hint_count; ++k) h->one();
    const bool acc = d0 > 0;
    switch (nq) {
      case 1: group_dot_np<1>(n, xi, d0, d1, base, pitch, dst, acc); break;
      case 2: group_dot_np<2>(n, xi, d0, d1, base, pitch, dst, acc); break;
      case 3: group_dot_np<3>(n, xi, d0, d1, base, pitch, dst, acc); break;
      default: group_dot_np<4>(n, xi, d0, d1, base, pitch, dst, acc); break;
    }
    i0 = i1;
  }
}

// "Diagonal" groups: kGroup queries whose windows, all W columns wide, start at span columns
// 0, 1, .., kGroup - 1 (every interior group of a tile). Span column c then holds weights only
// for the queries [max(0, c - W + 1), min(c + 1, kGroup)); the products of the others are exact
// zeros (masked lanes), 19% of them at W = 13, and the diagonal kernels skip them by running
// the span's columns in runs of one active query range each.
#define FNA_CPU_INLINE inline __attribute__((always_inline))

// acc[g] += sum_{c0 <= c < c1} w[g][c] * src[c][..] for the queries G0 <= g < G1.
template <int NQ, int NV, int G0, int G1>
static FNA_CPU_INLINE void accum_cols(vf (&acc)[NQ][NV], const float* src, int64_t pitch, const float* wr,
                                      int64_t qstride, int c0, int c1) {
  for (int c = c0; c < c1; ++c) {
    vf v[NV];
    for (int j = 0; j < NV; ++j) v[j] = ld(src + static_cast<int64_t>(c) * pitch + j * kVW);
    for (int g = G0; g < G1; ++g) {
      const vf b = splat_load(wr + g * qstride + c);
      for (int j = 0; j < NV; ++j) acc[g][j] += b * v[j];
    }
  }
}

template <int NQ, int NV, bool Diag>
static inline void group_accum(Hints* h, const float* w, int64_t qstride, int R, int Wspan, int ncols,
                               const float* const* rows, int64_t pitch, int cb, int col0,
                               float* const* out, bool accumulate) {
  vf acc[NQ][NV];
  for (int g = 0; g < NQ; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = accumulate ? ld(out[g] + col0 + j * kVW) : vf{};
  for (int r = 0; r < R; ++r) {
    const float* src = rows[r] + static_cast<int64_t>(cb) * pitch + col0;
    const float* wr = w + static_cast<int64_t>(r) * Wspan;
    for (int k = 0; k < 4; ++k) h->one();
    if (Diag) {
      static_assert(!Diag || NQ == 4, "diagonal groups have kGroup = 4 queries");
      const int W = ncols - 3;
      accum_cols<NQ, NV, 0, 1>(acc, src, pitch, wr, qstride, 0, 1);
      accum_cols<NQ, NV, 0, 2>(acc, src, pitch, wr, qstride, 1, 2);
      accum_cols<NQ, NV, 0, 3>(acc, src, pitch, wr, qstride, 2, 3);
      accum_cols<NQ, NV, 0, 4>(acc, src, pitch, wr, qstride, 3, W);
      accum_cols<NQ, NV, 1, 4>(acc, src, pitch, wr, qstride, W, W + 1);
      accum_cols<NQ, NV, 2, 4>(acc, src, pitch, wr, qstride, W + 1, W + 2);
      accum_cols<NQ, NV, 3, 4>(acc, src, pitch, wr, qstride, W + 2, W + 3);
    } else {
      accum_cols<NQ, NV, 0, NQ>(acc, src, pitch, wr, qstride, 0, ncols);
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int j = 0; j < NV; ++j) st(out[g] + col0 + j * kVW, acc[g][j]);
}

template <int NQ, bool Diag = false>
static void group_accum_nv(Hints* h, int nv, const float* w, int64_t qstride, int R, int Wspan, int ncols,
                           const float* const* rows, int64_t pitch, int cb, int col0, float* const* out,
                           bool accumulate) {
  switch (nv) {
    case 1: group_accum<NQ, 1, Diag>(h, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
#if FNA_CPU_VW >= 16
    case 2: group_accum<NQ, 2, Diag>(h, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
    case 3: group_accum<NQ, 3, Diag>(h, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
    default: group_accum<NQ, 4, Diag>(h, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
#else
    default: group_accum<NQ, 2, Diag>(h, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
#endif
  }
}

// out[g][0 .. nvec * kVW) = sum_r sum_c w[g][r][c] * rows[r][cb + c][:] (rows are [M][pitch]),
// over the ncols <= Wspan columns of the group's windows (w's rows are Wspan apart; the padding
// lanes beyond them hold zero weights and are skipped).
static void group_weighted_rows(Hints* h, int nq, bool diag, const float* w, int R, int Wspan, int ncols,
                                const float* const* rows, int64_t pitch, int cb, int nvec, float* const* out,
                                bool accumulate = false, int64_t qstride = -1) {
  if (qstride < 0) qstride = static_cast<int64_t>(R) * Wspan;
  for (int j0 = 0; j0 < nvec; j0 += kGroupVecs) {
    const int n = nvec - j0 < kGroupVecs ? nvec - j0 : kGroupVecs;
    const int col0 = j0 * kVW;
    switch (nq) {
      case 1: group_accum_nv<1>(h, n, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
      case 2: group_accum_nv<2>(h, n, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
      case 3: group_accum_nv<3>(h, n, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate); break;
      default:
        if (diag)
          group_accum_nv<4, true>(h, n, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate);
        else
          group_accum_nv<4>(h, n, w, qstride, R, Wspan, ncols, rows, pitch, cb, col0, out, accumulate);
        break;
    }
  }
}

// rows[r][cb + c][col0 ..] += sum_g w[g][r][c] * mult * x[g][col0 ..] for every row r and span
// column c: the transposed product (dK = dS^T Q, dV = P^T dO) of one query group, with the
// group's x vectors held in registers. Masked lanes carry zero weights.
// rows[c][..] += sum_{G0 <= g < G1} w[g][c] * xv[g] for c0 <= c < c1 (diagonal runs, as in
// group_accum).
template <int NQ, int NV, int G0, int G1>
static FNA_CPU_INLINE void outer_cols(const vf (&xv)[NQ][NV], float* dst, int pitch, const float* wr,
                                      int64_t qstride, int c0, int c1) {
  for (int c = c0; c < c1; ++c) {
    float* d = dst + static_cast<int64_t>(c) * pitch;
    vf acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = ld(d + j * kVW);
    for (int g = G0; g < G1; ++g) {
      const vf b = splat_load(wr + g * qstride + c);
      for (int j = 0; j < NV; ++j) acc[j] += b * xv[g][j];
    }
    for (int j = 0; j < NV; ++j) st(d + j * kVW, acc[j]);
  }
}

template <int NQ, int NV, bool Diag>
static inline void group_outer(Hints* h, const float* w, int64_t qstride, int R, int Wspan, int ncols,
                               const float* const* x, float mult, float* const* rows, int pitch,
                               int cb, int col0) {
  vf xv[NQ][NV];
  for (int g = 0; g < NQ; ++g)
    for (int j = 0; j < NV; ++j) xv[g][j] = ld(x[g] + col0 + j * kVW) * mult;
  for (int r = 0; r < R; ++r) {
    const float* wr = w + static_cast<int64_t>(r) * Wspan;
    float* dst = rows[r] + static_cast<int64_t>(cb) * pitch + col0;
    for (int k = 0; k < 4; ++k) h->one();
    if (Diag) {
      static_assert(!Diag || NQ == 4, "diagonal groups have kGroup = 4 queries");
      const int W = ncols - 3;
      outer_cols<NQ, NV, 0, 1>(xv, dst, pitch, wr, qstride, 0, 1);
      outer_cols<NQ, NV, 0, 2>(xv, dst, pitch, wr, qstride, 1, 2);
      outer_cols<NQ, NV, 0, 3>(xv, dst, pitch, wr, qstride, 2, 3);
      outer_cols<NQ, NV, 0, 4>(xv, dst, pitch, wr, qstride, 3, W);
      outer_cols<NQ, NV, 1, 4>(xv, dst, pitch, wr, qstride, W, W + 1);
      outer_cols<NQ, NV, 2, 4>(xv, dst, pitch, wr, qstride, W + 1, W + 2);
      outer_cols<NQ, NV, 3, 4>(xv, dst, pitch, wr, qstride, W + 2, W + 3);
    } else {
      outer_cols<NQ, NV, 0, NQ>(xv, dst, pitch, wr, qstride, 0, ncols);
    }
  }
}

template <int NQ, bool Diag = false>
static void group_outer_nv(Hints* h, int nv, const float* w, int64_t qstride, int R, int Wspan, int ncols,
                           const float* const* x, float mult, float* const* rows, int pitch, int cb,
                           int col0) {
  switch (nv) {
    case 1: group_outer<NQ, 1, Diag>(h, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
#if FNA_CPU_VW >= 16
    case 2: group_outer<NQ, 2, Diag>(h, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
    case 3: group_outer<NQ, 3, Diag>(h, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
    default: group_outer<NQ, 4, Diag>(h, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
#else
    default: group_outer<NQ, 2, Diag>(h, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
#endif
  }
}

static void group_outer_all(Hints* h, int nq, bool diag, const float* w, int64_t qstride, int R, int Wspan, int ncols,
                            const float* const* x, float mult, float* const* rows, int pitch, int cb,
                            int nvec) {
  for (int j0 = 0; j0 < nvec; j0 += kGroupVecs) {
    const int n = nvec - j0 < kGroupVecs ? nvec - j0 : kGroupVecs;
    const int col0 = j0 * kVW;
    switch (nq) {
      case 1: group_outer_nv<1>(h, n, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
      case 2: group_outer_nv<2>(h, n, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
      case 3: group_outer_nv<3>(h, n, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0); break;
      default:
        if (diag)
          group_outer_nv<4, true>(h, n, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0);
        else
          group_outer_nv<4>(h, n, w, qstride, R, Wspan, ncols, x, mult, rows, pitch, cb, col0);
        break;
    }
  }
}

// Splits queries [0, T) into groups: [t0, t1) with a shared span of columns: the union of their
// windows, [cb, cb + span), padded to Wspan lanes in the score buffers.
struct Group {
  int t0, t1, cb, span, Wspan;
  bool diag;  // a diagonal group (see accum_cols)
};
// The lanes [lo[g], hi[g]) of each query's window in the group's span; returns the queries.
static int group_lanes(const TileShape& s, const Group& gr, int* lo, int* hi) {
  for (int t = gr.t0; t < gr.t1; ++t) {
    lo[t - gr.t0] = s.col_begin[t] - gr.cb;
    hi[t - gr.t0] = lo[t - gr.t0] + s.col_count[t];
  }
  return gr.t1 - gr.t0;
}

static Group next_group(const TileShape& s, int t0) {
  const int limit = padded_window(s.col_count[t0] + kGroup - 1, kVW);
  int t1 = t0 + 1;
  while (t1 < s.T && t1 - t0 < kGroup &&
         s.col_begin[t1] + s.col_count[t1] - s.col_begin[t0] <= limit)
    ++t1;
  const int span = s.col_begin[t1 - 1] + s.col_count[t1 - 1] - s.col_begin[t0];
  bool diag = t1 - t0 == kGroup && kGroup == 4 && s.col_count[t0] >= 3;
  for (int t = t0; t < t1 && diag; ++t)
    diag = s.col_begin[t] - s.col_begin[t0] == t - t0 && s.col_count[t] == s.col_count[t0];
  return {t0, t1, s.col_begin[t0], span, padded_window(span, kVW), diag};
}

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

// buf[t0 * plane + g * R * Wspan ..] = scores of every group (query rows x[t] = xs + t * xpitch).
// Loop order: a chunk of D, then a batch of rows, then every group, so that the keys all groups
// read (the batch's rows x the chunk's dims x the tile's columns) are reused from L1 / L2 while
// the groups sweep over them, instead of being streamed once per group.
static void tile_scores(const TileShape& s, const Group* grs, int ng, const float* xs, int xpitch,
                        int D, const float* const* rows, int pitch, float* buf, int64_t plane,
                        Hints* hints) {
  float xi[kTileQueries * kGroup * kDChunk];  // per group: its queries' chunk, interleaved
  for (int d0 = 0; d0 < D; d0 += kDChunk) {
    const int d1 = D - d0 < kDChunk ? D : d0 + kDChunk, dc = d1 - d0;
    for (int i = 0; i < ng; ++i) {
      float* dst = xi + i * kGroup * kDChunk;
      for (int g = 0; g < grs[i].t1 - grs[i].t0; ++g) {
        const float* x = xs + static_cast<int64_t>(grs[i].t0 + g) * xpitch + d0;
        for (int d = 0; d < dc; ++d) dst[d * kGroup + g] = x[d];
      }
    }
    for (int r0 = 0; r0 < s.R;) {
      const int r1 = batch_end(r0, s.R, kGroupPairs);
      for (int i = 0; i < ng; ++i) {
        const Group& gr = grs[i];
        group_scores(hints, 4, gr.t1 - gr.t0, xi + i * kGroup * kDChunk, d0, d1, rows, r0, r1, s.R,
                     pitch, gr.cb, gr.Wspan, buf + gr.t0 * plane);
      }
      r0 = r1;
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

void forward_tile(const ForwardTile& a) {
  const TileShape& s = a.s;
  Group grs[kTileQueries] = {};
  const int ng = tile_groups(s, grs);
  const int64_t plane = tile_plane(s);
  float* sc = a.scratch;
  float* sadd = a.scratch + s.T * plane;
  Hints hints(a.prefetch);
  tile_scores(s, grs, ng, a.q, a.q_pitch, s.D, a.kt_rows, a.pitch, sc, plane, &hints);
  float l[kTileQueries], m[kTileQueries];
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    int lo[kGroup], hi[kGroup];
    const int nq = group_lanes(s, gr, lo, hi);
    float* sg = sc + gr.t0 * plane;
    group_softmax_step(nq, sg, qstride, s.R, gr.Wspan, lo, hi, m + gr.t0, 0.f, nullptr, nullptr);
    for (int t = gr.t0; t < gr.t1; ++t) {
      float* ag = sadd + t * s.A;
      const float* x = a.q + static_cast<int64_t>(t) * a.q_pitch;
      m[t] *= a.scale_log2;
      for (int n = 0; n < s.A; ++n) {
        ag[n] = dot(x, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp) * a.scale_log2;
        m[t] = ag[n] > m[t] ? ag[n] : m[t];
      }
    }
    group_softmax_step(nq, sg, qstride, s.R, gr.Wspan, lo, hi, nullptr, a.scale_log2, m + gr.t0, l + gr.t0);
    for (int t = gr.t0; t < gr.t1; ++t)
      for (int n = 0; n < s.A; ++n) {
        float* ag = sadd + t * s.A;
        ag[n] = exp2s(ag[n] - m[t]);
        l[t] += ag[n];
      }
  }
  tile_weighted_rows(s, grs, ng, sc, plane, a.v_rows, s.Dvp, s.Dvp / kVW, a.o, a.o_pitch, &hints);
  hints.finish();
  for (int t = 0; t < s.T; ++t) {
    float* o = a.o + static_cast<int64_t>(t) * a.o_pitch;
    for (int n = 0; n < s.A; ++n)
      axpy(sadd[t * s.A + n], a.add_v + static_cast<int64_t>(n) * s.Dvp, o, s.Dvp);
    const float inv = 1.f / l[t];
    for (int e = 0; e < s.Dvp; e += kVW) st(o + e, ld(o + e) * inv);
    // log2 -> natural log: lse = (m + log2 l) * ln 2.
    a.lse[t] = (m[t] + __builtin_log2f(l[t])) * 0.69314718055994531f;
  }
}

void backward_tile(const BackwardTile& a) {
  const TileShape& s = a.s;
  Group grs[kTileQueries] = {};
  const int ng = tile_groups(s, grs);
  const int64_t plane = tile_plane(s);
  // P (from the saved LSE), dP, dS for every query, then dQ = dS K, dK += scale dS^T Q,
  // dV += P^T dO. Masked lanes hold P = dS = 0, so the span-wide products add exact zeros (the
  // box panels have slack columns beyond M for the span's padding).
  Hints hints(a.prefetch);
  tile_scores(s, grs, ng, a.q, a.q_pitch, s.D, a.kt_rows, a.pitch, a.p, plane, &hints);
  tile_scores(s, grs, ng, a.d_o, a.do_pitch, s.Dv, a.vt_rows, a.pitch, a.ds, plane, &hints);  // dP
  for (int i = 0; i < ng; ++i) {
    const Group& gr = grs[i];
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    int lo[kGroup], hi[kGroup];
    float l[kGroup];
    const int nq = group_lanes(s, gr, lo, hi);
    group_softmax_step(nq, a.p + gr.t0 * plane, qstride, s.R, gr.Wspan, lo, hi, nullptr, a.scale_log2,
                       a.lse2 + gr.t0, l);
    for (int t = gr.t0; t < gr.t1; ++t) {
      float* pg = a.p + gr.t0 * plane + (t - gr.t0) * qstride;
      float* dg = a.ds + gr.t0 * plane + (t - gr.t0) * qstride;
      const vf delta = splat(a.delta[t]);
      for (int64_t c = 0; c < qstride; c += kVW) st(dg + c, ld(pg + c) * (ld(dg + c) - delta));
    }
  }
  tile_weighted_rows(s, grs, ng, a.ds, plane, a.k_rows, s.Dp, s.Dp / kVW, a.dq, a.dq_pitch, &hints);
  tile_outer(s, grs, ng, a.ds, plane, a.q, a.q_pitch, a.scale, a.dk_rows, s.Dp, s.Dp / kVW, &hints);
  tile_outer(s, grs, ng, a.p, plane, a.d_o, a.do_pitch, 1.f, a.dv_rows, s.Dvp, s.Dvp / kVW, &hints);
  hints.finish();
  for (int t = 0; t < s.T; ++t) {
    const float* x = a.q + static_cast<int64_t>(t) * a.q_pitch;
    const float* y = a.d_o + static_cast<int64_t>(t) * a.do_pitch;
    float* dq = a.dq + static_cast<int64_t>(t) * a.dq_pitch;
    for (int n = 0; n < s.A; ++n) {
      const float pn = exp2s(dot(x, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp) * a.scale_log2 - a.lse2[t]);
      const float dpn = dot(y, a.add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
      const float dsn = pn * (dpn - a.delta[t]);
      a.p_add[t * s.A + n] = pn;
      a.ds_add[t * s.A + n] = dsn;
      axpy(dsn, a.add_k + static_cast<int64_t>(n) * s.Dp, dq, s.Dp);
    }
    const vf sc = splat(a.scale);
    for (int e = 0; e < s.Dp; e += kVW) st(dq + e, ld(dq + e) * sc);
  }
  for (int n = 0; n < s.A; ++n)
    for (int t = 0; t < s.T; ++t) {
      axpy(a.ds_add[t * s.A + n] * a.scale, a.q + static_cast<int64_t>(t) * a.q_pitch,
           a.d_add_k + static_cast<int64_t>(n) * s.Dp, s.Dp);
      axpy(a.p_add[t * s.A + n], a.d_o + static_cast<int64_t>(t) * a.do_pitch,
           a.d_add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
    }
}

}  // namespace FNA_CPU_ISA
}  // namespace cpu
}  // namespace fna
