// Relative positional bias (ForwardArgs::rpb / BackwardArgs::d_rpb) on the CPU backends.
//
// The reference adds rpb[h, (k_a - q_a) / d_a + K_a - 1 ..] from its own reading of the
// definition; it is checked here against two facts that do not depend on its code:
//   - the gradient: d_rpb equals central finite differences of the loss sum(dO * O) of the
//     reference forward, entry by entry;
//   - shift invariance: a bias that is one constant per head leaves O unchanged without
//     additional keys (softmax is invariant to a shift of all of a row's logits) and moves each
//     LSE by the constant.
//   - one large entry: the queries that see the key at that relative offset return its value
//     (the test's own brute-force neighborhood decides which key that is).
// (The Python tests check the same calls against the unfused composition qk + gathered bias +
// softmax + av, whose index arithmetic is fna/_rpb.py's.)
// The cpu backend is checked against the reference: O, LSE, dQ, dK, dV, the additional keys'
// gradients and d_rpb, with each kernel set, threads 1-3, both panel stores, line and strip order,
// deterministic mode, query regions, ranks 1-3 with dilation, stride, causal axes, even kernels,
// GQA and dim_v != dim. Inputs are random (never zero), each case seeded; the table has strides of its
// own (heads last in memory) in half of the cases.
// Then the validation at the API boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/check.h"
#include "support/kernel_sets.h"

