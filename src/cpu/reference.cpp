// The CPU reference: the oracle every other backend is checked against.
//
// Straight from docs/semantics.md: for every query (of the query region, when the problem has one:
// Q-role tensors are then read and written at region coordinates, each query's window that of its
// grid coordinate) it scans ALL key tokens and tests membership with its own
// evaluation of the SPEC formulas (it deliberately does not include core/neighborhood.h, so a bug
// in the shared window arithmetic cannot hide), then does the math in float64. Slow by design.
// Its softmax statistics (max, sum, LSE) stay float64 inside, forward and backward: the backward
// recomputes them from Q and K rather than reading the float32 LSE (or O) it is given, so it is
// the float64 gradient at any score magnitude (issue 28).
#include <cmath>
#include <limits>
#include <vector>

#include "core/backends.h"
#include "cpu/strided.h"

namespace fna {
namespace detail {

namespace {

using cpu::Strided;

// docs/semantics.md section 1 for one axis: the dilation group and the local [start, end) of coordinate x.
struct SpecAxis {
  int64_t L, K, d, s;
  bool causal;
};
struct SpecWindow {
  int64_t group, start, end;
};

SpecWindow spec_window(const SpecAxis& a, int64_t x) {
  const int64_t g = x % a.d, i = x / a.d;
  const int64_t Lg = (a.L - g + a.d - 1) / a.d;  // ceil((L - g) / d)
  if (a.causal) {
    int64_t leader = (i / a.s) * a.s + a.s - 1;
    if (leader > Lg - 1) leader = Lg - 1;
    const int64_t start = leader - a.K + 1 > 0 ? leader - a.K + 1 : 0;
    const int64_t end = i + 1 < Lg ? i + 1 : Lg;
    return {g, start, end};
  }
  const int64_t left = a.K / 2, right = a.K - 1 - left;
  int64_t leader = (i / a.s) * a.s + a.s / 2;
  if (leader > Lg - 1) leader = Lg - 1;
  int64_t start = leader - left > 0 ? leader - left : 0;
  if (leader + right >= Lg) start += Lg - right - leader - 1;
  return {g, start, start + a.K};
}

// The query region (Problem::query_offset / query_shape; the whole grid without one): region
// token r, row-major over the region's extents, is the grid token of coordinate
// query_offset_a + i_a. The queries' windows are those of their grid coordinates.
struct QueryRegion {
  int rank;
  int64_t off[kMaxRank] = {0, 0, 0}, ext[kMaxRank] = {1, 1, 1}, shape[kMaxRank] = {1, 1, 1};
  int64_t count = 1;  // tokens of the region
  explicit QueryRegion(const Problem& p) : rank(p.rank) {
    for (int a = 0; a < rank; ++a) {
      off[a] = p.query_offset[a];
      ext[a] = p.query_shape[a] != 0 ? p.query_shape[a] : p.shape[a] - p.query_offset[a];
      shape[a] = p.shape[a];
      count *= ext[a];
    }
  }
  int64_t grid_token(int64_t r) const {
    int64_t i[kMaxRank] = {0, 0, 0};
    for (int a = rank - 1; a >= 0; --a) {
      i[a] = r % ext[a];
      r /= ext[a];
    }
    int64_t t = 0;
    for (int a = 0; a < rank; ++a) t = t * shape[a] + off[a] + i[a];
    return t;
  }
};

// Neighbors of each query, found by testing every key token.
class Membership {
 public:
  explicit Membership(const Problem& p) : p_(p), n_(p.tokens()) {
    for (int a = 0; a < p.rank; ++a) {
      ax_[a] = {p.shape[a], p.kernel_size[a], p.dilation[a], p.stride[a], p.is_causal[a]};
      win_[a].resize(static_cast<size_t>(p.shape[a]));
      for (int64_t x = 0; x < p.shape[a]; ++x) win_[a][x] = spec_window(ax_[a], x);
    }
  }

