#include "support/check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>

#include "core/dtype.h"

namespace fna_test {

void Check::merge(const Check& o) {
  if (!o.ok) ok = false;
  if (o.bound > 0 && (bound <= 0 || o.err / o.bound > err / std::max(bound, 1e-300))) {
    err = o.err;
    bound = o.bound;
  }
  what += o.what;
}

double unit_roundoff(fna::DType t) {
  switch (t) {
    case fna::DType::f32: return std::ldexp(1.0, -24);
    case fna::DType::f16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -8);
  }
}

Check compare(const std::string& name, const std::vector<double>& out,
              const std::vector<double>& ref, const std::vector<double>& naive, fna::DType dtype,
              const Tolerance& tol) {
  Check c;
  std::ostringstream os;
  if (out.size() != ref.size()) {
    c.ok = false;
    os << "  " << name << ": size " << out.size() << " != ref size " << ref.size() << "\n";
    c.what = os.str();
    return c;
  }
  // float32 judged as TF32 follows the low-precision rule with TF32's unit roundoff.
  const bool tf32 = dtype == fna::DType::f32 && tol.tf32;
  const bool lowp = dtype != fna::DType::f32 || tf32;
  double err = 0, ref_max = 0, naive_err = 0;
  int64_t worst = -1, nan_at = -1, inf_mismatch = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i]) || std::isnan(ref[i])) {
      if (nan_at < 0) nan_at = static_cast<int64_t>(i);
      continue;
    }
    if (std::isinf(ref[i]) || std::isinf(out[i])) {
      if (out[i] != ref[i] && inf_mismatch < 0) inf_mismatch = static_cast<int64_t>(i);
      continue;
    }
    ref_max = std::max(ref_max, std::fabs(ref[i]));
    const double e = std::fabs(out[i] - ref[i]);
    if (e > err) {
      err = e;
      worst = static_cast<int64_t>(i);
    }
    if (lowp && i < naive.size() && std::isfinite(naive[i]))
      naive_err = std::max(naive_err, std::fabs(naive[i] - ref[i]));
  }
  ref_max = std::max(ref_max, tol.magnitude_floor);
  const double u = tf32 ? std::ldexp(1.0, -11) : unit_roundoff(dtype);
  double bound;
  if (!lowp) {
    bound = tol.f32_rel * ref_max;
  } else {
    if (naive.size() != ref.size()) naive_err = 0;  // no naive: only atol
    bound = tol.naive_factor * naive_err + tol.atol_units * u * ref_max;
  }
  // An all-zero reference (e.g. grads of a key nobody attends) must be matched to rounding noise.
  bound = std::max(bound, 1e-30);
  c.err = err;
  c.bound = bound;
  c.ok = err <= bound && nan_at < 0 && inf_mismatch < 0;
  os << "  " << name << ": " << (c.ok ? "ok" : "FAIL") << " max|out-ref|=" << err
     << " bound=" << bound << " (max|ref|=" << ref_max;
  if (lowp) os << ", max|naive" << (tf32 ? "_tf32" : "") << "-ref|=" << naive_err;
  os << ")";
  if (worst >= 0 && !c.ok) os << " worst at " << worst << ": out=" << out[worst] << " ref=" << ref[worst];
  if (nan_at >= 0) os << " NaN at " << nan_at << " (out=" << out[nan_at] << " ref=" << ref[nan_at] << ")";
  if (inf_mismatch >= 0)
    os << " inf mismatch at " << inf_mismatch << " (out=" << out[inf_mismatch]
       << " ref=" << ref[inf_mismatch] << ")";
  os << "\n";
  c.what = os.str();
  return c;
}

// ---- naive computations ---------------------------------------------------------------------------

