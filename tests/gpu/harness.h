// The GPU test harness: device copies of a case's host tensors, one runner per operator comparing
// a CUDA backend against the CPU reference (docs/semantics.md section 4), and the error-path checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fna/fna.h"
#include "support/check.h"
#include "support/problem.h"
#include "support/tensor.h"

namespace fna_gpu_test {

enum class Verdict { pass, fail, unsupported };

struct Outcome {
  Verdict verdict = Verdict::pass;
  std::string detail;  // failure: what went wrong (status message or per-tensor check lines)
  double ratio = -1;   // checked runs: max|out - ref| / bound of the worst tensor
};

// The operators a case can run; `--filter` selects by family (fwd, bwd, qk, av).
enum class Op { forward, backward, qk_forward, qk_backward, av_forward, av_backward };
const char* op_name(Op op);
const char* op_family(Op op);
bool op_is_unfused(Op op);

struct RunConfig {
  fna::Backend backend = fna::Backend::cuda_naive;
  std::string config;      // Options::config (cuda-fused tile configuration), empty = heuristic
  std::string backward_config;  // Options::backward_config, empty = the backward's heuristic
  bool use_stream = false; // run on a created stream instead of the legacy default stream
  // Backward only: ask for Options::deterministic and run twice; the results must be bitwise equal.
  bool deterministic = false;
  int ref_threads = 0;     // CPU reference threads (0 = all)
  // Options::allow_tf32: float32 cuda-fused forward with plain TF32 products, judged by the
  // low-precision rule against a naive TF32 computation (support/check.h, Tolerance::tf32)
  // instead of float32's 1e-5 relative bound.
  bool allow_tf32 = false;
  fna::Tuning tuning;      // Options::tuning of the device call
};

// Runs one operator of one case on the device and checks it against the reference.
Outcome run_case(Op op, const fna_test::Case& c, const RunConfig& rc);

// The float32 cuda-fused forward (op = forward) or backward (op = backward) of one case in both
// precisions must differ as the modes promise: the default (split TF32) within float32's bound,
// plain TF32 (allow_tf32) within its rule and measurably less accurate (relative error above 1e-5
// and 10x the split one's), so neither mode silently runs the other.
Outcome run_tf32_contrast(Op op, const fna_test::Case& c, const RunConfig& rc);

// Error paths of the CUDA entry points (host pointers with device=cuda, wrong device index, ...).
// Each check is one test; returns the failures' descriptions (empty = all passed) and counts.
struct ErrorResults {
  int passed = 0;
  std::vector<std::string> failures;
};
ErrorResults run_error_paths(fna::Backend backend);

}  // namespace fna_gpu_test
