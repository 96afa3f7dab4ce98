// The GPU test harness: device copies of a case's host tensors, one runner per operator comparing
// a CUDA backend against the CPU reference (SPEC.md section 4), and the error-path checks.
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
};

// The operators a case can run; `--filter` selects by family (fwd, bwd, qk, av).
enum class Op { forward, backward, qk_forward, qk_backward, av_forward, av_backward };
const char* op_name(Op op);
const char* op_family(Op op);
bool op_is_unfused(Op op);

struct RunConfig {
  fna::Backend backend = fna::Backend::cuda_naive;
  std::string config;      // Options::config (cuda-fused tile configuration), empty = heuristic
  bool use_stream = false; // run on a created stream instead of the legacy default stream
  // Backward only: ask for Options::deterministic and run twice; the results must be bitwise equal.
  bool deterministic = false;
  int ref_threads = 0;     // CPU reference threads (0 = all)
};

// Runs one operator of one case on the device and checks it against the reference.
Outcome run_case(Op op, const fna_test::Case& c, const RunConfig& rc);

// Error paths of the CUDA entry points (host pointers with device=cuda, wrong device index, ...).
// Each check is one test; returns the failures' descriptions (empty = all passed) and counts.
struct ErrorResults {
  int passed = 0;
  std::vector<std::string> failures;
};
ErrorResults run_error_paths(fna::Backend backend);

}  // namespace fna_gpu_test