namespace {

// TF32 (10 explicit mantissa bits), round to nearest with ties away from zero (cvt.rna.tf32.f32).
float round_tf32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to the dtype (float32 included): every intermediate of the naive computation goes here.
struct Rounder {
  fna::DType t;
  bool tf32 = false;  // operands of products are rounded to TF32 (float32 problems)
  // An operand of a product (float32 accumulation follows).
  float in(double x) const {
    const float f = static_cast<float>(x);
    return tf32 ? round_tf32(f) : f;
  }
  double operator()(double x) const {
    const float f = static_cast<float>(x);
    switch (t) {
      case fna::DType::f16: return fna::detail::f16_to_float(fna::detail::float_to_f16(f));
      case fna::DType::bf16: return fna::detail::bf16_to_float(fna::detail::float_to_bf16(f));
      default: return f;
    }
  }
};

// Dense views of all inputs of a case with index helpers.
struct Dense {
  const fna::Problem& p;
  int64_t N, W, A, H, Hk, D, Dv, group;
  std::vector<double> q, k, v, add_k, add_v, d_o, attn, d_attn;
  explicit Dense(const ProblemTensors& t)
      : p(t.c.p), N(p.tokens()), W(p.window()), A(p.num_additional), H(p.heads), Hk(p.heads_kv),
        D(p.dim), Dv(p.dim_v), group(p.heads / p.heads_kv) {
    q = t.q.to_double();
    k = t.k.to_double();
    v = t.v.to_double();
    d_o = t.d_o.to_double();
    attn = t.attn.to_double();
    d_attn = t.d_attn.to_double();
    if (A > 0) {
      add_k = t.add_k.to_double();
      add_v = t.add_v.to_double();
    }
  }
  const double* Q(int64_t b, int64_t t, int64_t h) const { return &q[((b * N + t) * H + h) * D]; }
  const double* dO(int64_t b, int64_t t, int64_t h) const { return &d_o[((b * N + t) * H + h) * Dv]; }
  // Key / value j of the combined list: j < N is a grid token, j >= N additional key j - N.
  const double* Kj(int64_t b, int64_t j, int64_t hk) const {
    return j < N ? &k[((b * N + j) * Hk + hk) * D] : &add_k[((b * A + j - N) * Hk + hk) * D];
  }
  const double* Vj(int64_t b, int64_t j, int64_t hk) const {
    return j < N ? &v[((b * N + j) * Hk + hk) * Dv] : &add_v[((b * A + j - N) * Hk + hk) * Dv];
  }
  int64_t kidx(int64_t b, int64_t j, int64_t hk, int64_t dim) const {
    return j < N ? ((b * N + j) * Hk + hk) * dim : ((b * A + j - N) * Hk + hk) * dim;
  }
  // Keys of query token t in slot order: slot -> combined key index (-1 = not a neighbor).
  std::vector<int64_t> slots(int64_t t) const {
    std::vector<int64_t> s = spec_slots(p, t);
    for (int64_t n = 0; n < A; ++n) s.push_back(N + n);
    return s;
  }
};

double dot_rounded(const double* a, const double* b, int64_t n, const Rounder& r) {
  float acc = 0.f;  // a plain matmul accumulates in float32 and rounds its output
  for (int64_t e = 0; e < n; ++e) acc += r.in(a[e]) * r.in(b[e]);
  return r(acc);
}

// The low-precision softmax probabilities of one query row, like a plain PyTorch bf16 graph:
// S = round(QK^T), S = round(S * scale), P = round(softmax_f32(S)).
// lse_in (when given): P = exp(S - lse_in) from that log-sum-exp instead of the naive softmax's own
// normalization, as a backward computes it from the forward's LSE.
void naive_probs(const Dense& d, const Rounder& r, double scale, int64_t b, int64_t t, int64_t h,
                 const std::vector<int64_t>& slots, std::vector<double>* p, double* lse,
                 const double* lse_in = nullptr) {
  const int64_t hk = h / d.group;
  std::vector<double> s(slots.size(), -std::numeric_limits<double>::infinity());
  float m = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < slots.size(); ++w) {
    if (slots[w] < 0) continue;
    s[w] = r(r(dot_rounded(d.Q(b, t, h), d.Kj(b, slots[w], hk), d.D, r)) * scale);
    m = std::max(m, static_cast<float>(s[w]));
  }
  float sum = 0.f;
  for (size_t w = 0; w < slots.size(); ++w)
    if (slots[w] >= 0) sum += std::exp(static_cast<float>(s[w]) - m);
  p->assign(slots.size(), 0.0);
  for (size_t w = 0; w < slots.size(); ++w) {
    if (slots[w] < 0) continue;
    (*p)[w] = lse_in ? r(std::exp(static_cast<float>(s[w]) - static_cast<float>(*lse_in)))
                     : r(std::exp(static_cast<float>(s[w]) - m) / sum);
  }
  if (lse) *lse = r(m + std::log(sum));
}

