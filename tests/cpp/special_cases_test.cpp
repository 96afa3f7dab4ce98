// docs/semantics.md section 1's special cases, on the reference and the cpu backend (every kernel set): the
// expected results are computed here from plain dense attention, never from the library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cpu/tile.h"
#include "support/check.h"

namespace fna_test {
namespace {

// Which keys each query may see, for the dense computation: allowed(q_token, k_token).
using Mask = std::function<bool(int64_t, int64_t)>;

// Dense float64 attention with a mask over flattened tokens, GQA, heads-last logical layout.
std::vector<double> dense_attention(const ProblemTensors& t, const Mask& allowed) {
  const fna::Problem& p = t.c.p;
  const int64_t N = p.tokens(), H = p.heads, Hk = p.heads_kv, D = p.dim, Dv = p.dim_v;
  const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
  const double scale = t.c.resolved_scale();
  std::vector<double> o(static_cast<size_t>(p.batch * N * H * Dv), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / (H / Hk);
        std::vector<double> logit(static_cast<size_t>(N), -std::numeric_limits<double>::infinity());
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < N; ++j) {
          if (!allowed(i, j)) continue;
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += q[((b * N + i) * H + h) * D + e] * k[((b * N + j) * Hk + hk) * D + e];
          logit[static_cast<size_t>(j)] = s * scale;
          m = std::max(m, s * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j < N; ++j) sum += std::exp(logit[static_cast<size_t>(j)] - m);
        for (int64_t j = 0; j < N; ++j) {
          const double w = std::exp(logit[static_cast<size_t>(j)] - m) / sum;
          if (w == 0) continue;
          for (int64_t e = 0; e < Dv; ++e)
            o[static_cast<size_t>(((b * N + i) * H + h) * Dv + e)] += w * v[((b * N + j) * Hk + hk) * Dv + e];
        }
      }
  return o;
}

struct Backend {
  fna::Backend backend;
  std::string kernels;  // Tuning::cpu_isa for the cpu backend
  std::string name() const { return backend == fna::Backend::reference ? "reference" : "cpu_" + kernels; }
};

// The reference and the cpu backend with every kernel set the CPU (and the build) has.
std::vector<Backend> backends() {
  std::vector<Backend> v{{fna::Backend::reference, ""}};
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    fna::Tuning t;
    if (fna::set_tuning(&t, "cpu_isa", isa).ok() && fna::cpu::kernels_for(t.cpu_isa))
      v.push_back({fna::Backend::cpu, isa});
  }
  return v;
}

class SpecialCases : public ::testing::TestWithParam<Backend> {
 protected:
  // The options of the parameter's backend (and kernel set).
  fna::Options options(const Case& c, int threads) const {
    fna::Options o = options_for(c, GetParam().backend, threads);
    if (!GetParam().kernels.empty()) {
      const fna::Status st = fna::set_tuning(&o.tuning, "cpu_isa", GetParam().kernels);
      EXPECT_TRUE(st.ok()) << st.message;
    }
    return o;
  }
  // A float32 case: random heads / dims (GQA, D_v != D), contiguous or strided.
  Case make(uint64_t seed, int rank, const int64_t* shape) const {
    Case c = random_case(seed, rank, 1, f32_limits());
    c.p.num_additional = 0;
    for (int a = 0; a < rank; ++a) {
      c.p.shape[a] = shape[a];
      c.p.kernel_size[a] = 1;
      c.p.dilation[a] = 1;
      c.p.stride[a] = 1;
      c.p.is_causal[a] = false;
    }
    return c;
  }
  static RandomLimits f32_limits() {
    RandomLimits lim;
    lim.dtypes = {fna::DType::f32};
    return lim;
  }
  std::vector<double> run(ProblemTensors& t) const {
    const fna::Status st = fna::forward(t.c.p, t.forward_args(), options(t.c, 2));
    EXPECT_TRUE(st.ok()) << st.message;
    return t.o.to_double();
  }
  void expect_close(const std::vector<double>& got, const std::vector<double>& want, const Case& c) const {
    const Check chk = compare("output", got, want, {}, fna::DType::f32);
    EXPECT_TRUE(chk.ok) << c.str() << "\n" << chk.str();
  }
};

const int64_t kShapes[][3] = {{9, 1, 1}, {5, 7, 1}, {3, 4, 5}};

TEST_P(SpecialCases, FullWindowIsSelfAttention) {
  for (int rank = 1; rank <= 3; ++rank)
    for (int i = 0; i < 3; ++i) {
      Case c = make(100 + 10 * rank + i, rank, kShapes[rank - 1]);
      for (int a = 0; a < rank; ++a) c.p.kernel_size[a] = c.p.shape[a];
      ProblemTensors t(c);
      expect_close(run(t), dense_attention(t, [](int64_t, int64_t) { return true; }), c);
    }
}

TEST_P(SpecialCases, KernelOneIsValue) {
  for (int rank = 1; rank <= 3; ++rank) {
    Case c = make(200 + rank, rank, kShapes[rank - 1]);
    ProblemTensors t(c);
    const std::vector<double> o = run(t), v = t.v.to_double();
    const fna::Problem& p = c.p;
    const int64_t N = p.tokens(), group = p.heads / p.heads_kv;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < p.heads; ++h)
          for (int64_t e = 0; e < p.dim_v; ++e) {
            const double want = v[static_cast<size_t>(((b * N + n) * p.heads_kv + h / group) * p.dim_v + e)];
            const double got = o[static_cast<size_t>(((b * N + n) * p.heads + h) * p.dim_v + e)];
            ASSERT_NEAR(got, want, 1e-6 * std::fabs(want)) << c.str();
          }
  }
}

