// Every error path of the API: the Status code, and a message naming the argument and its value.
// Outputs are poisoned first and must stay untouched by a rejected call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/check.h"

namespace fna_test {
namespace {

// A valid small 2-D problem with GQA and additional keys, to break one field at a time.
Case valid_case() {
  Case c;
  fna::Problem& p = c.p;
  p.rank = 2;
  p.batch = 2;
  p.shape[0] = 8;
  p.shape[1] = 6;
  p.heads = 4;
  p.heads_kv = 2;
  p.dim = 8;
  p.dim_v = 4;
  p.kernel_size[0] = 3;
  p.kernel_size[1] = 5;
  p.dilation[0] = 2;
  p.stride[0] = 2;
  p.num_additional = 2;
  p.dtype = fna::DType::f32;
  c.seed = 7;
  return c;
}

fna::Options cpu_opts() {
  fna::Options o;
  o.backend = fna::Backend::cpu;
  return o;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Runs forward with a broken problem; expects `code` and every needle in the message.
void expect_forward_error(const fna::Problem& p, fna::Code code, const std::vector<std::string>& needles,
                          const fna::Options& opt = cpu_opts()) {
  ProblemTensors t(valid_case());  // tensors sized for the valid case (never read on error)
  const fna::Status st = fna::forward(p, t.forward_args(), opt);
  EXPECT_EQ(static_cast<int>(st.code), static_cast<int>(code)) << st.message;
  for (const auto& n : needles) EXPECT_TRUE(contains(st.message, n)) << "'" << st.message << "' lacks '" << n << "'";
  const std::vector<double> o = t.o.to_double();
  for (double v : o) ASSERT_TRUE(std::isnan(v)) << "a rejected call wrote the output";
}

TEST(Validation, ValidCaseRuns) {
  const Case c = valid_case();
  ProblemTensors t(c);
  const fna::Status st = fna::forward(c.p, t.forward_args(), cpu_opts());
  EXPECT_TRUE(st.ok()) << st.message;
}

TEST(Validation, Rank) {
  for (int r : {0, 4, -1}) {
    fna::Problem p = valid_case().p;
    p.rank = r;
    expect_forward_error(p, fna::Code::invalid_argument, {"rank=" + std::to_string(r)});
  }
}

TEST(Validation, KernelSize) {
  fna::Problem p = valid_case().p;
  p.kernel_size[1] = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"kernel_size[1]=0"});
  p = valid_case().p;
  p.kernel_size[0] = 5;  // 5 * dilation 2 > 8
  expect_forward_error(p, fna::Code::invalid_argument, {"kernel_size[0]=5", "dilation[0]=2", "8"});
  p = valid_case().p;
  p.kernel_size[1] = 7;  // > length 6
  expect_forward_error(p, fna::Code::invalid_argument, {"kernel_size[1]=7", "6"});
}

TEST(Validation, Stride) {
  fna::Problem p = valid_case().p;
  p.stride[1] = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"stride[1]=0"});
  p = valid_case().p;
  p.stride[0] = 4;  // kernel 3
  expect_forward_error(p, fna::Code::invalid_argument, {"stride[0]=4", "kernel_size[0]=3"});
}

TEST(Validation, Dilation) {
  fna::Problem p = valid_case().p;
  p.dilation[1] = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"dilation[1]=0"});
}

TEST(Validation, HeadsAndDims) {
  fna::Problem p = valid_case().p;
  p.heads = 3;
  expect_forward_error(p, fna::Code::invalid_argument, {"heads=3", "heads_kv=2"});
  p = valid_case().p;
  p.dim = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"dim=0"});
  p = valid_case().p;
  p.batch = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"batch=0"});
  p = valid_case().p;
  p.shape[0] = 0;
  expect_forward_error(p, fna::Code::invalid_argument, {"shape[0]=0"});
}

TEST(Validation, DType) {
  fna::Problem p = valid_case().p;
  p.dtype = static_cast<fna::DType>(7);
  expect_forward_error(p, fna::Code::unsupported, {"dtype=7"});
}