// Adds per-query-head float accumulators of a KV gradient into GQA KV heads: each query head's
// gradient is rounded (the expanded K's grad), then the group sum is rounded.
struct KVGrad {
  int64_t H, Hk, group, rows, dim;  // rows = B * (N + A) combined keys
  std::vector<float> acc;           // [rows][H][dim]
  KVGrad(int64_t rows_, int64_t H_, int64_t Hk_, int64_t dim_)
      : H(H_), Hk(Hk_), group(H_ / Hk_), rows(rows_), dim(dim_), acc(rows_ * H_ * dim_, 0.f) {}
  float* at(int64_t row, int64_t h) { return &acc[(row * H + h) * dim]; }
  // Splits the combined rows back into grid keys [B, N] and additional keys [B, A].
  void finish(const Rounder& r, int64_t B, int64_t N, int64_t A, std::vector<double>* grid,
              std::vector<double>* add) {
    grid->assign(B * N * Hk * dim, 0.0);
    add->assign(B * A * Hk * dim, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < N + A; ++j)
        for (int64_t hk = 0; hk < Hk; ++hk)
          for (int64_t e = 0; e < dim; ++e) {
            float s = 0.f;
            for (int64_t g = 0; g < group; ++g)
              s += static_cast<float>(r(at(b * (N + A) + j, hk * group + g)[e]));
            const double val = group > 1 ? r(s) : s;
            if (j < N) (*grid)[((b * N + j) * Hk + hk) * dim + e] = val;
            else (*add)[((b * A + j - N) * Hk + hk) * dim + e] = val;
          }
  }
};

// The largest |value| over several reference tensors (finite values only).
double max_abs(std::initializer_list<const std::vector<double>*> vs) {
  double m = 0;
  for (const auto* v : vs)
    for (double x : *v)
      if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

NaiveForward naive_forward(const ProblemTensors& t, bool tf32) {
  const Dense d(t);
  const Rounder r{d.p.dtype, tf32};
  const double scale = t.c.resolved_scale();
  NaiveForward out;
  out.o.assign(d.p.batch * d.N * d.H * d.Dv, 0.0);
  out.lse.assign(d.p.batch * d.N * d.H, 0.0);
  std::vector<double> p;
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    for (int64_t b = 0; b < d.p.batch; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        naive_probs(d, r, scale, b, t_, h, slots, &p, &out.lse[(b * d.N + t_) * d.H + h]);
        for (int64_t e = 0; e < d.Dv; ++e) {
          float acc = 0.f;
          for (size_t w = 0; w < slots.size(); ++w)
            if (slots[w] >= 0)
              acc += r.in(p[w]) * r.in(d.Vj(b, slots[w], h / d.group)[e]);
          out.o[((b * d.N + t_) * d.H + h) * d.Dv + e] = r(acc);
        }
      }
  }
  return out;
}