  // Key tokens of query token qt in increasing token order, and their slot in the window box
  // (row-major over [start_a, start_a + K_a), last axis fastest).
  void neighbors(int64_t qt, std::vector<int64_t>* keys, std::vector<int64_t>* slots) const {
    keys->clear();
    slots->clear();
    int64_t qc[kMaxRank] = {0, 0, 0};
    for (int a = p_.rank - 1; a >= 0; --a) {
      qc[a] = qt % p_.shape[a];
      qt /= p_.shape[a];
    }
    int64_t kc[kMaxRank] = {0, 0, 0};
    for (int64_t kt = 0; kt < n_; ++kt) {
      bool member = true;
      int64_t slot = 0;
      for (int a = 0; a < p_.rank && member; ++a) {
        const SpecWindow& w = win_[a][qc[a]];
        const int64_t j = kc[a] / ax_[a].d;
        member = kc[a] % ax_[a].d == w.group && j >= w.start && j < w.end;
        slot = slot * ax_[a].K + (j - w.start);
      }
      if (member) {
        keys->push_back(kt);
        slots->push_back(slot);
      }
      for (int a = p_.rank - 1; a >= 0; --a) {  // next key coordinate (odometer)
        if (++kc[a] < p_.shape[a]) break;
        kc[a] = 0;
      }
    }
  }

 private:
  const Problem& p_;
  int64_t n_;
  SpecAxis ax_[kMaxRank];
  std::vector<SpecWindow> win_[kMaxRank];
};

// All views of a call plus the combined key list: key index j < N is a grid token, j >= N the
// additional token j - N.
struct Views {
  const Problem& p;
  int64_t N, A, group;
  Strided k, v, add_k, add_v;
  Views(const Problem& p_, const TensorRef& k_, const TensorRef& v_, const TensorRef& ak,
        const TensorRef& av)
      : p(p_), N(p_.tokens()), A(p_.num_additional), group(p_.heads / p_.heads_kv),
        k(cpu::grid_view(k_, p_, p_.dtype)), v(cpu::grid_view(v_, p_, p_.dtype)),
        add_k(cpu::add_view(ak, p_)), add_v(cpu::add_view(av, p_)) {}
  void load_row(const Strided& s, int64_t b, int64_t t, int64_t h, int64_t n,
                std::vector<double>* out) const {
    out->resize(static_cast<size_t>(n));
    const int64_t off = s.token_offset(b, t, h);
    for (int64_t e = 0; e < n; ++e) (*out)[e] = s.load(off + e * s.se);
  }
  void key(int64_t b, int64_t j, int64_t hk, std::vector<double>* out) const {
    if (j < N) load_row(k, b, j, hk, p.dim, out);
    else load_row(add_k, b, j - N, hk, p.dim, out);
  }
  void value(int64_t b, int64_t j, int64_t hk, std::vector<double>* out) const {
    if (j < N) load_row(v, b, j, hk, p.dim_v, out);
    else load_row(add_v, b, j - N, hk, p.dim_v, out);
  }
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t e = 0; e < a.size(); ++e) s += a[e] * b[e];
  return s;
}

// Dense float64 accumulator for KV-shaped gradients over the combined key list.
struct KVAccum {
  int64_t N, A, Hk, dim;
  std::vector<double> acc;
  KVAccum(int64_t B, int64_t N_, int64_t A_, int64_t Hk_, int64_t dim_)
      : N(N_), A(A_), Hk(Hk_), dim(dim_), acc(static_cast<size_t>(B * (N_ + A_) * Hk_ * dim_), 0.0) {}
  double* at(int64_t b, int64_t j, int64_t hk) { return &acc[((b * (N + A) + j) * Hk + hk) * dim]; }
  void write(const Problem& p, const TensorRef& grid, const TensorRef& add) {
    const Strided g = cpu::grid_view(grid, p, p.dtype), ad = cpu::add_view(add, p);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < N + A; ++j)
        for (int64_t hk = 0; hk < Hk; ++hk) {
          const Strided& s = j < N ? g : ad;
          if (!s.present()) continue;
          const int64_t off = s.token_offset(b, j < N ? j : j - N, hk);
          const double* src = at(b, j, hk);
          for (int64_t e = 0; e < dim; ++e) s.store(off + e * s.se, src[e]);
        }
  }
};

// The relative positional bias (ForwardArgs::rpb, float32 [H, 2 K_a - 1 ..]) from its
// definition: query grid token qt and grid key token kt of head h get
// rpb[h, (k_a - q_a) / dilation_a + K_a - 1 ..] (the key is in the query's window, so in its
// dilation group). The gradient accumulates in float64 and is stored by store_grad.
class Bias {
 public:
  Bias(const Problem& p, const TensorRef& rpb) : p_(p), ref_(rpb), size_(cpu::bias_elements(p)) {}
  bool present() const { return ref_.data != nullptr; }
  // The element offset (strides of `ref`) and the dense index of the pair's entry.
  void index(int64_t h, int64_t qt, int64_t kt, const TensorRef& ref, int64_t* off,
             int64_t* dense) const {
    int64_t qc[kMaxRank] = {0, 0, 0}, kc[kMaxRank] = {0, 0, 0};
    for (int a = p_.rank - 1; a >= 0; --a) {
      qc[a] = qt % p_.shape[a];
      qt /= p_.shape[a];
      kc[a] = kt % p_.shape[a];
      kt /= p_.shape[a];
    }
    *off = h * ref.strides[0];
    *dense = h;
    for (int a = 0; a < p_.rank; ++a) {
      const int64_t i = (kc[a] - qc[a]) / p_.dilation[a] + p_.kernel_size[a] - 1;
      *off += i * ref.strides[a + 1];
      *dense = *dense * (2 * p_.kernel_size[a] - 1) + i;
    }
  }
  double at(int64_t h, int64_t qt, int64_t kt) const {
    int64_t off = 0, dense = 0;
    index(h, qt, kt, ref_, &off, &dense);
    return static_cast<const float*>(ref_.data)[off];
  }
  // d_rpb (float64, dense) += g at the pair's entry.
  void add_grad(std::vector<double>* grad, int64_t h, int64_t qt, int64_t kt, double g) const {
    int64_t off = 0, dense = 0;
    index(h, qt, kt, ref_, &off, &dense);
    if (grad->empty()) grad->assign(static_cast<size_t>(size_), 0.0);
    (*grad)[static_cast<size_t>(dense)] += g;
  }
  // Writes the dense float64 gradient into d_rpb (its strides), zeros where nothing was added.
  void store_grad(const std::vector<double>& grad, const TensorRef& d_rpb) const {
    for (int64_t i = 0; i < size_; ++i)
      static_cast<float*>(d_rpb.data)[cpu::bias_offset(p_, d_rpb, i)] =
          grad.empty() ? 0.f : static_cast<float>(grad[static_cast<size_t>(i)]);
  }