TEST_P(SpecialCases, CausalFullWindowIsCausalAttention) {
  for (int64_t L : {1, 2, 7, 16, 33}) {
    const int64_t shape[3] = {L, 1, 1};
    Case c = make(300 + static_cast<uint64_t>(L), 1, shape);
    c.p.kernel_size[0] = L;
    c.p.is_causal[0] = true;
    ProblemTensors t(c);
    expect_close(run(t), dense_attention(t, [](int64_t i, int64_t j) { return j <= i; }), c);
  }
}

TEST_P(SpecialCases, StrideEqualKernelIsBlockedAttention) {
  // 1-D: L = 12 with blocks of 3 and 4; 2-D: 6x8 with 3x4 blocks.
  for (int64_t K : {3, 4}) {
    const int64_t shape[3] = {12, 1, 1};
    Case c = make(400 + static_cast<uint64_t>(K), 1, shape);
    c.p.kernel_size[0] = c.p.stride[0] = K;
    ProblemTensors t(c);
    expect_close(run(t), dense_attention(t, [K](int64_t i, int64_t j) { return i / K == j / K; }), c);
  }
  const int64_t shape[3] = {6, 8, 1};
  Case c = make(410, 2, shape);
  c.p.kernel_size[0] = c.p.stride[0] = 3;
  c.p.kernel_size[1] = c.p.stride[1] = 4;
  ProblemTensors t(c);
  expect_close(run(t), dense_attention(t, [](int64_t i, int64_t j) {
                 return (i / 8) / 3 == (j / 8) / 3 && (i % 8) / 4 == (j % 8) / 4;
               }),
               c);
}

// Dilation d equals NA with the same kernel / stride / causal on each of the d de-interleaved
// sub-grids (which have different lengths when d does not divide L).
TEST_P(SpecialCases, DilationIsNaOnSubGrids) {
  struct Cfg { int rank; int64_t shape[2], kernel[2], dil[2], stride[2]; bool causal[2]; };
  const Cfg cfgs[] = {{1, {14, 1}, {3, 1}, {3, 1}, {1, 1}, {false, false}},
                      {1, {13, 1}, {4, 1}, {2, 1}, {3, 1}, {true, false}},
                      {2, {7, 9}, {2, 3}, {2, 3}, {1, 2}, {false, true}}};
  for (const Cfg& cf : cfgs) {
    const int64_t shape[3] = {cf.shape[0], cf.shape[1], 1};
    Case c = make(500 + static_cast<uint64_t>(cf.shape[0]), cf.rank, shape);
    for (int a = 0; a < cf.rank; ++a) {
      c.p.kernel_size[a] = cf.kernel[a];
      c.p.dilation[a] = cf.dil[a];
      c.p.stride[a] = cf.stride[a];
      c.p.is_causal[a] = cf.causal[a];
    }
    ProblemTensors t(c);
    const std::vector<double> full = run(t);
    const fna::Problem& p = c.p;
    const int64_t H = p.heads, Dv = p.dim_v;
    const int64_t L1 = cf.rank > 1 ? p.shape[1] : 1;
    for (int64_t g0 = 0; g0 < p.dilation[0]; ++g0)
      for (int64_t g1 = 0; g1 < (cf.rank > 1 ? p.dilation[1] : 1); ++g1) {
        // The sub-grid of group (g0, g1) as its own problem with dilation 1.
        Case sc = c;
        sc.p.shape[0] = (p.shape[0] - g0 + p.dilation[0] - 1) / p.dilation[0];
        sc.p.dilation[0] = 1;
        if (cf.rank > 1) {
          sc.p.shape[1] = (p.shape[1] - g1 + p.dilation[1] - 1) / p.dilation[1];
          sc.p.dilation[1] = 1;
        }
        sc.layout = Layout::contiguous;
        ProblemTensors st(sc);
        const int64_t SL1 = cf.rank > 1 ? sc.p.shape[1] : 1;
        auto full_token = [&](int64_t sub) {
          const int64_t x0 = sub / SL1, x1 = sub % SL1;
          return (x0 * p.dilation[0] + g0) * L1 + (cf.rank > 1 ? x1 * p.dilation[1] + g1 : 0);
        };
        // Copy the group's Q, K, V into the sub-problem's tensors.
        const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
        std::vector<double> sq(st.q.numel()), sk(st.k.numel()), sv(st.v.numel());
        const int64_t SN = sc.p.tokens(), N = p.tokens();
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t n = 0; n < SN; ++n) {
            const int64_t f = full_token(n);
            for (int64_t e = 0; e < H * p.dim; ++e) sq[(b * SN + n) * H * p.dim + e] = q[(b * N + f) * H * p.dim + e];
            for (int64_t e = 0; e < p.heads_kv * p.dim; ++e)
              sk[(b * SN + n) * p.heads_kv * p.dim + e] = k[(b * N + f) * p.heads_kv * p.dim + e];
            for (int64_t e = 0; e < p.heads_kv * Dv; ++e)
              sv[(b * SN + n) * p.heads_kv * Dv + e] = v[(b * N + f) * p.heads_kv * Dv + e];
          }
        st.q.from_double(sq);
        st.k.from_double(sk);
        st.v.from_double(sv);
        const std::vector<double> sub = run(st);
        std::vector<double> want(sub.size()), got(sub.size());
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t n = 0; n < SN; ++n)
            for (int64_t e = 0; e < H * Dv; ++e) {
              want[(b * SN + n) * H * Dv + e] = sub[(b * SN + n) * H * Dv + e];
              got[(b * SN + n) * H * Dv + e] = full[(b * N + full_token(n)) * H * Dv + e];
            }
        SCOPED_TRACE("group (" + std::to_string(g0) + "," + std::to_string(g1) + ")");
        expect_close(got, want, c);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SpecialCases, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace fna_test