NaiveBackward naive_backward(const ProblemTensors& t, bool tf32) {
  const Dense d(t);
  const Rounder r{d.p.dtype, tf32};
  const double scale = t.c.resolved_scale();
  const int64_t B = d.p.batch;
  NaiveBackward out;
  out.dq.assign(B * d.N * d.H * d.D, 0.0);
  KVGrad gk(B * (d.N + d.A), d.H, d.Hk, d.D), gv(B * (d.N + d.A), d.H, d.Hk, d.Dv);
  std::vector<double> p, dp, ds;
  // TF32: the backward's P comes from the given LSE (an exact forward's in the tests) and scores
  // from TF32-rounded Q and K, so P of a row no longer sums to 1 (by up to ~1e-2 at head dim 256
  // with large scores); the naive computation does the same, or its error would miss that part.
  // Its row sum is then the backward's sum(dO * O) from the given O (dO rounded as in dP).
  const bool given = tf32 && !t.lse.empty() && !t.o.empty();
  const std::vector<double> lse_given = given ? t.lse.to_double() : std::vector<double>{};
  const std::vector<double> o_given = given ? t.o.to_double() : std::vector<double>{};
  // The gradient into the LSE (d LSE / d s_j = P_j): dS = P (dP - (rowsum - d_lse)).
  const std::vector<double> d_lse = t.d_lse.empty() ? std::vector<double>{} : t.d_lse.to_double();
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    const size_t S = slots.size();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t hk = h / d.group;
        naive_probs(d, r, scale, b, t_, h, slots, &p, nullptr,
                    lse_given.empty() ? nullptr : &lse_given[(b * d.N + t_) * d.H + h]);
        dp.assign(S, 0.0);
        float rowsum = 0.f;
        for (size_t w = 0; w < S; ++w) {
          if (slots[w] < 0) continue;
          dp[w] = dot_rounded(d.dO(b, t_, h), d.Vj(b, slots[w], hk), d.Dv, r);
          if (!given) rowsum += static_cast<float>(dp[w]) * static_cast<float>(p[w]);
        }
        if (given) {
          const double* ov = &o_given[((b * d.N + t_) * d.H + h) * d.Dv];
          for (int64_t e = 0; e < d.Dv; ++e)
            rowsum += r.in(d.dO(b, t_, h)[e]) * static_cast<float>(ov[e]);
        }
        if (!d_lse.empty()) rowsum -= static_cast<float>(d_lse[(b * d.N + t_) * d.H + h]);
        ds.assign(S, 0.0);
        for (size_t w = 0; w < S; ++w)
          if (slots[w] >= 0)
            ds[w] = r(r(static_cast<float>(p[w]) * (static_cast<float>(dp[w]) - rowsum)) * scale);
        for (int64_t e = 0; e < d.D; ++e) {
          float acc = 0.f;
          for (size_t w = 0; w < S; ++w)
            if (slots[w] >= 0)
              acc += r.in(ds[w]) * r.in(d.Kj(b, slots[w], hk)[e]);
          out.dq[((b * d.N + t_) * d.H + h) * d.D + e] = r(acc);
        }
        for (size_t w = 0; w < S; ++w) {
          if (slots[w] < 0) continue;
          float* k_acc = gk.at(b * (d.N + d.A) + slots[w], h);
          float* v_acc = gv.at(b * (d.N + d.A) + slots[w], h);
          const double* qv = d.Q(b, t_, h);
          const double* dov = d.dO(b, t_, h);
          for (int64_t e = 0; e < d.D; ++e) k_acc[e] += r.in(ds[w]) * r.in(qv[e]);
          for (int64_t e = 0; e < d.Dv; ++e) v_acc[e] += r.in(p[w]) * r.in(dov[e]);
        }
      }
  }
  gk.finish(r, B, d.N, d.A, &out.dk, &out.d_add_k);
  gv.finish(r, B, d.N, d.A, &out.dv, &out.d_add_v);
  return out;
}

std::vector<double> naive_qk(const ProblemTensors& t) {
  const Dense d(t);
  const Rounder r{d.p.dtype};
  const double scale = t.c.scale > 0 ? t.c.scale : 1.0;
  const int64_t S = d.W + d.A;
  std::vector<double> out(d.p.batch * d.N * d.H * S, 0.0);
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    for (int64_t b = 0; b < d.p.batch; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t w = 0; w < S; ++w) {
          double& o = out[((b * d.N + t_) * d.H + h) * S + w];
          if (slots[w] < 0) {
            o = -std::numeric_limits<double>::infinity();
            continue;
          }
          o = dot_rounded(d.Q(b, t_, h), d.Kj(b, slots[w], h / d.group), d.D, r);
          if (scale != 1.0) o = r(o * scale);
        }
  }
  return out;
}

