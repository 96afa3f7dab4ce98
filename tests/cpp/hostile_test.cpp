// Hostile sizes (issue 28): products of sizes that wrap int64, sizes the kernels narrow to 32-bit
// int, strides whose extent * stride products wrap. Each must be an error naming the argument and
// its value, before any backend runs (outputs are poisoned and must stay untouched), and every
// backend's own limits must be checkable on the CPU (fna::validate_backend_limits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/check.h"

namespace fna_test {
namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// The 1-D problem of the issue: q = randn(1, 8, 1, 4), seeded non-zero values.
Case small_case(uint64_t seed) {
  Case c;
  c.p.rank = 1;
  c.p.batch = 1;
  c.p.shape[0] = 8;
  c.p.heads = c.p.heads_kv = 1;
  c.p.dim = c.p.dim_v = 4;
  c.p.kernel_size[0] = 3;
  c.seed = seed;
  return c;
}

void expect_status(const fna::Status& st, fna::Code code, const std::vector<std::string>& needles) {
  EXPECT_EQ(static_cast<int>(st.code), static_cast<int>(code)) << st.message;
  for (const auto& n : needles)
    EXPECT_TRUE(contains(st.message, n)) << "'" << st.message << "' lacks '" << n << "'";
}

// forward with the tensors of `c` (random inputs, poisoned outputs) but problem `p`, on the
// reference and cpu backends: `code`, the needles, and no output written.
void expect_forward_rejects(const Case& c, const fna::Problem& p, fna::Code code,
                            const std::vector<std::string>& needles) {
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    SCOPED_TRACE(fna::backend_name(b));
    ProblemTensors t(c);
    t.poison_outputs();
    fna::Options o;
    o.backend = b;
    expect_status(fna::forward(p, t.forward_args(), o), code, needles);
    for (double v : t.o.to_double()) ASSERT_TRUE(std::isnan(v)) << "a rejected call wrote the output";
  }
}

// kernel_size * dilation wrapping int64 to 0 (was SIGFPE: a dilation narrowed to int 0 divides).
TEST(Hostile, KernelTimesDilationWrapsToZero) {
  const Case c = small_case(281);
  fna::Problem p = c.p;
  p.kernel_size[0] = int64_t(1) << 32;
  p.dilation[0] = int64_t(1) << 32;
  p.stride[0] = 1;
  expect_forward_rejects(c, p, fna::Code::invalid_argument,
                         {"kernel_size[0]=4294967296", "dilation[0]=4294967296", "8"});
}

// kernel_size * dilation wrapping to 2 (was: reference left the output as it was, cpu threw
// std::bad_alloc).
TEST(Hostile, KernelTimesDilationWrapsToSmall) {
  const Case c = small_case(282);
  fna::Problem p = c.p;
  p.kernel_size[0] = 3;
  p.dilation[0] = 6148914691236517206;  // 3 * d = 2 (mod 2^64)
  expect_forward_rejects(c, p, fna::Code::invalid_argument,
                         {"kernel_size[0]=3", "dilation[0]=6148914691236517206"});
  fna::Problem q = c.p;
  q.kernel_size[0] = 6148914691236517206;
  q.dilation[0] = 3;
  q.stride[0] = 1;
  expect_forward_rejects(c, q, fna::Code::invalid_argument, {"kernel_size[0]=6148914691236517206"});
}

// K * d == L exactly is still accepted, and K * d == L + 1 is not (the overflow-safe check is
// exact at the boundary); the accepted case agrees with the reference on random inputs.
TEST(Hostile, KernelTimesDilationBoundaryIsExact) {
  for (int64_t d : {1, 2, 3, 5}) {
    Case c = small_case(300 + d);
    c.p.shape[0] = 3 * d;
    c.p.kernel_size[0] = 3;
    c.p.dilation[0] = d;
    ProblemTensors t(c), r(c);
    fna::Options o;
    o.backend = fna::Backend::cpu;
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
    o.backend = fna::Backend::reference;
    ASSERT_TRUE(fna::forward(c.p, r.forward_args(), o).ok());
    const Check chk = compare("output", t.o.to_double(), r.o.to_double(), {}, c.p.dtype);
    EXPECT_TRUE(chk.ok) << chk.str();
    double mx = 0;
    for (double v : r.o.to_double()) mx = std::max(mx, std::fabs(v));
    EXPECT_GT(mx, 0.0);
    fna::Problem p = c.p;
    p.shape[0] = 3 * d - 1;
    expect_status(fna::validate_problem(p), fna::Code::invalid_argument,
                  {"kernel_size[0]=3", "dilation[0]=" + std::to_string(d)});
  }
}