TEST(Validation, Backend) {
  const fna::Problem p = valid_case().p;
  fna::Options o = cpu_opts();
  o.backend = static_cast<fna::Backend>(9);
  expect_forward_error(p, fna::Code::unsupported, {"backend=9"}, o);
  fna::Backend parsed;
  const fna::Status st = fna::parse_backend("gpu-magic", &parsed);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "gpu-magic")) << st.message;
}

// cuda-gemm: named like the others, in the build exactly where cuda-naive is, no bias.
TEST(Validation, GemmBackendNames) {
  fna::Backend b = fna::Backend::automatic;
  ASSERT_TRUE(fna::parse_backend("cuda-gemm", &b).ok());
  EXPECT_EQ(b, fna::Backend::cuda_gemm);
  EXPECT_STREQ(fna::backend_name(fna::Backend::cuda_gemm), "cuda-gemm");
  EXPECT_EQ(fna::backend_compiled(fna::Backend::cuda_gemm),
            fna::backend_compiled(fna::Backend::cuda_naive));
  EXPECT_FALSE(fna::takes_rpb(fna::Backend::cuda_gemm));
  const fna::Status st = fna::parse_backend("cuda-gemmm", &b);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "cuda-gemm")) << st.message;  // listed among the valid names
}

TEST(Validation, CudaBackendWithCpuTensors) {
  const fna::Problem p = valid_case().p;
  for (fna::Backend b : {fna::Backend::cuda_naive, fna::Backend::cuda_fused,
                         fna::Backend::cuda_gemm}) {
    fna::Options o;
    o.backend = b;
    o.device = fna::Device::cpu;
    if (!fna::backend_compiled(b))
      expect_forward_error(p, fna::Code::not_compiled, {std::string("backend=") + fna::backend_name(b)}, o);
    else
      expect_forward_error(p, fna::Code::invalid_argument, {std::string("backend=") + fna::backend_name(b), "CPU"}, o);
  }
}

TEST(Validation, CpuBackendWithCudaTensors) {
  fna::Options o = cpu_opts();
  o.device = fna::Device::cuda;
  expect_forward_error(valid_case().p, fna::Code::invalid_argument, {"backend=cpu", "CUDA"}, o);
}

TEST(Validation, ScaleAndThreads) {
  fna::Options o = cpu_opts();
  o.scale = std::nan("");
  expect_forward_error(valid_case().p, fna::Code::invalid_argument, {"scale=nan"}, o);
  o = cpu_opts();
  o.scale = 1e39;  // finite as a double, infinite in the kernels' float32
  expect_forward_error(valid_case().p, fna::Code::invalid_argument,
                       {"scale=1e+39", "must be at most", "float32"}, o);
  o = cpu_opts();
  o.num_threads = -2;
  expect_forward_error(valid_case().p, fna::Code::invalid_argument, {"num_threads=-2"}, o);
}

// A tile configuration names a cuda-fused kernel: on any other backend it is an error, never
// silently ignored.
TEST(Validation, ConfigOnOtherBackend) {
  for (fna::Backend b : {fna::Backend::automatic, fna::Backend::cpu, fna::Backend::reference}) {
    fna::Options o = cpu_opts();
    o.backend = b;
    o.config = "fna_fwd_sm80_bf16_d64_q8x16_kv8x8_w4";
    expect_forward_error(valid_case().p, fna::Code::invalid_argument,
                         {"config='fna_fwd_sm80_bf16_d64_q8x16_kv8x8_w4'", "cuda-fused",
                          b == fna::Backend::reference ? "backend=reference" : "backend=cpu"},
                         o);
  }
}

