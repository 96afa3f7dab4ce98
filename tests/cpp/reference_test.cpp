// The reference against the test support's own plain computation (tests/cpp/support/check.cpp,
// which enumerates neighbors from its own SPEC evaluation), both in float32 precision: the two
// share no code, so agreement checks the oracle itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

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

// The naive result (float32 rounding of every intermediate) is within a few float32 ulps of the
// float64 reference: 1e-5 relative holds comfortably for these sizes.
Check vs_naive(const std::string& name, const std::vector<double>& got,
               const std::vector<double>& naive) {
  return compare(name, got, naive, {}, fna::DType::f32);
}

class ReferenceVsNaive : public ::testing::TestWithParam<int> {};

TEST_P(ReferenceVsNaive, ForwardBackward) {
  const int rank = GetParam();
  for (int i = 0; i < 25 * intensity(); ++i) {
    const Case c = random_case(1000 + i, rank, 1, f32_only());
    ProblemTensors t(c);
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), options_for(c, fna::Backend::reference)).ok());
    const NaiveForward nf = naive_forward(t);
    Check chk = vs_naive("output", t.o.to_double(), nf.o);
    if (c.with_lse) chk.merge(vs_naive("lse", t.lse.to_double(), nf.lse));
    // Backward needs the LSE even when the case does not ask for it.
    ProblemTensors tb(c);
    tb.c.with_lse = true;
    ASSERT_TRUE(fna::forward(c.p, tb.forward_args(), options_for(c, fna::Backend::reference)).ok());
    const fna::Status st =
        fna::backward(c.p, tb.backward_args(), options_for(c, fna::Backend::reference));
    ASSERT_TRUE(st.ok()) << st.message;
    const NaiveBackward nb = naive_backward(tb);
    chk.merge(vs_naive("d_query", tb.dq.to_double(), nb.dq));
    chk.merge(vs_naive("d_key", tb.dk.to_double(), nb.dk));
    chk.merge(vs_naive("d_value", tb.dv.to_double(), nb.dv));
    if (c.p.num_additional > 0) {
      chk.merge(vs_naive("d_additional_keys", tb.d_add_k.to_double(), nb.d_add_k));
      chk.merge(vs_naive("d_additional_values", tb.d_add_v.to_double(), nb.d_add_v));
    }
    EXPECT_TRUE(chk.ok) << "case " << i << ": " << c.str() << "\n" << chk.str();
  }
}

TEST_P(ReferenceVsNaive, Unfused) {
  const int rank = GetParam();
  for (int i = 0; i < 25 * intensity(); ++i) {
    const Case c = random_case(2000 + i, rank, 1, f32_only());
    ProblemTensors t(c);
    const fna::Options opt = options_for(c, fna::Backend::reference);
    t.attn.fill(std::nan(""));
    ASSERT_TRUE(fna::qk_forward(c.p, t.qk_args(), opt).ok());
    Check chk = vs_naive("attn", t.attn.to_double(), naive_qk(t));
    ProblemTensors u(c);  // fresh random attn weights for av
    ASSERT_TRUE(fna::av_forward(c.p, u.av_args(), opt).ok());
    chk.merge(vs_naive("av output", u.o.to_double(), naive_av(u)));
    ASSERT_TRUE(fna::qk_backward(c.p, u.qk_backward_args(), opt).ok());
    const NaiveBackward nq = naive_qk_backward(u);
    chk.merge(vs_naive("qk d_query", u.dq.to_double(), nq.dq));
    chk.merge(vs_naive("qk d_key", u.dk.to_double(), nq.dk));
    if (c.p.num_additional > 0)
      chk.merge(vs_naive("qk d_additional_keys", u.d_add_k.to_double(), nq.d_add_k));
    u.d_attn.fill(std::nan(""));
    ASSERT_TRUE(fna::av_backward(c.p, u.av_backward_args(), opt).ok());
    const NaiveAVBackward na = naive_av_backward(u);
    chk.merge(vs_naive("av d_attn", u.d_attn.to_double(), na.d_attn));  // 0 on non-neighbors
    chk.merge(vs_naive("av d_value", u.dv.to_double(), na.dv));
    if (c.p.num_additional > 0)
      chk.merge(vs_naive("av d_additional_values", u.d_add_v.to_double(), na.d_add_v));
    EXPECT_TRUE(chk.ok) << "case " << i << ": " << c.str() << "\n" << chk.str();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReferenceVsNaive, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace fna_test