std::vector<double> naive_av(const ProblemTensors& t) {
  const Dense d(t);
  const Rounder r{d.p.dtype};
  const int64_t S = d.W + d.A;
  std::vector<double> out(d.p.batch * d.N * d.H * d.Dv, 0.0);
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    for (int64_t b = 0; b < d.p.batch; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t e = 0; e < d.Dv; ++e) {
          float acc = 0.f;
          for (int64_t w = 0; w < S; ++w)
            if (slots[w] >= 0)
              acc += static_cast<float>(d.attn[((b * d.N + t_) * d.H + h) * S + w]) *
                     static_cast<float>(d.Vj(b, slots[w], h / d.group)[e]);
          out[((b * d.N + t_) * d.H + h) * d.Dv + e] = r(acc);
        }
  }
  return out;
}

NaiveBackward naive_qk_backward(const ProblemTensors& t) {
  const Dense d(t);
  const Rounder r{d.p.dtype};
  const double scale = t.c.scale > 0 ? t.c.scale : 1.0;
  const int64_t S = d.W + d.A, B = d.p.batch;
  NaiveBackward out;
  out.dq.assign(B * d.N * d.H * d.D, 0.0);
  KVGrad gk(B * (d.N + d.A), d.H, d.Hk, d.D);
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t hk = h / d.group;
        const double* da = &d.d_attn[((b * d.N + t_) * d.H + h) * S];
        std::vector<float> g(S, 0.f);
        for (int64_t w = 0; w < S; ++w)
          if (slots[w] >= 0) g[w] = static_cast<float>(scale != 1.0 ? r(da[w] * scale) : da[w]);
        for (int64_t e = 0; e < d.D; ++e) {
          float acc = 0.f;
          for (int64_t w = 0; w < S; ++w)
            if (slots[w] >= 0) acc += g[w] * static_cast<float>(d.Kj(b, slots[w], hk)[e]);
          out.dq[((b * d.N + t_) * d.H + h) * d.D + e] = r(acc);
        }
        for (int64_t w = 0; w < S; ++w) {
          if (slots[w] < 0) continue;
          float* acc = gk.at(b * (d.N + d.A) + slots[w], h);
          for (int64_t e = 0; e < d.D; ++e) acc[e] += g[w] * static_cast<float>(d.Q(b, t_, h)[e]);
        }
      }
  }
  gk.finish(r, B, d.N, d.A, &out.dk, &out.d_add_k);
  return out;
}

NaiveAVBackward naive_av_backward(const ProblemTensors& t) {
  const Dense d(t);
  const Rounder r{d.p.dtype};
  const int64_t S = d.W + d.A, B = d.p.batch;
  NaiveAVBackward out;
  out.d_attn.assign(B * d.N * d.H * S, 0.0);
  KVGrad gv(B * (d.N + d.A), d.H, d.Hk, d.Dv);
  for (int64_t t_ = 0; t_ < d.N; ++t_) {
    const std::vector<int64_t> slots = d.slots(t_);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t hk = h / d.group;
        const int64_t row = ((b * d.N + t_) * d.H + h) * S;
        for (int64_t w = 0; w < S; ++w) {
          if (slots[w] < 0) continue;  // non-neighbor slots: the grad is unspecified-but-finite
          out.d_attn[row + w] = dot_rounded(d.dO(b, t_, h), d.Vj(b, slots[w], hk), d.Dv, r);
          float* acc = gv.at(b * (d.N + d.A) + slots[w], h);
          for (int64_t e = 0; e < d.Dv; ++e)
            acc[e] += static_cast<float>(d.attn[row + w]) * static_cast<float>(d.dO(b, t_, h)[e]);
        }
      }
  }
  gv.finish(r, B, d.N, d.A, &out.dv, &out.d_add_v);
  return out;
}

// ---- whole-call checks ---------------------------------------------------------------------------