// A backward configuration likewise: an error on any other backend, forward and backward calls.
TEST(Validation, BackwardConfigOnOtherBackend) {
  const std::string name = "fna_bwd_sm80_f32_d64_kv8x16_q8x8_dqq8x8_dqkv8x8";
  for (fna::Backend b : {fna::Backend::automatic, fna::Backend::cpu, fna::Backend::reference}) {
    fna::Options o = cpu_opts();
    o.backend = b;
    o.backward_config = name;
    const std::vector<std::string> needles = {
        "backward_config='" + name + "'", "cuda-fused backward",
        b == fna::Backend::reference ? "backend=reference" : "backend=cpu"};
    expect_forward_error(valid_case().p, fna::Code::invalid_argument, needles, o);
    ProblemTensors t(valid_case());
    const fna::Status st = fna::backward(t.c.p, t.backward_args(), o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    for (const auto& n : needles) EXPECT_TRUE(contains(st.message, n)) << st.message;
    for (double v : t.dq.to_double()) ASSERT_TRUE(std::isnan(v)) << "a rejected call wrote dQ";
  }
}

// The backward configuration table: names carry their dtype, padded head dim and shapes (one
// extent per axis of the rank); a name is valid for its own (rank, dtype, padded dim) alone, and
// a wrong one is an invalid_argument naming it and listing the valid ones, before any device is
// needed (checked here on the CPU; the GPU suite runs every listed configuration).
TEST(Validation, BackwardConfigTable) {
  if (!fna::backend_compiled(fna::Backend::cuda_fused)) {
    EXPECT_TRUE(fna::fused_backward_configs(2, fna::DType::bf16, 64).empty());
    GTEST_SKIP() << "cuda-fused not compiled: the table is empty";
  }
  const fna::DType dtypes[] = {fna::DType::f32, fna::DType::f16, fna::DType::bf16};
  const char* tokens[] = {"f32", "f16", "bf16"};
  for (int rank = 1; rank <= 3; ++rank)
    for (int t = 0; t < 3; ++t)
      for (int64_t dim : {8, 64, 65, 128, 200, 256}) {
        const std::vector<std::string> names = fna::fused_backward_configs(rank, dtypes[t], dim);
        const int64_t pad = dim <= 64 ? 64 : dim <= 128 ? 128 : 256;
        ASSERT_FALSE(names.empty()) << rank << " " << tokens[t] << " " << dim;
        EXPECT_GE(names.size(), rank == 1 ? 1u : 2u) << names[0];
        // The dK / dV kernel family leads the name: sm80 everywhere, the Hopper families only
        // for 16-bit head dims: sm90 up to 128, the warp-specialized sm90ws up to 256.
        const std::string tail = std::string("_") + tokens[t] + "_d" + std::to_string(pad) + "_kv";
        const bool sm90_ok = t != 0 && pad <= 128;
        const bool sm90ws_ok = t != 0 && pad <= 256;
        for (size_t i = 0; i < names.size(); ++i) {
          bool known = names[i].rfind("fna_bwd_sm80" + tail, 0) == 0;
          if (sm90_ok) known = known || names[i].rfind("fna_bwd_sm90" + tail, 0) == 0;
          if (sm90ws_ok) known = known || names[i].rfind("fna_bwd_sm90ws" + tail, 0) == 0;
          EXPECT_TRUE(known) << names[i];
          // rank - 1 'x' per shape, four shapes
          EXPECT_EQ(std::count(names[i].begin(), names[i].end(), 'x'), 4 * (rank - 1)) << names[i];
          for (size_t j = 0; j < i; ++j) EXPECT_NE(names[i], names[j]);
        }
      }
  EXPECT_TRUE(fna::fused_backward_configs(2, fna::DType::bf16, 257).empty());

  Case c = valid_case();  // rank 2, float32, head dims 8 / 4 (padded 64)
  const std::vector<std::string> valid = fna::fused_backward_configs(2, fna::DType::f32, 8);
  const std::string other = fna::fused_backward_configs(2, fna::DType::bf16, 8)[0];
  for (const std::string& bad : {std::string("bogus"), other}) {
    fna::Options o;
    o.backend = fna::Backend::cuda_fused;
    o.device = fna::Device::cuda;
    o.backward_config = bad;
    ProblemTensors t(c);
    const fna::Status st = fna::backward(c.p, t.backward_args(), o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    for (const std::string& n :
         {"backward_config='" + bad + "'", std::string("is not a cuda-fused backward configuration"),
          std::string("rank=2, dtype=float32, dim=8"), "valid: " + valid[0]})
      EXPECT_TRUE(contains(st.message, n)) << "'" << st.message << "' lacks '" << n << "'";
  }
}

// Null and misaligned pointers, for every tensor of forward and backward.
TEST(Validation, Pointers) {
  const Case c = valid_case();
  using Breaker = std::function<void(fna::ForwardArgs&)>;
  const std::vector<std::pair<std::string, Breaker>> fwd = {
      {"query", [](fna::ForwardArgs& a) { a.q.data = nullptr; }},
      {"key", [](fna::ForwardArgs& a) { a.k.data = nullptr; }},
      {"value", [](fna::ForwardArgs& a) { a.v.data = nullptr; }},
      {"output", [](fna::ForwardArgs& a) { a.o.data = nullptr; }},
      {"additional_keys", [](fna::ForwardArgs& a) { a.add_k.data = nullptr; }},
      {"additional_values", [](fna::ForwardArgs& a) { a.add_v.data = nullptr; }},
  };
  for (const auto& [name, brk] : fwd) {
    ProblemTensors t(c);
    fna::ForwardArgs a = t.forward_args();
    brk(a);
    const fna::Status st = fna::forward(c.p, a, cpu_opts());
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << name;
    EXPECT_TRUE(contains(st.message, name + " is a null pointer")) << st.message;
  }
  {  // misaligned float pointer
    ProblemTensors t(c);
    fna::ForwardArgs a = t.forward_args();
    a.q.data = static_cast<char*>(a.q.data) + 2;
    const fna::Status st = fna::forward(c.p, a, cpu_opts());
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_TRUE(contains(st.message, "query pointer") && contains(st.message, "aligned")) << st.message;
  }
  {  // an output that aliases itself
    ProblemTensors t(c);
    fna::ForwardArgs a = t.forward_args();
    a.o.strides[1] = 0;
    const fna::Status st = fna::forward(c.p, a, cpu_opts());
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_TRUE(contains(st.message, "output stride[1]=0")) << st.message;
  }
  using BBreaker = std::function<void(fna::BackwardArgs&)>;
  const std::vector<std::pair<std::string, BBreaker>> bwd = {
      {"lse", [](fna::BackwardArgs& a) { a.lse.data = nullptr; }},
      {"d_output", [](fna::BackwardArgs& a) { a.d_o.data = nullptr; }},
      {"d_query", [](fna::BackwardArgs& a) { a.dq.data = nullptr; }},
      {"d_key", [](fna::BackwardArgs& a) { a.dk.data = nullptr; }},
      {"d_value", [](fna::BackwardArgs& a) { a.dv.data = nullptr; }},
      {"d_additional_keys", [](fna::BackwardArgs& a) { a.d_add_k.data = nullptr; }},
      {"d_additional_values", [](fna::BackwardArgs& a) { a.d_add_v.data = nullptr; }},
  };
  for (const auto& [name, brk] : bwd) {
    ProblemTensors t(c);
    fna::BackwardArgs a = t.backward_args();
    brk(a);
    const fna::Status st = fna::backward(c.p, a, cpu_opts());
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << name;
    EXPECT_TRUE(contains(st.message, name + " is a null pointer")) << st.message;
    const std::vector<double> dq = t.dq.to_double();
    for (double v : dq) ASSERT_TRUE(std::isnan(v)) << "a rejected backward wrote d_query";
  }
}

TEST(Validation, UnfusedOps) {
  const Case c = valid_case();
  ProblemTensors t(c);
  fna::QKArgs a = t.qk_args();
  a.attn.data = nullptr;
  fna::Status st = fna::qk_forward(c.p, a, cpu_opts());
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "attn is a null pointer")) << st.message;
  fna::AVBackwardArgs b = t.av_backward_args();
  b.d_attn.data = nullptr;
  st = fna::av_backward(c.p, b, cpu_opts());
  EXPECT_TRUE(contains(st.message, "d_attn is a null pointer")) << st.message;
  fna::Problem p = c.p;
  p.kernel_size[0] = 0;
  st = fna::av_forward(p, t.av_args(), cpu_opts());
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "kernel_size[0]=0")) << st.message;
}

}  // namespace
}  // namespace fna_test