 private:
  const Problem& p_;
  TensorRef ref_;
  int64_t size_;
};

// Logits (scaled, plus the bias when given) of one query row (grid token qt, head h) over its
// neighbors then the additional keys (no bias).
void row_logits(const Views& vw, const std::vector<double>& q, int64_t b, int64_t h, int64_t hk,
                int64_t qt, const Bias& bias, const std::vector<int64_t>& keys, double scale,
                std::vector<double>* logits) {
  std::vector<double> kr;
  logits->clear();
  for (int64_t j : keys) {
    vw.key(b, j, hk, &kr);
    logits->push_back(scale * dot(q, kr) + (bias.present() ? bias.at(h, qt, j) : 0.0));
  }
  for (int64_t n = 0; n < vw.A; ++n) {
    vw.key(b, vw.N + n, hk, &kr);
    logits->push_back(scale * dot(q, kr));
  }
}

// A row's softmax statistics in float64: the max m and sum = sum_j exp(s_j - m). A weight is
// exp(s_j - m) / sum, never exp(s_j - lse): lse = m + log(sum) loses log(sum) to rounding once
// |m| is beyond ~1e15 (all-equal scores of 4e16 then weighed every key 1 instead of 1 / n).
struct RowStats {
  double m = -std::numeric_limits<double>::infinity(), sum = 0;
  double weight(double s) const { return std::exp(s - m) / sum; }
  double lse() const { return m + std::log(sum); }
};
RowStats row_stats(const std::vector<double>& logits) {
  RowStats st;
  for (double l : logits) st.m = std::max(st.m, l);
  for (double l : logits) st.sum += std::exp(l - st.m);
  return st;
}

}  // namespace

