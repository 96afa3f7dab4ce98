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

void forward_tile(const ForwardTile& a) {
  const TileShape& s = a.s;
  for (int t = 0; t < s.T; ++t) {
    const int cb = s.col_begin[t], count = s.col_count[t];
    const int Wp = padded_window(count, kVW);
    const float* q = a.q + static_cast<int64_t>(t) * s.Dp;
    float* sc = a.scratch;
    float* sadd = a.scratch + static_cast<int64_t>(s.R) * Wp;
    scores(q, s.D, a.kt_rows, s.R, a.pitch, cb, Wp, sc);
    float m = mask_and_max(sc, s.R, Wp, count) * a.scale_log2;
    for (int n = 0; n < s.A; ++n) {
      sadd[n] = dot(q, a.add_k + static_cast<int64_t>(n) * s.Dp, s.Dp) * a.scale_log2;
      m = sadd[n] > m ? sadd[n] : m;
    }
    float l = exp_rows(sc, s.R * Wp, a.scale_log2, m);
    for (int n = 0; n < s.A; ++n) {
      sadd[n] = exp2s(sadd[n] - m);
      l += sadd[n];
    }
    float* o = a.o + static_cast<int64_t>(t) * s.Dvp;
    weighted_rows(sc, s.R, Wp, count, a.v_rows, s.Dvp, cb, s.Dvp / kVW, o);
    for (int n = 0; n < s.A; ++n) axpy(sadd[n], a.add_v + static_cast<int64_t>(n) * s.Dvp, o, s.Dvp);
    const float inv = 1.f / l;
    for (int e = 0; e < s.Dvp; e += kVW) st(o + e, ld(o + e) * inv);
    // log2 -> natural log: lse = (m + log2 l) * ln 2.
    a.lse[t] = (m + __builtin_log2f(l)) * 0.69314718055994531f;
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
