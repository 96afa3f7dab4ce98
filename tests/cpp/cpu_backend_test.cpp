// The cpu backend against the reference on random problems over every parameter, with the
// docs/semantics.md section 4 criterion; each kernel set the CPU supports (generic, avx2, avx512) is run,
// and each with both panel stores (Tuning::cpu_panels: per-worker rings, shared panels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cpu/tile.h"
#include "support/check.h"
#include "support/kernel_sets.h"

namespace fna_test {
namespace {

int intensity() {
  const char* s = std::getenv("FNA_TEST_INTENSITY");
  return s ? std::max(1, std::atoi(s)) : 1;
}

// The cpu backend's options for case c with tuning t.
fna::Options cpu_options(const Case& c, int threads, const fna::Tuning& t) {
  fna::Options o = options_for(c, fna::Backend::cpu, threads);
  o.tuning = t;
  return o;
}

class CpuVsReference
    : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {
 protected:
  int rank() const { return std::get<0>(GetParam()); }
  // The parameters' kernel set and panel store.
  fna::Tuning tuning() const {
    fna::Tuning t;
    EXPECT_TRUE(fna::set_tuning(&t, "cpu_isa", std::get<1>(GetParam())).ok());
    EXPECT_TRUE(fna::set_tuning(&t, "cpu_panels", std::get<2>(GetParam())).ok());
    return t;
  }
  fna::Options cpu(const Case& c, int threads) const { return cpu_options(c, threads, tuning()); }
};

// Runs forward (and backward) on the cpu backend with tuning tun and on the reference (on
// float32 copies of the same inputs) and checks with the SPEC criterion.
void run_fused(const Case& c, int threads, const fna::Tuning& tun) {
  ProblemTensors got(c);
  got.c.with_lse = true;  // backward needs it; c.with_lse still decides whether LSE is compared
  ProblemTensors ref = got.as_f32();
  fna::Status st = fna::forward(c.p, got.forward_args(), cpu_options(c, threads, tun));
  ASSERT_TRUE(st.ok()) << st.message;
  fna::Problem p32 = c.p;
  p32.dtype = fna::DType::f32;
  st = fna::forward(p32, ref.forward_args(), options_for(c, fna::Backend::reference));
  ASSERT_TRUE(st.ok()) << st.message;
  got.c.with_lse = c.with_lse;
  Check chk = check_forward(got, ref);
  EXPECT_TRUE(chk.ok) << c.str() << "\n" << chk.str();
  // Backward from each backend's own O and LSE.
  st = fna::backward(c.p, got.backward_args(), cpu_options(c, threads, tun));
  ASSERT_TRUE(st.ok()) << st.message;
  st = fna::backward(p32, ref.backward_args(), options_for(c, fna::Backend::reference));
  ASSERT_TRUE(st.ok()) << st.message;
  chk = check_backward(got, ref);
  EXPECT_TRUE(chk.ok) << "backward " << c.str() << "\n" << chk.str();
}

TEST_P(CpuVsReference, ForwardBackward) {
  const int n = (rank() == 3 ? 40 : 60) * intensity();
  for (int i = 0; i < n; ++i) {
    const Case c = random_case(5000 + i, rank(), intensity());
    SCOPED_TRACE("case " + std::to_string(i));
    run_fused(c, 1 + i % 3, tuning());
    if (HasFatalFailure()) return;
  }
}

// Wider windows and longer axes than the random sweep, so tiles have interiors and many columns.
TEST_P(CpuVsReference, LargerWindows) {
  RandomLimits lim;
  lim.max_axis[0] = 80;
  lim.max_axis[1] = 20;
  lim.max_axis[2] = 9;
  lim.max_dim = 70;
  for (int i = 0; i < 10 * intensity(); ++i) {
    const Case c = random_case(7000 + i, rank(), 1, lim);
    SCOPED_TRACE("case " + std::to_string(i));
    run_fused(c, 2, tuning());
    if (HasFatalFailure()) return;
  }
}

TEST_P(CpuVsReference, Unfused) {
  for (int i = 0; i < 20 * intensity(); ++i) {
    const Case c = random_case(9000 + i, rank(), intensity());
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.str());
    fna::Problem p32 = c.p;
    p32.dtype = fna::DType::f32;
    // The unfused operators take no tuning (their kernels do not depend on the ISA or panels).
    const fna::Options cpu = cpu_options(c, 2, fna::Tuning{});
    const fna::Options ref = options_for(c, fna::Backend::reference);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    ProblemTensors got(c);
    ProblemTensors rf = got.as_f32();
    got.attn.fill(nan);
    ASSERT_TRUE(fna::qk_forward(c.p, got.qk_args(), cpu).ok());
    ASSERT_TRUE(fna::qk_forward(p32, rf.qk_args(), ref).ok());
    Check chk = check_qk(got, rf);
    EXPECT_TRUE(chk.ok) << "qk\n" << chk.str();

    ProblemTensors g2(c);
    ProblemTensors r2 = g2.as_f32();
    ASSERT_TRUE(fna::av_forward(c.p, g2.av_args(), cpu).ok());
    ASSERT_TRUE(fna::av_forward(p32, r2.av_args(), ref).ok());
    chk = check_av(g2, r2);
    EXPECT_TRUE(chk.ok) << "av\n" << chk.str();
    ASSERT_TRUE(fna::qk_backward(c.p, g2.qk_backward_args(), cpu).ok());
    ASSERT_TRUE(fna::qk_backward(p32, r2.qk_backward_args(), ref).ok());
    chk = check_qk_backward(g2, r2);
    EXPECT_TRUE(chk.ok) << "qk backward\n" << chk.str();
    g2.d_attn.fill(nan);
    ASSERT_TRUE(fna::av_backward(c.p, g2.av_backward_args(), cpu).ok());
    ASSERT_TRUE(fna::av_backward(p32, r2.av_backward_args(), ref).ok());
    chk = check_av_backward(g2, r2);
    EXPECT_TRUE(chk.ok) << "av backward\n" << chk.str();
    // Slots that are not neighbors get a zero gradient, like the reference's.
    const std::vector<double> mask = naive_qk(r2), dga = g2.d_attn.to_double();
    for (size_t e = 0; e < mask.size(); ++e)
      if (std::isinf(mask[e])) ASSERT_EQ(dga[e], 0.0) << "d_attn slot " << e;
  }
}

// softmax(qk * scale) -> av equals the fused forward (float32).
TEST_P(CpuVsReference, UnfusedComposesToForward) {
  RandomLimits lim;
  lim.dtypes = {fna::DType::f32};
  for (int i = 0; i < 10 * intensity(); ++i) {
    Case c = random_case(11000 + i, rank(), 1, lim);
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.str());
    ProblemTensors t(c);
    fna::Options o = cpu(c, 2);  // the forward below runs with the parameter's tuning
    fna::Options unfused = cpu_options(c, 2, fna::Tuning{});  // the qk / av operators take none
    o.scale = unfused.scale = c.resolved_scale();
    ASSERT_TRUE(fna::qk_forward(c.p, t.qk_args(), unfused).ok());
    const int64_t S = c.p.window() + c.p.num_additional;
    std::vector<double> w = t.attn.to_double();
    for (size_t r = 0; r < w.size(); r += static_cast<size_t>(S)) {
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t s = 0; s < S; ++s) m = std::max(m, w[r + s]);
      for (int64_t s = 0; s < S; ++s) sum += std::exp(w[r + s] - m);
      for (int64_t s = 0; s < S; ++s) w[r + s] = std::exp(w[r + s] - m) / sum;
    }
    t.attn.from_double(w);
    ASSERT_TRUE(fna::av_forward(c.p, t.av_args(), unfused).ok());
    const std::vector<double> composed = t.o.to_double();
    t.poison_outputs();
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
    const Check chk = compare("output", t.o.to_double(), composed, {}, fna::DType::f32);
    EXPECT_TRUE(chk.ok) << chk.str();
  }
}

