// Part of the CPU tile kernels (kernels_impl.h includes it inside its ISA namespace, after the
// vector helpers; see there for how the file is compiled): query groups and their register-blocked
// products, the score dots (Q K^T, dO V^T), the weighted rows (P V, dS K) and the outer products
// (dS^T Q, P^T dO).

// ---- Query groups: up to kGroup consecutive queries whose windows fit in one span of columns.
// Each loaded key / value vector then feeds kGroup FMAs instead of one (the windows of
// neighboring queries overlap almost entirely), which takes the loads off the critical path.
constexpr int kGroup = 4;
// Accumulator budget: kGroup x kGroupPairs score vectors, kGroup x kGroupVecs output vectors.
constexpr int kGroupPairs = kVW >= 16 ? 6 : (kVW >= 8 ? 3 : 2);
constexpr int kGroupVecs = kVW >= 16 ? 4 : 2;

// Score accumulators in registers: NQ queries x NP key vectors, NQ * NP <= kAcc, NP <= kGroupPairs.
constexpr int kAcc = kGroup * kGroupPairs;
constexpr int max_np(int nq) { return kAcc / nq < kGroupPairs ? kAcc / nq : kGroupPairs; }

// xi: the queries' values interleaved, xi[(d - d0) * XS + g] (one pointer for all the
// broadcasts: with one pointer per query the loop ran out of registers and reloaded its key
// pointers from the stack / vector registers on every step, the latter through the FMA port; a
// run-time stride did the same at NP = 5, hence XS a template argument).
template <int NQ, int NP, int XS>
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
      const vf b = splat_load(xi + d * XS + g);
      for (int i = 0; i < NP; ++i) acc[g][i] = fmadd(b, kv[i], acc[g][i]);
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int i = 0; i < NP; ++i) st(out[g] + i * kVW, acc[g][i]);
}

// group_dot<NQ, np, XS> for 1 <= np <= max_np(NQ).
template <int NQ, int XS>
static void group_dot_np(int np, const float* xi, int d0, int d1, const float* const* base, int pitch,
                         float* const* out, bool acc) {
#define FNA_CPU_NP(NP)                                                              \
  case NP:                                                                          \
    if constexpr (NP <= max_np(NQ)) group_dot<NQ, NP, XS>(xi, d0, d1, base, pitch, out, acc); \
    break;
  switch (np) {
    FNA_CPU_NP(1)
    FNA_CPU_NP(2)
    FNA_CPU_NP(3)
    FNA_CPU_NP(4)
    FNA_CPU_NP(5)
    FNA_CPU_NP(6)
    default: break;
  }
#undef FNA_CPU_NP
}

// group_dot_np for nq <= XS queries (1 .. kGroup, or 6 or 8 of two tiles: XS = 2 * kGroup).
template <int XS>
static void group_dot_nq(int nq, int np, const float* xi, int d0, int d1, const float* const* base, int pitch,
                         float* const* out, bool acc) {
  switch (nq) {
    case 1: group_dot_np<1, XS>(np, xi, d0, d1, base, pitch, out, acc); break;
    case 2: group_dot_np<2, XS>(np, xi, d0, d1, base, pitch, out, acc); break;
    case 3: group_dot_np<3, XS>(np, xi, d0, d1, base, pitch, out, acc); break;
    case 4: group_dot_np<4, XS>(np, xi, d0, d1, base, pitch, out, acc); break;
    default:
      if constexpr (XS > kGroup) {
        if (nq == 6)
          group_dot_np<6, XS>(np, xi, d0, d1, base, pitch, out, acc);
        else
          group_dot_np<8, XS>(np, xi, d0, d1, base, pitch, out, acc);
      }
      break;
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
// rows [r0, r1), for nq queries given interleaved (xi, stride xs = kGroup or 2 * kGroup: see
// group_dot), accumulating
// when d0 > 0 (callers split D into cache-sized chunks); out[g] points at query g's row 0. Issues
// `hint_count` prefetch hints.
static void group_scores(Hints* h, int hint_count, int nq, const float* xi, int xs, int d0, int d1,
                         const float* const* rows, int r0, int r1, int pitch, int cb, int Wspan,
                         float* const* out) {
  const int nv = Wspan / kVW, first = r0 * nv, total = r1 * nv;
  const float* base[kGroupPairs];
  float* dst[2 * kGroup];
  for (int i0 = first; i0 < total;) {
    const int i1 = first + batch_end(i0 - first, total - first, max_np(nq)), n = i1 - i0;
    for (int i = 0; i < n; ++i) {
      const int r = (i0 + i) / nv, v = (i0 + i) % nv;
      base[i] = rows[r] + cb + v * kVW;
    }
    for (int g = 0; g < nq; ++g) dst[g] = out[g] + i0 * kVW;
    for (int k = 0; k < hint_count; ++k) h->one();
    const bool acc = d0 > 0;
    if (xs == kGroup)
      group_dot_nq<kGroup>(nq, n, xi, d0, d1, base, pitch, dst, acc);
    else
      group_dot_nq<2 * kGroup>(nq, n, xi, d0, d1, base, pitch, dst, acc);
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
      for (int j = 0; j < NV; ++j) acc[g][j] = fmadd(b, v[j], acc[g][j]);
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
      for (int j = 0; j < NV; ++j) acc[j] = fmadd(b, xv[g][j], acc[j]);
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