Status reference_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const Views vw(p, a.k, a.v, a.add_k, a.add_v);
  // Q, O and LSE have the query region's extents (region token r); K and V the grid's.
  const Strided q = cpu::region_view(a.q, p, p.dtype), o = cpu::region_view(a.o, p, p.dtype);
  const Strided lse = cpu::region_view(a.lse, p, DType::f32, false);
  const Membership mem(p);
  const QueryRegion region(p);
  const Bias bias(p, a.rpb);
  std::vector<int64_t> keys, slots;
  std::vector<double> qr, vr, logits, acc;
  for (int64_t t = 0; t < region.count; ++t) {
    const int64_t qt = region.grid_token(t);
    mem.neighbors(qt, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        vw.load_row(q, b, t, h, p.dim, &qr);
        row_logits(vw, qr, b, h, hk, qt, bias, keys, opt.scale, &logits);
        const RowStats st = row_stats(logits);
        acc.assign(static_cast<size_t>(p.dim_v), 0.0);
        for (size_t w = 0; w < logits.size(); ++w) {
          const int64_t j = w < keys.size() ? keys[w] : vw.N + static_cast<int64_t>(w - keys.size());
          vw.value(b, j, hk, &vr);
          const double pw = st.weight(logits[w]);
          for (int64_t e = 0; e < p.dim_v; ++e) acc[e] += pw * vr[e];
        }
        const int64_t off = o.token_offset(b, t, h);
        for (int64_t e = 0; e < p.dim_v; ++e) o.store(off + e * o.se, acc[e]);
        if (lse.present()) lse.store(lse.token_offset(b, t, h), st.lse());
      }
  }
  return Status::Ok();
}

// Reads neither O nor LSE (see above): both are float32 roundings of what it recomputes. Reads
// d_lse when given.
Status reference_backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  const Views vw(p, a.k, a.v, a.add_k, a.add_v);
  // Q, dO, dQ and d_lse have the query region's extents (region token r); K, V, dK, dV the
  // grid's. Only the region's queries contribute to dK / dV (keys no region query sees get 0).
  const Strided q = cpu::region_view(a.q, p, p.dtype);
  const Strided d_o = cpu::region_view(a.d_o, p, p.dtype), dq = cpu::region_view(a.dq, p, p.dtype);
  const Strided d_lse = cpu::region_view(a.d_lse, p, DType::f32, false);
  const Membership mem(p);
  const QueryRegion region(p);
  KVAccum dk(p.batch, vw.N, vw.A, p.heads_kv, p.dim), dv(p.batch, vw.N, vw.A, p.heads_kv, p.dim_v);
  const Bias bias(p, a.rpb);
  std::vector<double> d_bias;  // dense [H, 2 K_a - 1 ..]: the sum of dS over each entry's pairs
  std::vector<int64_t> keys, slots;
  std::vector<double> qr, dorow, kr, vr, logits, dp, dqr;
  for (int64_t t = 0; t < region.count; ++t) {
    const int64_t qt = region.grid_token(t);
    mem.neighbors(qt, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        vw.load_row(q, b, t, h, p.dim, &qr);
        vw.load_row(d_o, b, t, h, p.dim_v, &dorow);
        row_logits(vw, qr, b, h, hk, qt, bias, keys, opt.scale, &logits);
        // The weights from the row's float64 statistics, recomputed (not from the float32 LSE
        // input), and D_i = sum_j P_ij dP_ij in float64 (not rowsum(dO * O) of the rounded O):
        // the gradient of the inputs Q, K, V alone, exact at any score magnitude.
        const RowStats st = row_stats(logits);
        dp.clear();
        double delta = 0;
        for (size_t w = 0; w < logits.size(); ++w) {
          const int64_t j = w < keys.size() ? keys[w] : vw.N + static_cast<int64_t>(w - keys.size());
          vw.value(b, j, hk, &vr);
          dp.push_back(dot(dorow, vr));
          delta += st.weight(logits[w]) * dp.back();
        }
        // A gradient g into the row's LSE: d LSE / d s_j = P_j, so dS_j gains P_j * g, which is
        // dS_j = P_j (dP_j - (D_i - g)).
        if (d_lse.present()) delta -= d_lse.load(d_lse.token_offset(b, t, h));
        dqr.assign(static_cast<size_t>(p.dim), 0.0);
        for (size_t w = 0; w < logits.size(); ++w) {
          const int64_t j = w < keys.size() ? keys[w] : vw.N + static_cast<int64_t>(w - keys.size());
          vw.key(b, j, hk, &kr);
          const double pw = st.weight(logits[w]);
          const double ds = pw * (dp[w] - delta);
          if (bias.present() && j < vw.N) bias.add_grad(&d_bias, h, qt, j, ds);
          double* dkj = dk.at(b, j, hk);
          double* dvj = dv.at(b, j, hk);
          for (int64_t e = 0; e < p.dim; ++e) {
            dqr[e] += opt.scale * ds * kr[e];
            dkj[e] += opt.scale * ds * qr[e];
          }
          for (int64_t e = 0; e < p.dim_v; ++e) dvj[e] += pw * dorow[e];
        }
        const int64_t off = dq.token_offset(b, t, h);
        for (int64_t e = 0; e < p.dim; ++e) dq.store(off + e * dq.se, dqr[e]);
      }
  }
  dk.write(p, a.dk, a.d_add_k);
  dv.write(p, a.dv, a.d_add_v);
  if (bias.present()) bias.store_grad(d_bias, a.d_rpb);
  return Status::Ok();
}

