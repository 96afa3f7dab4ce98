// The CPU tile kernels, written once with GCC vector extensions and compiled once per instruction
// set: each kernels_<isa>.cpp defines FNA_CPU_ISA (a namespace) and FNA_CPU_VW (floats per vector),
// sets `#pragma GCC target`, and includes this file AFTER every standard header, so that nothing
// shared (inline std functions) is ever compiled with a wider ISA than the CPU may have.
// No std:: templates are used below for the same reason.
//
// Scores are computed per query over exactly its window, vectorized over key columns: the keys of
// a row are stored transposed ([d][column]), so one broadcast of q[d] feeds one FMA per
// (row, column-vector) pair and the accumulators stay in registers. P V, dQ, dK, dV are vectorized
// over the head dim with up to four vectors of accumulators per pass.

namespace fna {
namespace cpu {
namespace FNA_CPU_ISA {

constexpr int kVW = FNA_CPU_VW;
typedef float vf __attribute__((vector_size(kVW * 4)));
typedef int vi __attribute__((vector_size(kVW * 4)));
// Register budget for score accumulators: (row, vector) pairs computed together.
constexpr int kPairs = kVW >= 16 ? 12 : 8;
constexpr int kOutVecs = 4;  // head-dim vectors accumulated per pass

static inline vf ld(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
static inline void st(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(v)); }
static inline vf splat(float x) { return vf{} + x; }
static inline vi lanes() {
  vi l;
  for (int i = 0; i < kVW; ++i) l[i] = i;
  return l;
}
static inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kVW; ++i) s += v[i];
  return s;
}
static inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kVW; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// 2^x for x <= 0 (scores minus their max), relative error ~1e-8 before float rounding:
// x = n + f with n integer, f in [-0.5, 0.5]; 2^f by its degree-7 Taylor polynomial.
static inline vf exp2v(vf x) {
  x = x < -126.f ? splat(-126.f) : x;
  const vf n = (x + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23 trick)
  const vf f = x - n;
  vf p = splat(1.5252733804e-5f);
  p = p * f + 1.5403530393e-4f;
  p = p * f + 1.3333558146e-3f;
  p = p * f + 9.6181291076e-3f;
  p = p * f + 5.5504108665e-2f;
  p = p * f + 2.4022650696e-1f;
  p = p * f + 6.9314718056e-1f;
  p = p * f + 1.0f;
  const vi e = __builtin_convertvector(n, vi) << 23;
  vi bits;
  __builtin_memcpy(&bits, &p, sizeof(p));
  bits += e;
  vf out;
  __builtin_memcpy(&out, &bits, sizeof(out));
  return out;
}
static inline float exp2s(float x) { return exp2v(splat(x))[0]; }

// acc[i] = sum_d x[d] * base[i][d * pitch .. + kVW) for N pairs at once, stored to out[i].
template <int N>
static inline void dot_pairs(const float* x, int D, const float* const* base, int pitch, float* out) {
  vf acc[N];
  for (int i = 0; i < N; ++i) acc[i] = vf{};
  for (int d = 0; d < D; ++d) {
    const vf b = splat(x[d]);
    const int off = d * pitch;
    for (int i = 0; i < N; ++i) acc[i] += b * ld(base[i] + off);
  }
  for (int i = 0; i < N; ++i) st(out + i * kVW, acc[i]);
}

static void dot_pairs_n(int n, const float* x, int D, const float* const* base, int pitch, float* out) {
  switch (n) {
#define FNA_CASE(k) case k: dot_pairs<k>(x, D, base, pitch, out); break;
    FNA_CASE(1) FNA_CASE(2) FNA_CASE(3) FNA_CASE(4) FNA_CASE(5) FNA_CASE(6) FNA_CASE(7) FNA_CASE(8)
#if FNA_CPU_VW >= 16
    FNA_CASE(9) FNA_CASE(10) FNA_CASE(11) FNA_CASE(12)
#endif
#undef FNA_CASE
    default: break;
  }
}

// scores[r][0 .. Wp) = x . (column cb .. cb + Wp of row r), for all R rows; rows[r] is a
// transposed panel [dim][pitch].
static void scores(const float* x, int D, const float* const* rows, int R, int pitch, int cb,
                   int Wp, float* out) {
  const int nv = Wp / kVW, total = R * nv;
  const float* base[kPairs];
  for (int i0 = 0; i0 < total; i0 += kPairs) {
    const int n = total - i0 < kPairs ? total - i0 : kPairs;
    for (int i = 0; i < n; ++i) {
      const int r = (i0 + i) / nv, v = (i0 + i) % nv;
      base[i] = rows[r] + cb + v * kVW;
    }
    dot_pairs_n(n, x, D, base, pitch, out + i0 * kVW);
  }
}

// out[col0 .. col0 + NV*kVW) (+)= sum_i w[i] * src[i * pitch + col0 ..].
template <int NV>
static inline void accum(const float* w, int n, const float* src, int pitch, int col0, float* out,
                         bool accumulate) {
  vf acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = accumulate ? ld(out + col0 + j * kVW) : vf{};
  for (int i = 0; i < n; ++i) {
    const vf b = splat(w[i]);
    const float* row = src + static_cast<int64_t>(i) * pitch + col0;
    for (int j = 0; j < NV; ++j) acc[j] += b * ld(row + j * kVW);
  }
  for (int j = 0; j < NV; ++j) st(out + col0 + j * kVW, acc[j]);
}

// out[0 .. nvec * kVW) (+)= sum_i w[i] * src row i (rows `pitch` floats apart).
static void accum_all(const float* w, int n, const float* src, int pitch, int nvec, float* out,
                      bool accumulate) {
  for (int j0 = 0; j0 < nvec; j0 += kOutVecs) {
    const int k = nvec - j0 < kOutVecs ? nvec - j0 : kOutVecs;
    const int col0 = j0 * kVW;
    switch (k) {
      case 1: accum<1>(w, n, src, pitch, col0, out, accumulate); break;
      case 2: accum<2>(w, n, src, pitch, col0, out, accumulate); break;
      case 3: accum<3>(w, n, src, pitch, col0, out, accumulate); break;
      default: accum<4>(w, n, src, pitch, col0, out, accumulate); break;
    }
  }
}

// out = sum over rows r, columns c < count of w[r][c] * rows[r][cb + c][:] (rows are [M][pitch]).
static void weighted_rows(const float* w, int R, int Wp, int count, const float* const* rows,
                          int pitch, int cb, int nvec, float* out) {
  for (int r = 0; r < R; ++r)
    accum_all(w + static_cast<int64_t>(r) * Wp, count, rows[r] + static_cast<int64_t>(cb) * pitch,
              pitch, nvec, out, r > 0);
  if (R == 0)
    for (int e = 0; e < nvec * kVW; ++e) out[e] = 0.f;
}

static float dot(const float* a, const float* b, int n) {  // n is a multiple of kVW (padded)
  vf acc = vf{};
  for (int e = 0; e < n; e += kVW) acc += ld(a + e) * ld(b + e);
  return hsum(acc);
}

static void axpy(float a, const float* x, float* y, int n) {  // n padded
  const vf b = splat(a);
  for (int e = 0; e < n; e += kVW) st(y + e, ld(y + e) + b * ld(x + e));
}

// Masks lanes >= count of each row to -inf and returns the max over the valid lanes.
static float mask_and_max(float* s, int R, int Wp, int count) {
  const vi lane = lanes();
  const vf ninf = splat(-__builtin_inff());
  vf m = ninf;
  for (int r = 0; r < R; ++r) {
    float* row = s + static_cast<int64_t>(r) * Wp;
    for (int c = 0; c < Wp; c += kVW) {
      vf x = ld(row + c);
      x = (lane + c) < count ? x : ninf;
      st(row + c, x);
      m = x > m ? x : m;
    }
  }
  return hmax(m);
}

// s <- 2^(s * scale - sub) in place (masked lanes, which hold -inf, become 0); returns the sum.
static float exp_rows(float* s, int n, float scale, float sub) {
  vf sum = vf{};
  const vf zero = vf{};
  for (int c = 0; c < n; c += kVW) {
    const vf x = ld(s + c);
    vf p = exp2v(x * scale - sub);
    p = x == -__builtin_inff() ? zero : p;
    st(s + c, p);
    sum += p;
  }
  return hsum(sum);
}

// ---- Query groups: up to kGroup consecutive queries whose windows fit in one span of columns.
// Each loaded key / value vector then feeds kGroup FMAs instead of one (the windows of
// neighboring queries overlap almost entirely), which takes the loads off the critical path.
constexpr int kGroup = 4;
// Accumulator budget: kGroup x kGroupPairs score vectors, kGroup x kGroupVecs output vectors.
constexpr int kGroupPairs = kVW >= 16 ? 6 : (kVW >= 8 ? 3 : 2);
constexpr int kGroupVecs = kVW >= 16 ? 4 : 2;

template <int NQ, int NP>
static inline void group_dot(const float* const* x, int D, const float* const* base, int pitch,
                             float* const* out) {
  vf acc[NQ][NP];
  for (int g = 0; g < NQ; ++g)
    for (int i = 0; i < NP; ++i) acc[g][i] = vf{};
  for (int d = 0; d < D; ++d) {
    vf kv[NP];
    const int off = d * pitch;
    for (int i = 0; i < NP; ++i) kv[i] = ld(base[i] + off);
    for (int g = 0; g < NQ; ++g) {
      const vf b = splat(x[g][d]);
      for (int i = 0; i < NP; ++i) acc[g][i] += b * kv[i];
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int i = 0; i < NP; ++i) st(out[g] + i * kVW, acc[g][i]);
}

template <int NQ>
static void group_dot_np(int np, const float* const* x, int D, const float* const* base, int pitch,
                         float* const* out) {
  switch (np) {
    case 1: group_dot<NQ, 1>(x, D, base, pitch, out); break;
    case 2: group_dot<NQ, 2>(x, D, base, pitch, out); break;
#if FNA_CPU_VW >= 8
    case 3: group_dot<NQ, 3>(x, D, base, pitch, out); break;
#endif
#if FNA_CPU_VW >= 16
    case 4: group_dot<NQ, 4>(x, D, base, pitch, out); break;
    case 5: group_dot<NQ, 5>(x, D, base, pitch, out); break;
    case 6: group_dot<NQ, 6>(x, D, base, pitch, out); break;
#endif
    default: break;
  }
}

// out[g][r][0 .. Wspan) = x[g] . (columns cb .. cb + Wspan of row r), for nq <= kGroup queries.
static void group_scores(int nq, const float* const* x, int D, const float* const* rows, int R,
                         int pitch, int cb, int Wspan, float* out) {
  const int nv = Wspan / kVW, total = R * nv;
  const int64_t qstride = static_cast<int64_t>(R) * Wspan;
  const float* base[kGroupPairs];
  float* dst[kGroup];
  for (int i0 = 0; i0 < total; i0 += kGroupPairs) {
    const int n = total - i0 < kGroupPairs ? total - i0 : kGroupPairs;
    for (int i = 0; i < n; ++i) {
      const int r = (i0 + i) / nv, v = (i0 + i) % nv;
      base[i] = rows[r] + cb + v * kVW;
    }
    for (int g = 0; g < nq; ++g) dst[g] = out + g * qstride + i0 * kVW;
    switch (nq) {
      case 1: group_dot_np<1>(n, x, D, base, pitch, dst); break;
      case 2: group_dot_np<2>(n, x, D, base, pitch, dst); break;
      case 3: group_dot_np<3>(n, x, D, base, pitch, dst); break;
      default: group_dot_np<4>(n, x, D, base, pitch, dst); break;
    }
  }
}

template <int NQ, int NV>
static inline void group_accum(const float* w, int64_t qstride, int R, int Wspan,
                               const float* const* rows, int pitch, int cb, int col0,
                               float* const* out) {
  vf acc[NQ][NV];
  for (int g = 0; g < NQ; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = vf{};
  for (int r = 0; r < R; ++r) {
    const float* src = rows[r] + static_cast<int64_t>(cb) * pitch + col0;
    const float* wr = w + static_cast<int64_t>(r) * Wspan;
    for (int c = 0; c < Wspan; ++c) {
      vf v[NV];
      for (int j = 0; j < NV; ++j) v[j] = ld(src + static_cast<int64_t>(c) * pitch + j * kVW);
      for (int g = 0; g < NQ; ++g) {
        const vf b = splat(wr[g * qstride + c]);
        for (int j = 0; j < NV; ++j) acc[g][j] += b * v[j];
      }
    }
  }
  for (int g = 0; g < NQ; ++g)
    for (int j = 0; j < NV; ++j) st(out[g] + col0 + j * kVW, acc[g][j]);
}

template <int NQ>
static void group_accum_nv(int nv, const float* w, int64_t qstride, int R, int Wspan,
                           const float* const* rows, int pitch, int cb, int col0, float* const* out) {
  switch (nv) {
    case 1: group_accum<NQ, 1>(w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
#if FNA_CPU_VW >= 16
    case 2: group_accum<NQ, 2>(w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
    case 3: group_accum<NQ, 3>(w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
    default: group_accum<NQ, 4>(w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
#else
    default: group_accum<NQ, 2>(w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
#endif
  }
}

// out[g][0 .. nvec * kVW) = sum_r sum_c w[g][r][c] * rows[r][cb + c][:] (rows are [M][pitch]).
static void group_weighted_rows(int nq, const float* w, int R, int Wspan, const float* const* rows,
                                int pitch, int cb, int nvec, float* const* out) {
  const int64_t qstride = static_cast<int64_t>(R) * Wspan;
  for (int j0 = 0; j0 < nvec; j0 += kGroupVecs) {
    const int n = nvec - j0 < kGroupVecs ? nvec - j0 : kGroupVecs;
    const int col0 = j0 * kVW;
    switch (nq) {
      case 1: group_accum_nv<1>(n, w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
      case 2: group_accum_nv<2>(n, w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
      case 3: group_accum_nv<3>(n, w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
      default: group_accum_nv<4>(n, w, qstride, R, Wspan, rows, pitch, cb, col0, out); break;
    }
  }
}

// Masks lanes outside [lo, hi) of each row to -inf and returns the max over the valid lanes.
static float mask_range_and_max(float* s, int R, int Wspan, int lo, int hi) {
  const vi lane = lanes();
  const vf ninf = splat(-__builtin_inff());
  vf m = ninf;
  for (int r = 0; r < R; ++r) {
    float* row = s + static_cast<int64_t>(r) * Wspan;
    for (int c = 0; c < Wspan; c += kVW) {
      vf x = ld(row + c);
      const vi l = lane + c;
      x = (l >= lo) & (l < hi) ? x : ninf;
      st(row + c, x);
      m = x > m ? x : m;
    }
  }
  return hmax(m);
}

// Splits queries [0, T) into groups: [t0, t1) with a shared span of columns.
struct Group {
  int t0, t1, cb, Wspan;
};
static Group next_group(const TileShape& s, int t0) {
  const int limit = padded_window(s.col_count[t0] + kGroup - 1, kVW);
  int t1 = t0 + 1;
  while (t1 < s.T && t1 - t0 < kGroup &&
         s.col_begin[t1] + s.col_count[t1] - s.col_begin[t0] <= limit)
    ++t1;
  const int span = s.col_begin[t1 - 1] + s.col_count[t1 - 1] - s.col_begin[t0];
  return {t0, t1, s.col_begin[t0], padded_window(span, kVW)};
}

void forward_tile(const ForwardTile& a) {
  const TileShape& s = a.s;
  for (int t0 = 0; t0 < s.T;) {
    const Group gr = next_group(s, t0);
    const int nq = gr.t1 - gr.t0;
    const int64_t qstride = static_cast<int64_t>(s.R) * gr.Wspan;
    const float* x[kGroup];
    float* o[kGroup];
    for (int g = 0; g < nq; ++g) {
      x[g] = a.q + static_cast<int64_t>(gr.t0 + g) * s.Dp;
      o[g] = a.o + static_cast<int64_t>(gr.t0 + g) * s.Dvp;
    }
    float* sc = a.scratch;
    float* sadd = a.scratch + kGroup * qstride;
    group_scores(nq, x, s.D, a.kt_rows, s.R, a.pitch, gr.cb, gr.Wspan, sc);
    float l[kGroup], m[kGroup];
    for (int g = 0; g < nq; ++g) {
      const int t = gr.t0 + g, lo = s.col_begin[t] - gr.cb;
      float* sg = sc + g * qstride;
      float* ag = sadd + g * s.A;
      m[g] = mask_range_and_max(sg, s.R, gr.Wspan, lo, lo + s.col_count[t]) * a.scale_log2;
      for (int n = 0; n < s.A; ++n) {
        ag[n] = dot(x[g], a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp) * a.scale_log2;
        m[g] = ag[n] > m[g] ? ag[n] : m[g];
      }
      l[g] = exp_rows(sg, static_cast<int>(qstride), a.scale_log2, m[g]);
      for (int n = 0; n < s.A; ++n) {
        ag[n] = exp2s(ag[n] - m[g]);
        l[g] += ag[n];
      }
    }
    group_weighted_rows(nq, sc, s.R, gr.Wspan, a.v_rows, s.Dvp, gr.cb, s.Dvp / kVW, o);
    for (int g = 0; g < nq; ++g) {
      for (int n = 0; n < s.A; ++n)
        axpy(sadd[g * s.A + n], a.add_v + static_cast<int64_t>(n) * s.Dvp, o[g], s.Dvp);
      const float inv = 1.f / l[g];
      for (int e = 0; e < s.Dvp; e += kVW) st(o[g] + e, ld(o[g] + e) * inv);
      // log2 -> natural log: lse = (m + log2 l) * ln 2.
      a.lse[gr.t0 + g] = (m[g] + __builtin_log2f(l[g])) * 0.69314718055994531f;
    }
    t0 = gr.t1;
  }
}

void backward_tile(const BackwardTile& a) {
  const TileShape& s = a.s;
  int wmax = 0;
  for (int t = 0; t < s.T; ++t) wmax = s.col_count[t] > wmax ? s.col_count[t] : wmax;
  const int Wp = padded_window(wmax, kVW);
  const int64_t plane = static_cast<int64_t>(s.R) * Wp;
  // Phase 1, per query: P, dP, dS, dQ.
  for (int t = 0; t < s.T; ++t) {
    const int cb = s.col_begin[t], count = s.col_count[t];
    const float* q = a.q + static_cast<int64_t>(t) * s.Dp;
    const float* d_o = a.d_o + static_cast<int64_t>(t) * s.Dvp;
    float* p = a.p + t * plane;
    float* ds = a.ds + t * plane;
    scores(q, s.D, a.kt_rows, s.R, a.pitch, cb, Wp, p);
    mask_and_max(p, s.R, Wp, count);
    exp_rows(p, static_cast<int>(plane), a.scale_log2, a.lse2[t]);
    scores(d_o, s.Dv, a.vt_rows, s.R, a.pitch, cb, Wp, ds);  // dP
    const vf delta = splat(a.delta[t]);
    for (int64_t c = 0; c < plane; c += kVW) st(ds + c, ld(p + c) * (ld(ds + c) - delta));
    float* dq = a.dq + static_cast<int64_t>(t) * s.Dp;
    weighted_rows(ds, s.R, Wp, count, a.k_rows, s.Dp, cb, s.Dp / kVW, dq);
    for (int n = 0; n < s.A; ++n) {
      const float pn = exp2s(dot(q, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp) * a.scale_log2 - a.lse2[t]);
      const float dpn = dot(d_o, a.add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
      const float dsn = pn * (dpn - a.delta[t]);
      a.p_add[t * s.A + n] = pn;
      a.ds_add[t * s.A + n] = dsn;
      axpy(dsn, a.add_k + static_cast<int64_t>(n) * s.Dp, dq, s.Dp);
    }
    const vf sc = splat(a.scale);
    for (int e = 0; e < s.Dp; e += kVW) st(dq + e, ld(dq + e) * sc);
  }
  // Phase 2, per key of the box: dK += scale * sum_t dS * q_t, dV += sum_t P * dO_t over the
  // queries whose window holds the column: a contiguous range of t (windows are monotone), so
  // the sums are register-blocked GEMV-like passes over consecutive q / dO rows.
  float* wk = a.w;
  float* wv = a.w + s.T;
  for (int m = 0; m < s.M; ++m) {
    int t0 = 0;
    while (t0 < s.T && m >= s.col_begin[t0] + s.col_count[t0]) ++t0;
    int t1 = t0;
    while (t1 < s.T && m >= s.col_begin[t1]) ++t1;
    if (t1 <= t0) continue;
    for (int r = 0; r < s.R; ++r) {
      for (int t = t0; t < t1; ++t) {
        const int64_t at = t * plane + static_cast<int64_t>(r) * Wp + (m - s.col_begin[t]);
        wk[t - t0] = a.ds[at] * a.scale;
        wv[t - t0] = a.p[at];
      }
      accum_all(wk, t1 - t0, a.q + static_cast<int64_t>(t0) * s.Dp, s.Dp, s.Dp / kVW,
                a.dk_rows[r] + static_cast<int64_t>(m) * s.Dp, true);
      accum_all(wv, t1 - t0, a.d_o + static_cast<int64_t>(t0) * s.Dvp, s.Dvp, s.Dvp / kVW,
                a.dv_rows[r] + static_cast<int64_t>(m) * s.Dvp, true);
    }
  }
  for (int n = 0; n < s.A; ++n)
    for (int t = 0; t < s.T; ++t) {
      axpy(a.ds_add[t * s.A + n] * a.scale, a.q + static_cast<int64_t>(t) * s.Dp,
           a.d_add_k + static_cast<int64_t>(n) * s.Dp, s.Dp);
      axpy(a.p_add[t * s.A + n], a.d_o + static_cast<int64_t>(t) * s.Dvp,
           a.d_add_v + static_cast<int64_t>(n) * s.Dvp, s.Dvp);
    }
}

}  // namespace FNA_CPU_ISA
}  // namespace cpu
}  // namespace fna