Check check_forward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const NaiveForward nv =
      dt == fna::DType::f32 && !tol.tf32 ? NaiveForward{} : naive_forward(got, tol.tf32);
  Check c = compare("output", got.o.to_double(), ref.o.to_double(), nv.o, dt, tol);
  if (got.c.with_lse) {
    // LSE is float32 in every dtype, but computed from low-precision logits: same criterion.
    c.merge(compare("lse", got.lse.to_double(), ref.lse.to_double(), nv.lse, dt, tol));
  }
  return c;
}

Check check_backward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const NaiveBackward nv =
      dt == fna::DType::f32 && !tol.tf32 ? NaiveBackward{} : naive_backward(got, tol.tf32);
  const std::vector<double> rq = ref.dq.to_double(), rk = ref.dk.to_double(),
                            rv = ref.dv.to_double(), rak = ref.d_add_k.to_double(),
                            rav = ref.d_add_v.to_double();
  Tolerance t = tol;
  t.magnitude_floor = std::max(tol.magnitude_floor, max_abs({&rq, &rk, &rv, &rak, &rav}));
  Check c = compare("d_query", got.dq.to_double(), rq, nv.dq, dt, t);
  c.merge(compare("d_key", got.dk.to_double(), rk, nv.dk, dt, t));
  c.merge(compare("d_value", got.dv.to_double(), rv, nv.dv, dt, t));
  if (got.c.p.num_additional > 0) {
    c.merge(compare("d_additional_keys", got.d_add_k.to_double(), rak, nv.d_add_k, dt, t));
    c.merge(compare("d_additional_values", got.d_add_v.to_double(), rav, nv.d_add_v, dt, t));
  }
  return c;
}

Check check_qk(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const std::vector<double> nv = dt == fna::DType::f32 ? std::vector<double>{} : naive_qk(got);
  return compare("attn", got.attn.to_double(), ref.attn.to_double(), nv, dt, tol);
}

Check check_av(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const std::vector<double> nv = dt == fna::DType::f32 ? std::vector<double>{} : naive_av(got);
  return compare("output", got.o.to_double(), ref.o.to_double(), nv, dt, tol);
}

Check check_qk_backward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const NaiveBackward nv = dt == fna::DType::f32 ? NaiveBackward{} : naive_qk_backward(got);
  const std::vector<double> rq = ref.dq.to_double(), rk = ref.dk.to_double(),
                            rak = ref.d_add_k.to_double();
  Tolerance t = tol;
  t.magnitude_floor = std::max(tol.magnitude_floor, max_abs({&rq, &rk, &rak}));
  Check c = compare("d_query", got.dq.to_double(), rq, nv.dq, dt, t);
  c.merge(compare("d_key", got.dk.to_double(), rk, nv.dk, dt, t));
  if (got.c.p.num_additional > 0)
    c.merge(compare("d_additional_keys", got.d_add_k.to_double(), rak, nv.d_add_k, dt, t));
  return c;
}

Check check_av_backward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol) {
  const fna::DType dt = got.c.p.dtype;
  const NaiveAVBackward nv = dt == fna::DType::f32 ? NaiveAVBackward{} : naive_av_backward(got);
  Check c = compare("d_value", got.dv.to_double(), ref.dv.to_double(), nv.dv, dt, tol);
  if (got.c.p.num_additional > 0)
    c.merge(compare("d_additional_values", got.d_add_v.to_double(), ref.d_add_v.to_double(),
                    nv.d_add_v, dt, tol));
  // d_attn of non-neighbor slots is not defined by the API; compare neighbor slots only.
  std::vector<double> g = got.d_attn.to_double(), rf = ref.d_attn.to_double();
  std::vector<double> nvd = nv.d_attn;
  const std::vector<double> mask = naive_qk(ref);  // -inf marks non-neighbor slots
  for (size_t i = 0; i < rf.size(); ++i)
    if (std::isinf(mask[i])) {
      g[i] = rf[i] = 0.0;
      if (!nvd.empty()) nvd[i] = 0.0;
    }
  c.merge(compare("d_attn", g, rf, nvd, dt, tol));
  return c;
}

}  // namespace fna_test