// Two adjacent lines' same tile in one kernel call (bands of 2 lines, the forward's default)
// gives the bits of one call per tile in line order (Tuning::cpu_band 1): the shared key rows are
// only loaded once, every score is still the same sum in the same order.
TEST_P(CpuVsReference, PairedTilesMatchLineOrder) {
  RandomLimits lim;
  lim.max_axis[0] = 40;
  lim.max_axis[1] = 20;
  lim.max_axis[2] = 9;
  for (int i = 0; i < 10 * intensity(); ++i) {
    const Case c = random_case(13000 + i, rank(), 1, lim);
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.str());
    ProblemTensors t(c);
    std::vector<double> out[2], lse[2];
    for (int k = 0; k < 2; ++k) {
      fna::Options o = cpu(c, 1 + i % 2);
      if (k == 0) o.tuning.cpu_band = 1;
      t.poison_outputs();
      const fna::Status st = fna::forward(c.p, t.forward_args(), o);
      ASSERT_TRUE(st.ok()) << st.message;
      out[k] = t.o.to_double();
      if (c.with_lse) lse[k] = t.lse.to_double();
    }
    for (size_t e = 0; e < out[0].size(); ++e) ASSERT_EQ(out[0][e], out[1][e]) << "output " << e;
    for (size_t e = 0; e < lse[0].size(); ++e) ASSERT_EQ(lse[0][e], lse[1][e]) << "lse " << e;
  }
}

