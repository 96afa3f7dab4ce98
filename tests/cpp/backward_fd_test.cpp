// The reference backward against central finite differences of the scalar loss sum(O * W) (W is
// the random d_output), on small float32 problems over every parameter, every input (Q, K, V and
// the additional keys / values) and every element.
#include <gtest/gtest.h>

#include <cmath>
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

double loss(ProblemTensors& t, const std::vector<double>& w) {
  const fna::Status st =
      fna::forward(t.c.p, t.forward_args(), options_for(t.c, fna::Backend::reference));
  EXPECT_TRUE(st.ok()) << st.message;
  const std::vector<double> o = t.o.to_double();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}

// Checks d loss / d x for every element of `x` against `grad` (same logical shape).
void check_tensor(const std::string& name, ProblemTensors& t, HostTensor& x, const HostTensor& grad,
                  const std::vector<double>& w) {
  const std::vector<double> g = grad.to_double();
  double gmax = 0;
  for (double v : g) gmax = std::max(gmax, std::fabs(v));
  // h: large enough that float32 rounding of O (~1e-7 relative) stays far below the signal,
  // small enough that the O(h^2) truncation error does too.
  const double h = 1.0 / 64;
  double worst = 0;
  int64_t worst_at = -1;
  for (int64_t e = 0; e < x.numel(); ++e) {
    const double x0 = x.get(e);
    x.set(e, x0 + h);
    const double xp = x.get(e);
    const double lp = loss(t, w);
    x.set(e, x0 - h);
    const double xm = x.get(e);
    const double lm = loss(t, w);
    x.set(e, x0);
    const double fd = (lp - lm) / (xp - xm);
    const double err = std::fabs(fd - g[static_cast<size_t>(e)]);
    ASSERT_FALSE(std::isnan(g[static_cast<size_t>(e)])) << name << "[" << e << "] is NaN";
    if (err > worst) {
      worst = err;
      worst_at = e;
    }
  }
  const double bound = 2e-3 * gmax + 1e-6;
  EXPECT_LE(worst, bound) << name << ": worst |fd - grad| at " << worst_at << " (max|grad|=" << gmax
                          << ")";
  EXPECT_GT(gmax, 0) << name << ": all-zero gradient cannot be checked";
}

class BackwardFiniteDifferences : public ::testing::TestWithParam<int> {};

TEST_P(BackwardFiniteDifferences, ReferenceGradients) {
  RandomLimits lim;
  lim.dtypes = {fna::DType::f32};
  lim.max_axis[0] = 9;
  lim.max_axis[1] = 4;
  lim.max_axis[2] = 3;
  lim.max_dim = 4;
  lim.max_batch = 1;
  for (int i = 0; i < 6 * intensity(); ++i) {
    Case c = random_case(20000 + i, GetParam(), 1, lim);
    c.with_lse = true;
    // A window of one key gives P = 1 and zero gradients for Q and K: make it at least two.
    if (c.p.window() == 1 && c.p.num_additional == 0) c.p.num_additional = 1;
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.str());
    ProblemTensors t(c);
    const std::vector<double> w = t.d_o.to_double();
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), options_for(c, fna::Backend::reference)).ok());
    const fna::Status st =
        fna::backward(c.p, t.backward_args(), options_for(c, fna::Backend::reference));
    ASSERT_TRUE(st.ok()) << st.message;
    check_tensor("d_query", t, t.q, t.dq, w);
    check_tensor("d_key", t, t.k, t.dk, w);
    check_tensor("d_value", t, t.v, t.dv, w);
    if (c.p.num_additional > 0) {
      check_tensor("d_additional_keys", t, t.add_k, t.d_add_k, w);
      check_tensor("d_additional_values", t, t.add_v, t.d_add_v, w);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, BackwardFiniteDifferences, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace fna_test
