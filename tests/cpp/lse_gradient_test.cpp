// BackwardArgs::d_lse, the gradient flowing into the forward's LSE: the reference against the test
// support's own plain computation (dS = P (dP - (rowsum(dO * O) - d_lse)), tests/cpp/support),
// the cpu backend against the reference on random problems of every dtype and layout, that the
// term matters (a backend ignoring it fails), that a zero d_lse is the same as none, and its
// validation at the API boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/check.h"

namespace fna_test {
namespace {

int intensity() {
  const char* s = std::getenv("FNA_TEST_INTENSITY");
  return s ? std::max(1, std::atoi(s)) : 1;
}

RandomLimits f32_only() {
  RandomLimits lim;
  lim.dtypes = {fna::DType::f32};
  return lim;
}

// Forward (with LSE) on `backend`, then d_lse made, then the backward on `backend`.
void forward_then_backward(ProblemTensors* t, fna::Backend backend, bool with_d_lse) {
  t->c.with_lse = true;
  const fna::Options o = options_for(t->c, backend);
  fna::Status st = fna::forward(t->c.p, t->forward_args(), o);
  ASSERT_TRUE(st.ok()) << st.message;
  if (with_d_lse) t->make_d_lse(2.0);
  st = fna::backward(t->c.p, t->backward_args(), o);
  ASSERT_TRUE(st.ok()) << st.message;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

class LseGradient : public ::testing::TestWithParam<int> {
 protected:
  int rank() const { return GetParam(); }
};

// The reference with d_lse against the plain float32 computation of the support code (which
// enumerates neighbors from its own SPEC evaluation): float32-class agreement.
TEST_P(LseGradient, ReferenceMatchesNaive) {
  for (int i = 0; i < 20 * intensity(); ++i) {
    const Case c = random_case(7100 + i, rank(), 1, f32_only());
    ProblemTensors t(c);
    forward_then_backward(&t, fna::Backend::reference, true);
    const NaiveBackward nb = naive_backward(t);
    Check chk = compare("d_query", t.dq.to_double(), nb.dq, {}, fna::DType::f32);
    chk.merge(compare("d_key", t.dk.to_double(), nb.dk, {}, fna::DType::f32));
    chk.merge(compare("d_value", t.dv.to_double(), nb.dv, {}, fna::DType::f32));
    if (c.p.num_additional > 0) {
      chk.merge(compare("d_additional_keys", t.d_add_k.to_double(), nb.d_add_k, {}, fna::DType::f32));
      chk.merge(compare("d_additional_values", t.d_add_v.to_double(), nb.d_add_v, {},
                        fna::DType::f32));
    }
    EXPECT_TRUE(chk.ok) << "case " << i << ": " << c.str() << "\n" << chk.str();
  }
}

// The cpu backend with d_lse against the reference (run on float32 copies of the same inputs,
// each backend from its own forward), every dtype and layout, with the docs/semantics.md
// criterion (the low-precision bound from the plain computation with d_lse).
TEST_P(LseGradient, CpuMatchesReference) {
  for (int i = 0; i < 30 * intensity(); ++i) {
    const Case c = random_case(7300 + i, rank());
    ProblemTensors got(c);
    got.c.with_lse = true;
    ProblemTensors ref = got.as_f32();  // (its problem's dtype is float32)
    forward_then_backward(&got, fna::Backend::cpu, true);
    forward_then_backward(&ref, fna::Backend::reference, true);
    ASSERT_EQ(got.d_lse.to_double(), ref.d_lse.to_double());  // the same d_lse for both
    const Check chk = check_backward(got, ref);
    EXPECT_TRUE(chk.ok) << "case " << i << ": " << c.str() << "\n" << chk.str();
  }
}

// The term is not negligible on these problems: dQ and dK with d_lse differ from those without by
// far more than the tolerance above, so a backend that ignored d_lse would fail CpuMatchesReference;
// dV does not depend on d_lse (P does not change).
TEST_P(LseGradient, TermMatters) {
  for (int i = 0; i < 10; ++i) {
    const Case c = random_case(7500 + i, rank(), 1, f32_only());
    for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
      ProblemTensors with(c), without(c);
      forward_then_backward(&with, b, true);
      forward_then_backward(&without, b, false);
      const std::vector<double> dq1 = with.dq.to_double(), dq0 = without.dq.to_double();
      const std::vector<double> dk1 = with.dk.to_double(), dk0 = without.dk.to_double();
      // Every query sees itself, so a window of one key (or all-equal scores) can make dQ's
      // change vanish only for degenerate problems; require a clear change over the call.
      const double mag = std::max({1.0, max_abs(dq1), max_abs(dk1)});
      EXPECT_GT(std::max(max_abs_diff(dq1, dq0), max_abs_diff(dk1, dk0)), 1e-3 * mag)
          << fna::backend_name(b) << " case " << i << ": " << c.str();
      const Check dv = compare("d_value", with.dv.to_double(), without.dv.to_double(), {},
                               fna::DType::f32);  // (cpu: threads may sum in another order)
      EXPECT_TRUE(dv.ok) << fna::backend_name(b) << " case " << i << ": " << c.str() << "\n"
                         << dv.str();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LseGradient, ::testing::Values(1, 2, 3));

// A d_lse of zeros gives bitwise the gradients of no d_lse (reference; cpu in deterministic mode).
TEST(LseGradientZero, SameAsAbsent) {
  for (int i = 0; i < 6; ++i) {
    const Case c = random_case(7700 + i, 1 + i % 3);
    for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
      ProblemTensors zero(c), none(c);
      zero.c.with_lse = none.c.with_lse = true;
      fna::Options o = options_for(c, b, 2);
      o.deterministic = true;
      ASSERT_TRUE(fna::forward(c.p, zero.forward_args(), o).ok());
      ASSERT_TRUE(fna::forward(c.p, none.forward_args(), o).ok());
      zero.make_d_lse();
      zero.d_lse.fill(0.0);
      ASSERT_TRUE(fna::backward(c.p, zero.backward_args(), o).ok());
      ASSERT_TRUE(fna::backward(c.p, none.backward_args(), o).ok());
      EXPECT_EQ(zero.dq.to_double(), none.dq.to_double()) << fna::backend_name(b) << " " << c.str();
      EXPECT_EQ(zero.dk.to_double(), none.dk.to_double()) << fna::backend_name(b) << " " << c.str();
      EXPECT_EQ(zero.dv.to_double(), none.dv.to_double()) << fna::backend_name(b) << " " << c.str();
    }
  }
}

// Only d_lse present, dO = 0: the gradient of sum_i g_i LSE_i, in closed form. d LSE_i / d q_i =
// scale * sum_j P_ij k_j and d LSE_i / d k_j = scale * P_ij q_i; dV = 0. Computed here in double
// from the inputs (a 1-D problem, one head, every window full: no SPEC needed beyond K = L).
TEST(LseGradientClosedForm, DenseWindow) {
  Case c;
  c.p.rank = 1;
  c.p.shape[0] = 7;
  c.p.kernel_size[0] = 7;
  c.p.dim = 5;
  c.p.dim_v = 3;
  c.seed = 77;
  const double scale = c.resolved_scale();
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    ProblemTensors t(c);
    t.d_o.fill(0.0);
    forward_then_backward(&t, b, true);
    const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), g = t.d_lse.to_double();
    const int64_t N = 7, D = 5;
    std::vector<double> dq(N * D, 0.0), dk(N * D, 0.0);
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> s(N);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < N; ++j) {
        s[j] = 0;
        for (int64_t e = 0; e < D; ++e) s[j] += scale * q[i * D + e] * k[j * D + e];
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j < N; ++j) sum += std::exp(s[j] - m);
      for (int64_t j = 0; j < N; ++j) {
        const double pij = std::exp(s[j] - m) / sum;
        for (int64_t e = 0; e < D; ++e) {
          dq[i * D + e] += g[i] * scale * pij * k[j * D + e];
          dk[j * D + e] += g[i] * scale * pij * q[i * D + e];
        }
      }
    }
    Check chk = compare("d_query", t.dq.to_double(), dq, {}, fna::DType::f32);
    chk.merge(compare("d_key", t.dk.to_double(), dk, {}, fna::DType::f32));
    chk.merge(compare("d_value", t.dv.to_double(), std::vector<double>(N * 3, 0.0), {},
                      fna::DType::f32));
    EXPECT_TRUE(chk.ok) << fna::backend_name(b) << "\n" << chk.str();
  }
}

// Validation: d_lse is checked like every tensor of the call, its messages naming it.
TEST(LseGradientValidation, NamesTheArgument) {
  Case c;
  c.p.rank = 2;
  c.p.shape[0] = c.p.shape[1] = 5;
  c.p.kernel_size[0] = c.p.kernel_size[1] = 3;
  c.p.dim = c.p.dim_v = 4;
  c.seed = 5;
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    ProblemTensors t(c);
    forward_then_backward(&t, b, true);
    const fna::Options o = options_for(c, b);
    // Misaligned pointer.
    fna::BackwardArgs a = t.backward_args();
    a.d_lse.data = static_cast<char*>(a.d_lse.data) + 1;
    fna::Status st = fna::backward(c.p, a, o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("d_lse pointer"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("element size 4"), std::string::npos) << st.message;
    // A stride that reaches beyond any memory.
    a = t.backward_args();
    a.d_lse.strides[1] = int64_t(1) << 62;
    st = fna::backward(c.p, a, o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("d_lse extent 5 * stride[1]=4611686018427387904"), std::string::npos)
        << st.message;
  }
}

}  // namespace
}  // namespace fna_test