// ---- unfused operators ----------------------------------------------------------------------------

Status reference_qk_forward(const Problem& p, const QKArgs& a, const Options& opt) {
  const Views vw(p, a.k, TensorRef{}, a.add_k, TensorRef{});
  const Strided q = cpu::grid_view(a.q, p, p.dtype), attn = cpu::grid_view(a.attn, p, p.dtype);
  const int64_t W = p.window();
  const Membership mem(p);
  const Bias bias(p, a.rpb);
  std::vector<int64_t> keys, slots;
  std::vector<double> qr, kr;
  for (int64_t t = 0; t < vw.N; ++t) {
    mem.neighbors(t, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        vw.load_row(q, b, t, h, p.dim, &qr);
        const int64_t off = attn.token_offset(b, t, h);
        for (int64_t w = 0; w < W; ++w)
          attn.store(off + w * attn.se, -std::numeric_limits<double>::infinity());
        for (size_t n = 0; n < keys.size(); ++n) {
          vw.key(b, keys[n], hk, &kr);
          attn.store(off + slots[n] * attn.se, opt.scale * dot(qr, kr) +
                                                   (bias.present() ? bias.at(h, t, keys[n]) : 0.0));
        }
        for (int64_t n = 0; n < vw.A; ++n) {
          vw.key(b, vw.N + n, hk, &kr);
          attn.store(off + (W + n) * attn.se, opt.scale * dot(qr, kr));
        }
      }
  }
  return Status::Ok();
}

Status reference_qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt) {
  const Views vw(p, a.k, TensorRef{}, a.add_k, TensorRef{});
  const Strided q = cpu::grid_view(a.q, p, p.dtype), da = cpu::grid_view(a.d_attn, p, p.dtype);
  const Strided dq = cpu::grid_view(a.dq, p, p.dtype);
  const int64_t W = p.window();
  const Membership mem(p);
  KVAccum dk(p.batch, vw.N, vw.A, p.heads_kv, p.dim);
  std::vector<int64_t> keys, slots;
  std::vector<double> qr, kr, dqr;
  for (int64_t t = 0; t < vw.N; ++t) {
    mem.neighbors(t, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        vw.load_row(q, b, t, h, p.dim, &qr);
        const int64_t off = da.token_offset(b, t, h);
        dqr.assign(static_cast<size_t>(p.dim), 0.0);
        const size_t total = keys.size() + static_cast<size_t>(vw.A);
        for (size_t n = 0; n < total; ++n) {
          const bool grid = n < keys.size();
          const int64_t j = grid ? keys[n] : vw.N + static_cast<int64_t>(n - keys.size());
          const int64_t slot = grid ? slots[n] : W + static_cast<int64_t>(n - keys.size());
          const double g = opt.scale * da.load(off + slot * da.se);
          vw.key(b, j, hk, &kr);
          double* dkj = dk.at(b, j, hk);
          for (int64_t e = 0; e < p.dim; ++e) {
            dqr[e] += g * kr[e];
            dkj[e] += g * qr[e];
          }
        }
        const int64_t qo = dq.token_offset(b, t, h);
        for (int64_t e = 0; e < p.dim; ++e) dq.store(qo + e * dq.se, dqr[e]);
      }
  }
  dk.write(p, a.dk, a.d_add_k);
  return Status::Ok();
}