namespace fna_test {
namespace {

std::vector<int64_t> table_extents(const fna::Problem& p) {
  std::vector<int64_t> e = {p.heads};
  for (int a = 0; a < p.rank; ++a) e.push_back(2 * p.kernel_size[a] - 1);
  return e;
}

// A float32 table of the problem's extents; `heads_last` puts H innermost in memory.
HostTensor make_table(const fna::Problem& p, bool heads_last) {
  std::vector<int> order;
  if (heads_last) {
    for (int d = 1; d <= p.rank; ++d) order.push_back(d);
    order.push_back(0);
  }
  return HostTensor(fna::DType::f32, table_extents(p), order);
}

struct RpbCase {
  Case c;
  bool heads_last = false;  // the table's layout
  bool region = false;      // a query region (Problem::query_offset / query_shape)
  std::string str() const {
    std::string s = c.str();
    if (region) {
      s += " query_offset=(";
      for (int a = 0; a < c.p.rank; ++a)
        s += (a ? "," : "") + std::to_string(c.p.query_offset[a]);
      s += ") query_shape=(";
      for (int a = 0; a < c.p.rank; ++a)
        s += (a ? "," : "") + std::to_string(c.p.query_shape[a]);
      s += ")";
    }
    return s + (heads_last ? " rpb heads-last" : "");
  }
};

// Case `i` of rank r: random problems (random_case) with an even kernel on some axis in a third
// of them, a query region in a third, float32 and bfloat16.
RpbCase rpb_case(uint64_t i, int rank) {
  RandomLimits lim;
  lim.dtypes = {fna::DType::f32, fna::DType::bf16};
  RpbCase rc;
  rc.c = random_case(0x7b0000 + i, rank, 1, lim);
  rc.c.with_lse = true;
  fna::Problem& p = rc.c.p;
  Rng rng(0x7b1000 + i * 31 + static_cast<uint64_t>(rank));
  if (i % 3 == 1) {  // an even kernel where it fits (any stride / dilation / causal the case has)
    const int a = static_cast<int>(rng.range(0, rank - 1));
    if (p.kernel_size[a] % 2 == 1 && (p.kernel_size[a] + 1) * p.dilation[a] <= p.shape[a])
      p.kernel_size[a] += 1;
  }
  if (i % 3 == 2) {  // a region: each axis offset in [0, L / 2], extent to the end or shorter
    rc.region = true;
    for (int a = 0; a < rank; ++a) {
      p.query_offset[a] = rng.range(0, p.shape[a] / 2);
      const int64_t rest = p.shape[a] - p.query_offset[a];
      p.query_shape[a] = rng.chance(0.5) ? 0 : rng.range(1, rest);
    }
  }
  rc.heads_last = i % 2 == 1;
  return rc;
}

// A call's tensors: K, V, their gradients and the additional keys from `g` (the grid's case),
// Q, O, LSE, dO, dQ and d_lse from `qs` (the same case shaped to the query region; with no
// region, the grid's).
struct Call {
  ProblemTensors g, qs;
  HostTensor rpb, d_rpb;
  const fna::Problem& p() const { return g.c.p; }
  Call as_f32() const { return {g.as_f32(), qs.as_f32(), rpb, d_rpb}; }
};

Case query_side(const Case& c) {
  Case q = c;
  for (int a = 0; a < c.p.rank; ++a) {
    q.p.shape[a] = c.p.query_extent(a);
    q.p.query_offset[a] = q.p.query_shape[a] = 0;
  }
  return q;
}

// The case's tensors, the table filled with values of amplitude 2 (logit-sized), d_lse in a
// third of the cases.
Call make_run(const RpbCase& rc, uint64_t seed) {
  Call r{ProblemTensors(rc.c), ProblemTensors(query_side(rc.c)), make_table(rc.c.p, rc.heads_last),
        make_table(rc.c.p, !rc.heads_last)};
  r.g.c.p = rc.c.p;  // (the problem with its region)
  r.rpb.fill_random(seed, 2.0);
  r.d_rpb.fill(std::nan(""));
  if (seed % 3 == 0) r.qs.make_d_lse();
  return r;
}

fna::ForwardArgs forward_args(Call& r, bool bias = true) {
  fna::ForwardArgs a = r.qs.forward_args();
  const fna::ForwardArgs k = r.g.forward_args();
  a.k = k.k;
  a.v = k.v;
  a.add_k = k.add_k;
  a.add_v = k.add_v;
  if (bias) a.rpb = r.rpb.ref();
  return a;
}

fna::Status forward(Call& r, const fna::Options& opt) {
  return fna::forward(r.p(), forward_args(r), opt);
}

fna::BackwardArgs backward_args(Call& r) {
  fna::BackwardArgs a = r.qs.backward_args();
  const fna::ForwardArgs k = r.g.forward_args();
  a.k = k.k;
  a.v = k.v;
  a.add_k = k.add_k;
  a.add_v = k.add_v;
  a.dk = r.g.dk.ref();
  a.dv = r.g.dv.ref();
  if (!r.g.d_add_k.empty()) {
    a.d_add_k = r.g.d_add_k.ref();
    a.d_add_v = r.g.d_add_v.ref();
  }
  return a;
}

fna::Status backward(Call& r, const fna::Options& opt) {
  fna::BackwardArgs a = backward_args(r);
  a.rpb = r.rpb.ref();
  a.d_rpb = r.d_rpb.ref();
  return fna::backward(r.p(), a, opt);
}

// The cpu backend's options for case i with kernel set isa.
fna::Options cpu_options(const Case& c, int i, const std::string& isa) {
  fna::Options o = options_for(c, fna::Backend::cpu, 1 + i % 3);
  EXPECT_TRUE(fna::set_tuning(&o.tuning, "cpu_isa", isa).ok());
  o.tuning.cpu_panels = i % 2 ? fna::CpuPanels::shared : fna::CpuPanels::rings;
  if (i % 4 == 3) o.tuning.cpu_band = 1;
  if (c.p.rank == 2 && i % 3 == 1) o.tuning.cpu_strips = fna::Switch::on;  // strip order
  o.deterministic = i % 5 == 4;
  return o;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// max|got - ref| <= rel * max(max|ref|, floor); NaN fails.
Check near(const std::string& name, const std::vector<double>& got, const std::vector<double>& ref,
           double rel, double floor = 0) {
  Tolerance tol;
  tol.f32_rel = rel;
  tol.magnitude_floor = floor;
  return compare(name, got, ref, {}, fna::DType::f32, tol);
}

class Rpb : public ::testing::TestWithParam<int> {
 protected:
  int rank() const { return GetParam(); }
};

// ---- the reference against facts that do not depend on it ------------------------------------

// sum(dO * O) of the reference forward with the table `rpb` (float64 over the float32 output).
double loss(Call& r, const fna::Options& opt) {
  r.qs.o.fill(std::nan(""));
  EXPECT_TRUE(forward(r, opt).ok());
  const std::vector<double> o = r.qs.o.to_double(), d_o = r.qs.d_o.to_double();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * d_o[i];
  return s;
}

TEST_P(Rpb, ReferenceGradientIsFiniteDifferences) {
  for (uint64_t i = 0; i < 4; ++i) {
    RpbCase rc = rpb_case(100 + i, rank());
    rc.c.p.dtype = fna::DType::f32;  // differences of float32 outputs; no d_lse (not in the loss)
    SCOPED_TRACE("case " + std::to_string(i) + ": " + rc.str());
    Call r = make_run(rc, 1 + 3 * i);
    r.qs.d_lse = HostTensor();
    const fna::Options opt = options_for(rc.c, fna::Backend::reference);
    ASSERT_TRUE(forward(r, opt).ok());
    const fna::Status st = backward(r, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    const std::vector<double> grad = r.d_rpb.to_double();
    const double mag = std::max(max_abs(grad), 1e-3);
    // A sample of entries (every one in small tables), each by central differences.
    const int64_t n = r.rpb.numel(), step = std::max<int64_t>(1, n / 40);
    int checked = 0;
    for (int64_t e = (static_cast<int64_t>(i) * 7) % step; e < n; e += step) {
      const double x = r.rpb.get(e), eps = 1e-2;
      r.rpb.set(e, x + eps);
      const double up = loss(r, opt);
      r.rpb.set(e, x - eps);
      const double down = loss(r, opt);
      r.rpb.set(e, x);
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[static_cast<size_t>(e)], fd, 2e-3 * mag) << "entry " << e;
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
}

TEST_P(Rpb, ReferenceConstantBiasShiftsOnlyTheLse) {
  for (uint64_t i = 0; i < 3; ++i) {
    RpbCase rc = rpb_case(200 + i, rank());
    rc.c.p.num_additional = 0;  // additional keys get no bias: no longer a shift of every logit
    rc.c.p.dtype = fna::DType::f32;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + rc.str());
    Call r = make_run(rc, 7 + i);
    const fna::Problem& p = rc.c.p;
    const int64_t per_head = r.rpb.numel() / p.heads;
    std::vector<double> shift(static_cast<size_t>(p.heads));
    for (int64_t h = 0; h < p.heads; ++h) {
      shift[static_cast<size_t>(h)] = 0.5 + 0.37 * static_cast<double>(h);
      for (int64_t e = 0; e < per_head; ++e) r.rpb.set(h * per_head + e, shift[static_cast<size_t>(h)]);
    }
    const fna::Options opt = options_for(rc.c, fna::Backend::reference);
    ASSERT_TRUE(forward(r, opt).ok());
    const std::vector<double> o_bias = r.qs.o.to_double(), lse_bias = r.qs.lse.to_double();
    ASSERT_TRUE(fna::forward(p, forward_args(r, false), opt).ok());
    const std::vector<double> o = r.qs.o.to_double(), lse = r.qs.lse.to_double();
    Check c = near("output", o_bias, o, 1e-6);
    std::vector<double> lse_shifted = lse;  // [B, L.., H]: the head is the fastest index
    for (size_t j = 0; j < lse.size(); ++j) lse_shifted[j] += shift[j % static_cast<size_t>(p.heads)];
    c.merge(near("lse", lse_bias, lse_shifted, 1e-6));
    EXPECT_TRUE(c.ok) << c.str();
  }
}

// A table that is 0 but for one large entry per head (relative offset off_h): every query whose
// window holds the key at q + off_h * dilation attends to it alone, so its output is that key's
// value row. Which key an entry means is decided here by the test's own brute-force neighborhood
// (support/problem.h), not by the code under test. Reference and cpu alike.
TEST_P(Rpb, OneLargeEntryPicksThatKey) {
  for (uint64_t i = 0; i < 3; ++i) {
    RpbCase rc = rpb_case(500 + i, rank());
    fna::Problem& p = rc.c.p;
    p.dtype = fna::DType::f32;
    p.num_additional = 0;
    for (int a = 0; a < fna::kMaxRank; ++a) p.query_offset[a] = p.query_shape[a] = 0;
    rc.region = false;
    Rng rng(0x7b5000 + i);
    Call r = make_run(rc, 9 + i);
    const int64_t per_head = r.rpb.numel() / p.heads;
    std::vector<std::vector<int64_t>> off(static_cast<size_t>(p.heads));
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int64_t e = 0; e < per_head; ++e) r.rpb.set(h * per_head + e, 0.0);
      int64_t dense = 0;
      for (int a = 0; a < p.rank; ++a) {
        const int64_t o = rng.range(-(p.kernel_size[a] - 1), p.kernel_size[a] - 1);
        off[static_cast<size_t>(h)].push_back(o);
        dense = dense * (2 * p.kernel_size[a] - 1) + o + p.kernel_size[a] - 1;
      }
      r.rpb.set(h * per_head + dense, 60.0);
    }
    for (fna::Backend be : {fna::Backend::reference, fna::Backend::cpu}) {
      SCOPED_TRACE(std::string(fna::backend_name(be)) + " case " + std::to_string(i) + ": " + rc.str());
      ASSERT_TRUE(forward(r, options_for(rc.c, be)).ok());
      const std::vector<double> o = r.qs.o.to_double(), v = r.g.v.to_double();
      const int64_t N = p.tokens(), group = p.heads / p.heads_kv;
      int64_t checked = 0;
      double worst = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t qt = 0; qt < N; ++qt)
          for (int64_t h = 0; h < p.heads; ++h) {
            int64_t rest = qt, kt = 0, coord[fna::kMaxRank] = {0, 0, 0};
            for (int a = p.rank - 1; a >= 0; --a) coord[a] = rest % p.shape[a], rest /= p.shape[a];
            bool inside = true;
            for (int a = 0; a < p.rank; ++a) {
              const int64_t k = coord[a] + off[static_cast<size_t>(h)][static_cast<size_t>(a)] * p.dilation[a];
              inside = inside && k >= 0 && k < p.shape[a];
              kt = kt * p.shape[a] + k;
            }
            if (!inside || !spec_is_neighbor(p, qt, kt)) continue;
            ++checked;
            for (int64_t e = 0; e < p.dim_v; ++e) {
              const double got = o[static_cast<size_t>(((b * N + qt) * p.heads + h) * p.dim_v + e)];
              const double want = v[static_cast<size_t>(((b * N + kt) * p.heads_kv + h / group) * p.dim_v + e)];
              worst = std::max(worst, std::fabs(got - want));
            }
          }
      EXPECT_GT(checked, 0);
      EXPECT_LT(worst, 1e-5) << checked << " queries checked";
    }
  }
}

// ---- cpu against the reference ------------------------------------------------------------------

TEST_P(Rpb, CpuMatchesReference) {
  const int cases = rank() == 1 ? 12 : 9;
  for (int i = 0; i < cases; ++i) {
    const RpbCase rc = rpb_case(static_cast<uint64_t>(i), rank());
    const uint64_t seed = 11 + static_cast<uint64_t>(i);
    Call ref = make_run(rc, seed);
    {  // the reference on the float32 copies of the inputs
      ref = ref.as_f32();
      const fna::Options opt = options_for(rc.c, fna::Backend::reference);
      ASSERT_TRUE(forward(ref, opt).ok());
      const fna::Status st = backward(ref, opt);
      ASSERT_TRUE(st.ok()) << st.message;
    }
    for (const std::string& isa : kernel_sets()) {
      SCOPED_TRACE("case " + std::to_string(i) + " " + isa + ": " + rc.str());
      Call got = make_run(rc, seed);
      const fna::Options opt = cpu_options(rc.c, i, isa);
      fna::Status st = forward(got, opt);
      ASSERT_TRUE(st.ok()) << st.message;
      st = backward(got, opt);
      ASSERT_TRUE(st.ok()) << st.message;
      // float32: the docs/semantics.md section 4 bound; bfloat16 outputs: their rounding (the
      // kernels compute in float32 either way).
      const bool bf16 = rc.c.p.dtype == fna::DType::bf16;
      const double rel = bf16 ? 2 * unit_roundoff(fna::DType::bf16) : 1e-5;
      const std::vector<double> gq = ref.qs.dq.to_double(), gk = ref.g.dk.to_double(),
                                gv = ref.g.dv.to_double();
      const double mag = std::max({max_abs(gq), max_abs(gk), max_abs(gv)});
      Check c = near("output", got.qs.o.to_double(), ref.qs.o.to_double(), rel);
      c.merge(near("lse", got.qs.lse.to_double(), ref.qs.lse.to_double(), 1e-5));
      c.merge(near("d_query", got.qs.dq.to_double(), gq, rel, mag));
      c.merge(near("d_key", got.g.dk.to_double(), gk, rel, mag));
      c.merge(near("d_value", got.g.dv.to_double(), gv, rel, mag));
      if (rc.c.p.num_additional > 0) {
        c.merge(near("d_additional_keys", got.g.d_add_k.to_double(), ref.g.d_add_k.to_double(), rel, mag));
        c.merge(near("d_additional_values", got.g.d_add_v.to_double(), ref.g.d_add_v.to_double(), rel,
                     mag));
      }
      // d_rpb sums the float32 dS of every pair with the entry's offset (in float64). With
      // bfloat16 the backward's rowsum(dO * O) reads the bfloat16-rounded O (the reference
      // recomputes it exactly), so its dS carry that rounding, as dQ / dK do.
      // Judged on the call's gradient scale like the others (a one-key window has dS = 0
      // exactly, which float32 products meet only to rounding).
      c.merge(near("d_rpb", got.d_rpb.to_double(), ref.d_rpb.to_double(), bf16 ? rel : 1e-5, mag));
      EXPECT_TRUE(c.ok) << c.str();
    }
  }
}

// Wide windows (a query group's span of vector lanes reaches furthest past a query's own entries
// into the padded table): a 1-D kernel of 31 and a 2-D 13 x 9 window, against the reference.
TEST(RpbWide, CpuMatchesReference) {
  for (int which = 0; which < 2; ++which) {
    RpbCase rc;
    rc.c = random_case(0x7b9000 + which, which + 1);
    fna::Problem& p = rc.c.p;
    p.dtype = fna::DType::f32;
    p.batch = 1;
    p.heads = 2;
    p.heads_kv = 1;
    p.dim = p.dim_v = 16;
    p.num_additional = 0;
    for (int a = 0; a < fna::kMaxRank; ++a) p.query_offset[a] = p.query_shape[a] = 0;
    if (which == 0) {
      p.shape[0] = 150, p.kernel_size[0] = 31, p.dilation[0] = 2, p.stride[0] = 1;
      p.is_causal[0] = false;
    } else {
      p.shape[0] = 20, p.shape[1] = 22, p.kernel_size[0] = 13, p.kernel_size[1] = 9;
      p.dilation[0] = 1, p.dilation[1] = 2, p.stride[0] = p.stride[1] = 1;
      p.is_causal[0] = false, p.is_causal[1] = true;
    }
    rc.c.with_lse = true;
    Call ref = make_run(rc, 21 + which);
    const fna::Options ropt = options_for(rc.c, fna::Backend::reference);
    ASSERT_TRUE(forward(ref, ropt).ok());
    ASSERT_TRUE(backward(ref, ropt).ok());
    for (const std::string& isa : kernel_sets()) {
      SCOPED_TRACE(isa + ": " + rc.str());
      Call got = make_run(rc, 21 + which);
      const fna::Options opt = cpu_options(rc.c, which, isa);
      ASSERT_TRUE(forward(got, opt).ok());
      ASSERT_TRUE(backward(got, opt).ok());
      const std::vector<double> gq = ref.qs.dq.to_double(), gk = ref.g.dk.to_double();
      const double mag = std::max(max_abs(gq), max_abs(gk));
      Check c = near("output", got.qs.o.to_double(), ref.qs.o.to_double(), 1e-5);
      c.merge(near("lse", got.qs.lse.to_double(), ref.qs.lse.to_double(), 1e-5));
      c.merge(near("d_query", got.qs.dq.to_double(), gq, 1e-5, mag));
      c.merge(near("d_key", got.g.dk.to_double(), gk, 1e-5, mag));
      c.merge(near("d_value", got.g.dv.to_double(), ref.g.dv.to_double(), 1e-5, mag));
      c.merge(near("d_rpb", got.d_rpb.to_double(), ref.d_rpb.to_double(), 1e-5, mag));
      EXPECT_TRUE(c.ok) << c.str();
    }
  }
}

// Deterministic mode: d_rpb (and everything else) bitwise the same run to run.
TEST_P(Rpb, CpuDeterministicRepeats) {
  const RpbCase rc = rpb_case(300, rank());
  Call a = make_run(rc, 5), b = make_run(rc, 5);
  fna::Options opt = options_for(rc.c, fna::Backend::cpu, 3);
  opt.deterministic = true;
  for (Call* r : {&a, &b}) {
    ASSERT_TRUE(forward(*r, opt).ok());
    ASSERT_TRUE(backward(*r, opt).ok());
  }
  EXPECT_EQ(a.d_rpb.to_double(), b.d_rpb.to_double());
  EXPECT_EQ(a.g.dk.to_double(), b.g.dk.to_double());
}

INSTANTIATE_TEST_SUITE_P(Ranks, Rpb, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "rank" + std::to_string(info.param);
                         });