// The forward in strip order (Tuning::cpu_strips on: per tile column, every KV head of a band of
// lines in turn, panels of the tile's key columns only; the default on 2-D grids of several KV
// heads) gives the bits of line order (cpu_strips off): the same box rows and columns per
// tile, the panels' other columns only ever masked. Random problems of every rank, 1 and 2
// threads.
TEST_P(CpuVsReference, StripOrderMatchesLineOrder) {
  RandomLimits lim;
  lim.max_axis[0] = 40;
  lim.max_axis[1] = 40;
  lim.max_axis[2] = 9;
  for (int i = 0; i < 10 * intensity(); ++i) {
    const Case c = random_case(14000 + i, rank(), 1, lim);
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.str());
    ProblemTensors t(c);
    std::vector<double> out[2], lse[2];
    for (int k = 0; k < 2; ++k) {
      fna::Options o = cpu(c, 1 + i % 2);
      o.tuning.cpu_strips = k == 0 ? fna::Switch::off : fna::Switch::on;
      t.poison_outputs();
      const fna::Status st = fna::forward(c.p, t.forward_args(), o);
      ASSERT_TRUE(st.ok()) << st.message;
      out[k] = t.o.to_double();
      if (c.with_lse) lse[k] = t.lse.to_double();
    }
    for (size_t e = 0; e < out[0].size(); ++e) ASSERT_EQ(out[0][e], out[1][e]) << "output " << e;
    for (size_t e = 0; e < lse[0].size(); ++e) ASSERT_EQ(lse[0][e], lse[1][e]) << "lse " << e;
  }
}

// Float32 heads-last tensors whose head dims are multiples of every vector width: the fused
// kernels then read Q / dO and write O / dQ in the caller's rows (backend.cpp: direct_rows), on
// problems long enough for per-worker rings, with the diagonal query groups of the kernels.
// Windows at the borders, dilation (also one that does not divide the axis), strides, causal,
// GQA and additional keys, on one and two threads.
TEST_P(CpuVsReference, InPlaceRows) {
  if (rank() != 2) GTEST_SKIP() << "2-D problems (rings need lines of several rows)";
  struct Shape {
    int64_t L0, L1, K0, K1, d0, d1, s0, s1;
    bool causal0;
    int64_t H, Hkv, D, Dv, A, B;
  };
  const Shape shapes[] = {
      {40, 37, 5, 7, 1, 1, 1, 1, false, 2, 2, 16, 32, 0, 1},
      {45, 33, 3, 5, 2, 3, 1, 2, false, 4, 2, 32, 16, 0, 2},
      {36, 40, 7, 3, 1, 1, 3, 1, true, 2, 1, 16, 16, 3, 1},
  };
  for (const Shape& sh : shapes) {
    Case c;
    fna::Problem& p = c.p;
    p.rank = 2;
    p.batch = sh.B;
    p.shape[0] = sh.L0;
    p.shape[1] = sh.L1;
    p.kernel_size[0] = sh.K0;
    p.kernel_size[1] = sh.K1;
    p.dilation[0] = sh.d0;
    p.dilation[1] = sh.d1;
    p.stride[0] = sh.s0;
    p.stride[1] = sh.s1;
    p.is_causal[0] = sh.causal0;
    p.heads = sh.H;
    p.heads_kv = sh.Hkv;
    p.dim = sh.D;
    p.dim_v = sh.Dv;
    p.num_additional = sh.A;
    p.dtype = fna::DType::f32;
    c.seed = static_cast<uint64_t>(sh.L0 * 1000 + sh.L1);
    // cpu_strips: see StripOrderMatchesLineOrder; cpu_acc_rings: the backward's dK / dV in
    // per-worker rings flushed to the outputs (float32 default) or in full per-worker copies.
    for (fna::Switch strips : {fna::Switch::off, fna::Switch::on})
      for (fna::Switch acc : {fna::Switch::on, fna::Switch::off}) {
        fna::Tuning tun = tuning();
        tun.cpu_strips = strips;
        tun.cpu_acc_rings = acc;
        for (int threads : {1, 2}) run_fused(c, threads, tun);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndKernels, CpuVsReference,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::ValuesIn(kernel_sets()),
                                            ::testing::Values("rings", "shared")),
                         [](const auto& info) {
                           return "rank" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param) + "_" + std::get<2>(info.param);
                         });

}  // namespace
}  // namespace fna_test

namespace fna_test {
namespace {

// Options::deterministic on the cpu backward: three runs on two threads give bitwise identical
// gradients (per-thread dK / dV partial sums with a fixed task-to-thread assignment, summed in
// thread order). The assignment itself is tested against timing in parallel_test.cpp.
TEST(CpuDeterministic, BackwardRepeatsBitwise) {
  for (int i = 0; i < 4; ++i) {
    const Case c = random_case(13000 + i, 2, 1);
    ProblemTensors t(c);
    t.c.with_lse = true;
    fna::Options o = options_for(c, fna::Backend::cpu, 2);
    o.deterministic = true;
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
    std::vector<std::vector<unsigned char>> first;
    for (int run = 0; run < 3; ++run) {
      t.poison_outputs();
      ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
      const fna::Status st = fna::backward(c.p, t.backward_args(), o);
      ASSERT_TRUE(st.ok()) << st.message;
      std::vector<std::vector<unsigned char>> got;
      for (const HostTensor* g : {&t.dq, &t.dk, &t.dv}) {
        const auto* b = static_cast<const unsigned char*>(g->data());
        got.emplace_back(b, b + g->bytes());
      }
      if (run == 0) first = got;
      else EXPECT_EQ(got, first) << c.str() << " run " << run;
    }
  }
}

}  // namespace
}  // namespace fna_test
