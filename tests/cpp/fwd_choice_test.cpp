// The forward plan's heuristic (src/cuda/fused/plan/fwd_choice.cu heuristic_config) on a Hopper
// device's properties, without a GPU: on the problems where every forward configuration was
// timed on an H200 (bench/heuristic_quality.py --forward-only, 2026-11-27; docs/benchmarks.md and
// the comments of src/cuda/fused/configs/forward.h), the plan takes the configuration that ran
// fastest. The small-window tiles (3d-small: 2x4x8 queries over 4x1x16 keys, 1d-small: 64 over
// 64) must win where they were measured to, and the large windows keep their own tiles.
// Builds without the CUDA kernels have no forward table: the test is skipped there (and says so).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fna/fna.h"

#if defined(FNA_WITH_CUDA_FUSED)
#include "cuda/fused/plan/fwd_choice.h"
#endif

namespace {

struct Case {
  const char* what;
  int64_t batch, heads;
  std::vector<int64_t> shape, kernel, dilation;
  std::vector<bool> causal;
  int64_t dim;
  const char* expect;                   // the configuration that ran fastest
  fna::DType dtype = fna::DType::bf16;
};

#if defined(FNA_WITH_CUDA_FUSED)
bool has_hopper_kernels() {
  for (const auto& e : fna::fused::forward_table())
    if (e.wgmma()) return true;
  return false;
}

std::string choice(const Case& c, const fna::detail::DeviceProps& dev) {
  fna::Problem p;
  p.rank = int(c.shape.size());
  p.batch = c.batch;
  p.heads = p.heads_kv = c.heads;
  p.dim = p.dim_v = c.dim;
  p.dtype = c.dtype;
  for (int a = 0; a < p.rank; ++a) {
    p.shape[a] = c.shape[a];
    p.kernel_size[a] = c.kernel[a];
    p.dilation[a] = c.dilation[a];
    p.is_causal[a] = c.causal[a];
  }
  const fna::Options opt;
  const fna::fused::FwdEntry* e = nullptr;
  const fna::Status st =
      fna::detail::heuristic_config(p, opt, fna::detail::geometry_of(p), dev, &e);
  if (!st.ok()) return "error: " + st.message;
  return e == nullptr ? std::string("(none)") : e->name();
}
#endif

TEST(ForwardChoice, TakesTheFastestMeasuredTilesOnHopper) {
#if !defined(FNA_WITH_CUDA_FUSED)
  GTEST_SKIP() << "built without the CUDA kernels: no forward configuration table";
#else
  if (!has_hopper_kernels()) GTEST_SKIP() << "built without the Hopper (sm_90a) kernels";
  // H200 and H100 SXM: compute capability 9.0, 132 SMs, 227 KiB of opt-in shared memory.
  const fna::detail::DeviceProps hopper{9, 0, 132, 227 * 1024};
  const std::vector<Case> cases = {
      {"3d-small", 2, 8, {16, 32, 32}, {3, 7, 7}, {1, 1, 1}, {false, false, false}, 64,
       "fna_fwd_sm90_bf16_d64_q2x4x8_kv4x1x16_w4"},
      {"3d-small dilation 2", 2, 8, {16, 32, 32}, {3, 7, 7}, {2, 2, 2}, {false, false, false}, 64,
       "fna_fwd_sm90_bf16_d64_q2x4x8_kv4x1x16_w4"},
      {"3d-small causal frames", 2, 8, {16, 32, 32}, {3, 7, 7}, {1, 1, 1}, {true, false, false},
       64, "fna_fwd_sm90_bf16_d64_q2x4x8_kv4x1x16_w4"},
      {"random-47 (seed 11)", 4, 2, {32, 32, 24}, {5, 9, 3}, {3, 1, 1}, {true, false, false}, 64,
       "fna_fwd_sm90_f16_d64_q1x8x8_kv1x4x16_w4", fna::DType::f16},
      {"1d-small", 8, 16, {8192}, {65}, {1}, {false}, 64, "fna_fwd_sm90_bf16_d64_q64_kv64_w4"},
      {"1d-small causal", 8, 16, {8192}, {65}, {1}, {true}, 64,
       "fna_fwd_sm90_bf16_d64_q64_kv64_w4"},
      {"1d-long", 1, 16, {32768}, {2048}, {1}, {false}, 128,
       "fna_fwd_sm90ws_bf16_d128_q192_kv64_w16"},
      {"2d-large", 1, 16, {256, 256}, {63, 63}, {1, 1}, {false, false}, 128,
       "fna_fwd_sm90ws_bf16_d128_q24x8_kv8x8_w16"},
      // Head dim 128, small windows: the strip forward's two-plane rings (H100, 2026-11-27,
      // bench/heuristic_quality.py --forward-only --dim 128): 2d-k3 0.415 ms against 0.634 for
      // the warp-specialized 24x8 tile, 2d-k7 0.454 against 0.635, nat-t at head dim 128 0.167
      // against 0.222; where it ran slower (dinat-t's 7-column dilation groups 0.412 against
      // 0.162; random-13, 96x128 with 13x7 windows, 0.030 against 0.022) the plan keeps the
      // tiled kernels.
      {"2d-k3", 1, 16, {256, 256}, {3, 3}, {1, 1}, {false, false}, 128,
       "fna_fwd_strip_bf16_d128_q8x16_b2x8_w8"},
      {"2d-k7", 1, 16, {256, 256}, {7, 7}, {1, 1}, {false, false}, 128,
       "fna_fwd_strip_bf16_d128_q8x16_b2x8_w8"},
      {"nat-t at head dim 128", 32, 3, {56, 56}, {7, 7}, {1, 1}, {false, false}, 128,
       "fna_fwd_strip_bf16_d128_q8x16_b2x8_w8"},
      {"dinat-t at head dim 128", 32, 3, {56, 56}, {7, 7}, {8, 8}, {false, false}, 128,
       "fna_fwd_sm90_bf16_d128_q8x16_kv8x8_w8"},
      // Head dim 64, rank 1: q192 / kv128 for windows of 1024 or more (H200, 2026-11-28, every
      // Hopper configuration timed): whole grid 2.118 ms against 2.468 for q128 / kv128, 2048 of
      // 32768 tokens 0.698 against 0.809; with 513 q64 / kv64 ran fastest (0.297 against 0.319).
      {"1-D whole grid at head dim 64", 1, 16, {16384}, {16384}, {1}, {false}, 64,
       "fna_fwd_sm90ws_bf16_d64_q192_kv128_w16"},
      {"1-D 2048 at head dim 64", 1, 16, {32768}, {2048}, {1}, {false}, 64,
       "fna_fwd_sm90ws_bf16_d64_q192_kv128_w16"},
      {"1-D 513 at head dim 64", 4, 16, {8192}, {513}, {1}, {false}, 64,
       "fna_fwd_sm90_bf16_d64_q64_kv64_w4"},
      // Head dim 64, 192-query tiles where no tile is masked (H200, 2026-11-28, every Hopper
      // configuration timed): a whole 16x32x32 grid 2.224 ms against 2.382 for the plain 2x8x8
      // tiles (ForwardChoice.NoMaskedTilesForQ192AtHeadDim64: not where tiles are masked).
      {"3-D whole grid at head dim 64", 1, 16, {16, 32, 32}, {16, 32, 32}, {1, 1, 1},
       {false, false, false}, 64, "fna_fwd_sm90ws_bf16_d64_q3x8x8_kv2x8x8_w16"},
      {"random-13 (seed 2026, head dim 128)", 1, 2, {96, 128}, {13, 7}, {1, 1}, {false, false},
       128, "fna_fwd_sm90ws_f16_d128_q24x8_kv8x8_w16", fna::DType::f16},
  };
  for (const Case& c : cases) EXPECT_EQ(choice(c, hopper), c.expect) << c.what;
#endif
}

// The 192-query tiles at head dim 64 (3x8x8 / 2x8x8) spill on their masked path and ran slower
// wherever windows mask tiles (H200, 2026-11-28: 3d-video's shape at head dim 64 30.66 ms against
// 29.96 for the plain 2x8x8 tiles, 9x9x9 1.416 against 1.210, 13x13x13 1.289 against 1.173), so
// the plan does not offer them there: not with windows smaller than an axis, a causal axis, or
// dilation groups the windows do not cover. Here the plan may take any other tile.
TEST(ForwardChoice, NoMaskedTilesForQ192AtHeadDim64) {
#if !defined(FNA_WITH_CUDA_FUSED)
  GTEST_SKIP() << "built without the CUDA kernels: no forward configuration table";
#else
  if (!has_hopper_kernels()) GTEST_SKIP() << "built without the Hopper (sm_90a) kernels";
  const fna::detail::DeviceProps hopper{9, 0, 132, 227 * 1024};
  const std::string q192 = "fna_fwd_sm90ws_bf16_d64_q3x8x8_kv2x8x8_w16";
  const std::vector<Case> masked = {
      {"3d-video's shape at head dim 64", 1, 24, {30, 48, 80}, {18, 24, 24}, {1, 1, 1},
       {false, false, false}, 64, ""},
      {"9x9x9", 2, 16, {16, 32, 32}, {9, 9, 9}, {1, 1, 1}, {false, false, false}, 64, ""},
      {"13x13x13", 1, 8, {32, 32, 32}, {13, 13, 13}, {1, 1, 1}, {false, false, false}, 64, ""},
      {"whole grid, causal frames", 1, 16, {16, 32, 32}, {16, 32, 32}, {1, 1, 1},
       {true, false, false}, 64, ""},
      {"whole grid but one axis", 1, 16, {16, 32, 32}, {16, 31, 32}, {1, 1, 1},
       {false, false, false}, 64, ""},
      {"dilation 2 on half the grid", 1, 16, {16, 32, 32}, {8, 16, 15}, {2, 2, 2},
       {false, false, false}, 64, ""},
  };
  for (const Case& c : masked) {
    const std::string got = choice(c, hopper);
    EXPECT_EQ(got.rfind("fna_fwd_", 0), 0u) << c.what << ": " << got;
    EXPECT_NE(got, q192) << c.what;
  }
  // Dilation whose windows cover their whole groups masks nothing: the tile is offered again.
  const Case covered{"dilation 2, windows over whole groups", 1, 16, {16, 32, 32}, {8, 16, 16},
                     {2, 2, 2}, {false, false, false}, 64, ""};
  EXPECT_EQ(choice(covered, hopper), q192) << covered.what;
#endif
}

}  // namespace