Status reference_av_forward(const Problem& p, const AVArgs& a, const Options&) {
  const Views vw(p, TensorRef{}, a.v, TensorRef{}, a.add_v);
  const Strided attn = cpu::grid_view(a.attn, p, p.dtype), o = cpu::grid_view(a.o, p, p.dtype);
  const int64_t W = p.window();
  const Membership mem(p);
  std::vector<int64_t> keys, slots;
  std::vector<double> vr, acc;
  for (int64_t t = 0; t < vw.N; ++t) {
    mem.neighbors(t, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        const int64_t off = attn.token_offset(b, t, h);
        acc.assign(static_cast<size_t>(p.dim_v), 0.0);
        const size_t total = keys.size() + static_cast<size_t>(vw.A);
        for (size_t n = 0; n < total; ++n) {
          const bool grid = n < keys.size();
          const int64_t j = grid ? keys[n] : vw.N + static_cast<int64_t>(n - keys.size());
          const int64_t slot = grid ? slots[n] : W + static_cast<int64_t>(n - keys.size());
          const double wgt = attn.load(off + slot * attn.se);
          vw.value(b, j, hk, &vr);
          for (int64_t e = 0; e < p.dim_v; ++e) acc[e] += wgt * vr[e];
        }
        const int64_t oo = o.token_offset(b, t, h);
        for (int64_t e = 0; e < p.dim_v; ++e) o.store(oo + e * o.se, acc[e]);
      }
  }
  return Status::Ok();
}

Status reference_av_backward(const Problem& p, const AVBackwardArgs& a, const Options&) {
  const Views vw(p, TensorRef{}, a.v, TensorRef{}, a.add_v);
  const Strided attn = cpu::grid_view(a.attn, p, p.dtype), d_o = cpu::grid_view(a.d_o, p, p.dtype);
  const Strided da = cpu::grid_view(a.d_attn, p, p.dtype);
  const int64_t W = p.window();
  const Membership mem(p);
  KVAccum dv(p.batch, vw.N, vw.A, p.heads_kv, p.dim_v);
  std::vector<int64_t> keys, slots;
  std::vector<double> vr, dorow;
  for (int64_t t = 0; t < vw.N; ++t) {
    mem.neighbors(t, &keys, &slots);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / vw.group;
        const int64_t off = attn.token_offset(b, t, h), doff = da.token_offset(b, t, h);
        vw.load_row(d_o, b, t, h, p.dim_v, &dorow);
        // Slots that are not neighbors do not influence the output: their gradient is 0.
        for (int64_t w = 0; w < W; ++w) da.store(doff + w * da.se, 0.0);
        const size_t total = keys.size() + static_cast<size_t>(vw.A);
        for (size_t n = 0; n < total; ++n) {
          const bool grid = n < keys.size();
          const int64_t j = grid ? keys[n] : vw.N + static_cast<int64_t>(n - keys.size());
          const int64_t slot = grid ? slots[n] : W + static_cast<int64_t>(n - keys.size());
          const double wgt = attn.load(off + slot * attn.se);
          vw.value(b, j, hk, &vr);
          da.store(doff + slot * da.se, dot(dorow, vr));
          double* dvj = dv.at(b, j, hk);
          for (int64_t e = 0; e < p.dim_v; ++e) dvj[e] += wgt * dorow[e];
        }
      }
  }
  dv.write(p, a.dv, a.d_add_v);
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