// ---- qk_forward with a bias (QKArgs::rpb) ----------------------------------------------------------

// The reference and cpu backends' qk_forward with the table: attn equals the same call without it
// plus each neighbor slot's entry, the slot's key found by the test's own brute force
// (spec_slots) and the entry from the two tokens' coordinates; empty slots stay -inf and the
// additional keys' slots get nothing.
TEST_P(Rpb, QkForwardAddsEachSlotsEntry) {
  int64_t checked = 0;
  for (uint64_t i = 0; i < 6; ++i) {
    RpbCase rc = rpb_case(500 + i, rank());
    rc.region = false;  // the unfused operators take no query region
    for (int a = 0; a < fna::kMaxRank; ++a) rc.c.p.query_offset[a] = rc.c.p.query_shape[a] = 0;
    Call r = make_run(rc, 11 + i);
    const fna::Problem& p = r.p();
    SCOPED_TRACE(rc.str());
    const std::vector<double> table = r.rpb.to_double();
    const int64_t W = p.window(), C = W + p.num_additional, N = p.tokens();
    for (fna::Backend be : {fna::Backend::reference, fna::Backend::cpu}) {
      const fna::Options opt = options_for(rc.c, be);
      fna::QKArgs a = r.g.qk_args();
      r.g.attn.fill(std::nan(""));
      ASSERT_TRUE(fna::qk_forward(p, a, opt).ok());
      const std::vector<double> plain = r.g.attn.to_double();
      a.rpb = r.rpb.ref();
      r.g.attn.fill(std::nan(""));
      const fna::Status st = fna::qk_forward(p, a, opt);
      ASSERT_TRUE(st.ok()) << st.message;
      const std::vector<double> got = r.g.attn.to_double();
      const double rel = p.dtype == fna::DType::f32 ? 1e-5 : 2e-2;
      for (int64_t t = 0; t < N; ++t) {
        const std::vector<int64_t> keys = spec_slots(p, t);
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t h = 0; h < p.heads; ++h)
            for (int64_t s = 0; s < C; ++s) {
              const size_t at = static_cast<size_t>(((b * N + t) * p.heads + h) * C + s);
              if (s >= W) {
                ASSERT_EQ(got[at], plain[at]) << "additional key slot " << s;
                continue;
              }
              const int64_t kt = keys[static_cast<size_t>(s)];
              if (kt < 0) {
                ASSERT_TRUE(std::isinf(got[at]) && got[at] < 0) << "empty slot " << s;
                continue;
              }
              int64_t entry = h, qt = t, kk = kt, qc[fna::kMaxRank], kc[fna::kMaxRank];
              for (int x = p.rank - 1; x >= 0; --x) {
                qc[x] = qt % p.shape[x], qt /= p.shape[x];
                kc[x] = kk % p.shape[x], kk /= p.shape[x];
              }
              for (int x = 0; x < p.rank; ++x)
                entry = entry * (2 * p.kernel_size[x] - 1) + (kc[x] - qc[x]) / p.dilation[x] +
                        p.kernel_size[x] - 1;
              const double want = plain[at] + table[static_cast<size_t>(entry)];
              ASSERT_NEAR(got[at], want, rel * std::max(1.0, std::fabs(want)))
                  << fna::backend_name(be) << " token " << t << " head " << h << " slot " << s;
              ++checked;
            }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// ---- validation at the API boundary ---------------------------------------------------------------

TEST(RpbValidation, ErrorsNameTheArgument) {
  RpbCase rc = rpb_case(400, 2);
  rc.c.p.dtype = fna::DType::f32;
  rc.region = false;
  for (int a = 0; a < fna::kMaxRank; ++a) rc.c.p.query_offset[a] = rc.c.p.query_shape[a] = 0;
  Call r = make_run(rc, 3);
  const fna::Options opt = options_for(rc.c, fna::Backend::cpu);
  ASSERT_TRUE(forward(r, opt).ok());
  // the gradient's table missing, or given without a bias
  fna::BackwardArgs b = backward_args(r);
  b.rpb = r.rpb.ref();
  fna::Status st = fna::backward(rc.c.p, b, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_NE(st.message.find("d_rpb is a null pointer"), std::string::npos) << st.message;
  b.rpb = fna::TensorRef{};
  b.d_rpb = r.d_rpb.ref();
  st = fna::backward(rc.c.p, b, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_NE(st.message.find("d_rpb is given but rpb is a null pointer"), std::string::npos) << st.message;
  // an output table that aliases itself
  b.rpb = r.rpb.ref();
  b.d_rpb.strides[1] = 0;
  st = fna::backward(rc.c.p, b, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_NE(st.message.find("d_rpb stride[1]=0 must be >= 1"), std::string::npos) << st.message;
  // a misaligned table
  fna::ForwardArgs f = forward_args(r);
  f.rpb.data = static_cast<char*>(f.rpb.data) + 2;
  st = fna::forward(rc.c.p, f, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_NE(st.message.find("rpb pointer"), std::string::npos) << st.message;
  // an invalid rank or a hostile kernel size with a table: the problem's error, no access
  // beyond the problem's arrays while the table's extents are formed (before validation)
  for (int bad_rank : {0, 4, 8, -1}) {
    fna::Problem bad = rc.c.p;
    bad.rank = bad_rank;
    f = forward_args(r);
    st = fna::forward(bad, f, opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << bad_rank;
    EXPECT_NE(st.message.find("rank=" + std::to_string(bad_rank)), std::string::npos) << st.message;
  }
  {
    fna::Problem bad = rc.c.p;
    bad.kernel_size[0] = int64_t(1) << 62;
    st = fna::forward(bad, forward_args(r), opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("kernel_size[0]"), std::string::npos) << st.message;
  }
  // the unfused-only / CUDA backends do not take a bias (checked before any device is needed
  // where the backend is compiled; otherwise the build says it lacks the backend)
  f.rpb = r.rpb.ref();
  fna::Options cuda = opt;
  cuda.backend = fna::Backend::cuda_naive;
  st = fna::forward(rc.c.p, f, cuda);
  EXPECT_FALSE(st.ok());
  if (fna::backend_compiled(fna::Backend::cuda_naive) && st.code == fna::Code::unsupported)
    EXPECT_NE(st.message.find("rpb: backend=cuda-naive"), std::string::npos) << st.message;
  EXPECT_TRUE(fna::takes_rpb(fna::Backend::cuda_fused));
  EXPECT_FALSE(fna::takes_rpb(fna::Backend::cuda_naive));
  // qk_forward's table (QKArgs::rpb) is checked like the forward's
  {
    fna::QKArgs q = r.g.qk_args();
    q.rpb = r.rpb.ref();
    q.rpb.data = static_cast<char*>(q.rpb.data) + 2;
    st = fna::qk_forward(rc.c.p, q, opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("rpb pointer"), std::string::npos) << st.message;
  }
  // Problem::rpb announces a table: set without one it is an error, in forward and backward
  {
    fna::Problem flagged = rc.c.p;
    flagged.rpb = true;
    f = forward_args(r);
    f.rpb = fna::TensorRef{};
    st = fna::forward(flagged, f, opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("problem.rpb=true but rpb is a null pointer"), std::string::npos)
        << st.message;
    // with the table given, the flag agrees and the call runs as without it
    f = forward_args(r);
    EXPECT_TRUE(fna::forward(flagged, f, opt).ok());
  }
}

}  // namespace
}  // namespace fna_test