// Sizes the kernels narrow to int: an expanded tensor (all-zero strides) with head dim 2^32 + 1
// ran as head dim 1 on the cpu backend. Each is bounded at validation, naming it.
TEST(Hostile, NarrowedSizesAreBounded) {
  const int64_t huge = (int64_t(1) << 32) + 1;
  struct Field {
    const char* name;
    int64_t fna::Problem::*member;
  };
  const Field fields[] = {{"dim", &fna::Problem::dim},         {"dim_v", &fna::Problem::dim_v},
                          {"num_additional", &fna::Problem::num_additional},
                          {"batch", &fna::Problem::batch},     {"heads", &fna::Problem::heads}};
  Rng rng(283);
  std::vector<float> one(64);
  for (float& x : one) x = static_cast<float>(rng.uniform() * 2 - 1);
  for (const Field& f : fields) {
    SCOPED_TRACE(f.name);
    fna::Problem p = small_case(283).p;
    p.*(f.member) = huge;
    if (f.member == &fna::Problem::heads) p.heads_kv = huge;
    // Every tensor a broadcast of one buffer (strides 0), as torch's expand() makes them.
    fna::TensorRef in;
    in.data = one.data();
    std::vector<float> out(64, NAN), lse(64, NAN);
    fna::TensorRef o, l;
    o.data = out.data();
    l.data = lse.data();
    fna::ForwardArgs a;
    a.q = a.k = a.v = a.add_k = a.add_v = in;
    a.o = o;  // zero strides: rejected as aliasing later, but the size must be named first
    a.lse = l;
    for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
      fna::Options opt;
      opt.backend = b;
      expect_status(fna::forward(p, a, opt), fna::Code::invalid_argument,
                    {std::string(f.name) + "=" + std::to_string(huge), "2^30"});
    }
    for (float v : out) ASSERT_TRUE(std::isnan(v));
    expect_status(fna::validate_problem(p), fna::Code::invalid_argument, {f.name});
  }
  // 2^30 itself is in range (a validate_problem-only check: no tensors that large are made).
  fna::Problem p = small_case(283).p;
  p.dim = p.dim_v = int64_t(1) << 30;
  EXPECT_TRUE(fna::validate_problem(p).ok()) << fna::validate_problem(p).message;
}

// The largest tensor's element count / bytes must not wrap int64 (rank 3, 2^30 per axis).
TEST(Hostile, ElementCountOverflow) {
  fna::Problem p;
  p.rank = 3;
  for (int i = 0; i < 3; ++i) p.shape[i] = int64_t(1) << 30;
  expect_status(fna::validate_problem(p), fna::Code::invalid_argument,
                {"shape[2]=1073741824", "2^62 bytes"});
  // 2^60 tokens of one float32 is exactly 2^62 bytes: accepted.
  for (int i = 0; i < 3; ++i) p.shape[i] = int64_t(1) << 20;
  EXPECT_TRUE(fna::validate_problem(p).ok()) << fna::validate_problem(p).message;
  p.dim = 2;
  expect_status(fna::validate_problem(p), fna::Code::invalid_argument, {"2^62 bytes"});
}

// A stride whose extent * stride product wraps int64 is an error naming the tensor and stride.
TEST(Hostile, StrideTimesExtentOverflow) {
  Case c = small_case(284);
  c.p.batch = 3;
  for (int64_t s : {int64_t(1) << 61, -(int64_t(1) << 62), INT64_MIN, INT64_MAX}) {
    SCOPED_TRACE(s);
    ProblemTensors t(c);
    t.poison_outputs();
    fna::ForwardArgs a = t.forward_args();
    a.k.strides[0] = s;
    fna::Options o;
    o.backend = fna::Backend::cpu;
    expect_status(fna::forward(c.p, a, o), fna::Code::invalid_argument,
                  {"key", "stride[0]=" + std::to_string(s)});
    for (double v : t.o.to_double()) ASSERT_TRUE(std::isnan(v));
  }
}

// Each backend's own limits, checked without a GPU. cuda-naive and cuda-gemm hold one row of
// attention weights in an int.
TEST(Hostile, CudaNaiveRowLimit) {
  for (fna::Backend b : {fna::Backend::cuda_naive, fna::Backend::cuda_gemm}) {
    fna::Problem p;
    p.rank = 2;
    p.shape[0] = p.shape[1] = 46341;
    p.kernel_size[0] = p.kernel_size[1] = 46341;  // W = 2147488281 > 2^31 - 1
    p.stride[0] = p.stride[1] = 1;
    ASSERT_TRUE(fna::validate_problem(p).ok());
    EXPECT_TRUE(fna::validate_backend_limits(p, fna::Backend::cpu).ok());
    EXPECT_TRUE(fna::validate_backend_limits(p, fna::Backend::reference).ok());
    expect_status(fna::validate_backend_limits(p, b), fna::Code::unsupported,
                  {"window=2147488281", std::string("backend=") + fna::backend_name(b),
                   "2^31 - 1"});
    p.kernel_size[1] = 46340;  // 46341 * 46340 = 2147441940 fits
    EXPECT_TRUE(fna::validate_backend_limits(p, b).ok());
    p.num_additional = 2147483647 - 2147441940 + 1;
    expect_status(fna::validate_backend_limits(p, b), fna::Code::unsupported,
                  {"num_additional=41708"});
  }
}

TEST(Hostile, CudaFusedGroupLimit) {
  fna::Problem p;
  p.rank = 3;
  for (int i = 0; i < 3; ++i) {
    p.shape[i] = int64_t(1) << 20;
    p.dilation[i] = int64_t(1) << 11;  // 2^33 dilation groups
  }
  ASSERT_TRUE(fna::validate_problem(p).ok()) << fna::validate_problem(p).message;
  EXPECT_TRUE(fna::validate_backend_limits(p, fna::Backend::cuda_naive).ok());
  expect_status(fna::validate_backend_limits(p, fna::Backend::cuda_fused), fna::Code::unsupported,
                {"8589934592", "cuda-fused", "2^31 - 1"});
  p.dilation[2] = 1 << 9;  // 2^31 groups: still one past the limit
  EXPECT_FALSE(fna::validate_backend_limits(p, fna::Backend::cuda_fused).ok());
  p.dilation[2] = 1 << 8;
  EXPECT_TRUE(fna::validate_backend_limits(p, fna::Backend::cuda_fused).ok());
  // validate_backend_limits runs validate_problem first.
  p.dim = 0;
  expect_status(fna::validate_backend_limits(p, fna::Backend::cuda_fused),
                fna::Code::invalid_argument, {"dim=0"});
}

}  // namespace
}  // namespace fna_test
