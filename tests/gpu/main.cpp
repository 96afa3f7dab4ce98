// fna-gpu-test: every compiled CUDA backend against the CPU reference over the random sweep of the
// CPU tests (ranks 1-3, every SPEC parameter, dtypes, GQA, additional KV, odd shapes,
// non-contiguous layouts) plus fixed special cases and error paths. Outputs are poisoned (NaN)
// before each run. Problems a backend declines with Code::unsupported are counted apart.
// cuda-fused (and auto) forwards and backwards run the float32 cases a second time with
// Options::allow_tf32 (plain TF32, judged against a naive TF32 computation; rows "forward tf32",
// "backward tf32"), and one fixed problem
// checks, forward and backward, that the two float32 precisions really differ (split TF32
// float32-accurate, plain TF32 not). cuda-fused backwards also run every listed backward
// configuration (fna::fused_backward_configs) per rank, dtype and padded head dim (rows
// "backward configs"), alternating the atomic and deterministic dQ modes.
// The last line is always `N passed, N failed`; the exit code is non-zero on any failure.
//
//   fna-gpu-test [--backend cuda-naive|cuda-gemm|cuda-fused|auto] [--filter fwd,bwd,qk,av] [--cases N]
//                [--seed S] [--rank R] [--dim D] [--dim-v DV] [--dtype float16|bfloat16|float32]
//                [--config NAME] [--tuning K=V[,K=V..]] [--intensity I] [--only I] [--sanitize]
//                [--no-sweeps] [--verbose]
// e.g. `fna-gpu-test --backend cuda-fused --filter fwd --dtype bf16 --dim 64 --cases 100`;
// a failure prints its case index after '#': rerun it alone with the same flags plus --only I.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/launch_record.h"
#include "harness.h"

namespace {

using fna_gpu_test::Op;
using fna_gpu_test::Outcome;
using fna_gpu_test::Verdict;
using fna_test::Case;

struct Args {
  std::vector<fna::Backend> backends;
  std::string filter;   // comma list of op families; empty = all
  int cases = 40;       // random cases per rank
  uint64_t seed = 0;
  int rank = 0;         // 0 = all
  int64_t dim = 0;      // > 0: force D (and D_v unless --dim-v)
  int64_t dim_v = 0;
  std::vector<fna::DType> dtypes;
  std::string config;
  fna::Tuning tuning;        // --tuning: Options::tuning of the cuda-fused calls
  bool config_sweeps = true; // the sweeps over every listed configuration (not under --tuning)
  int intensity = 0;    // 0 = mixed (mostly 1, every fourth case 2)
  bool sanitize = false;
  bool verbose = false;
  int only = -1;        // >= 0: run only this case index (as printed after '#' on a failure)
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "fna-gpu-test: %s\nusage: fna-gpu-test [--backend NAME] [--filter fwd,bwd,qk,av] "
               "[--cases N] [--seed S] [--rank R] [--dim D] [--dim-v DV] [--dtype NAME] "
               "[--config NAME] [--tuning K=V,..] [--intensity I] [--only I] [--sanitize] "
               "[--no-sweeps] [--verbose]\n",
               msg);
  std::printf("0 passed, 1 failed\n");
  std::exit(2);
}

bool parse_dtype(const std::string& s, fna::DType* out) {
  const fna::DType all[] = {fna::DType::f32, fna::DType::f16, fna::DType::bf16};
  for (fna::DType t : all) {
    if (s == fna::dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  if (s == "f32" || s == "fp32") *out = fna::DType::f32;
  else if (s == "f16" || s == "fp16" || s == "half") *out = fna::DType::f16;
  else if (s == "bf16") *out = fna::DType::bf16;
  else return false;
  return true;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + k).c_str());
      return argv[++i];
    };
    if (k == "--backend") {
      fna::Backend b;
      const fna::Status st = fna::parse_backend(value(), &b);
      if (!st.ok()) usage(st.message.c_str());
      a.backends.push_back(b);
    } else if (k == "--filter") {
      a.filter = value();
    } else if (k == "--cases") {
      a.cases = std::atoi(value().c_str());
    } else if (k == "--seed") {
      a.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (k == "--rank") {
      a.rank = std::atoi(value().c_str());
    } else if (k == "--dim") {
      a.dim = std::atoll(value().c_str());
    } else if (k == "--dim-v") {
      a.dim_v = std::atoll(value().c_str());
    } else if (k == "--dtype") {
      fna::DType t;
      const std::string v = value();
      if (!parse_dtype(v, &t)) usage(("unknown dtype " + v).c_str());
      a.dtypes.push_back(t);
    } else if (k == "--config") {
      a.config = value();
    } else if (k == "--tuning") {
      // Options::tuning for the cuda-fused calls (K=V[,K=V..]); the configuration sweeps, which
      // name configurations, are skipped under it.
      const fna::Status st = fna::parse_tuning(value(), &a.tuning);
      if (!st.ok()) usage(st.message.c_str());
      a.config_sweeps = false;
    } else if (k == "--intensity") {
      a.intensity = std::atoi(value().c_str());
    } else if (k == "--only") {
      a.only = std::atoi(value().c_str());
    } else if (k == "--sanitize") {
      a.sanitize = true;
    } else if (k == "--no-sweeps") {
      a.config_sweeps = false;  // random cases only (the racecheck / synccheck runs)
    } else if (k == "--verbose" || k == "-v") {
      a.verbose = true;
    } else {
      usage(("unknown argument " + k).c_str());
    }
  }
  if (a.dtypes.empty()) a.dtypes = {fna::DType::f32, fna::DType::f16, fna::DType::bf16};
  if (a.backends.empty()) {
    for (fna::Backend b :
         {fna::Backend::cuda_naive, fna::Backend::cuda_gemm, fna::Backend::cuda_fused})
      if (fna::backend_compiled(b)) a.backends.push_back(b);
  }
  if (a.sanitize && a.cases == 40) a.cases = 3;
  return a;
}

bool family_selected(const Args& a, Op op) {
  if (a.filter.empty()) return true;
  const std::string f = "," + a.filter + ",";
  return f.find(std::string(",") + fna_gpu_test::op_family(op) + ",") != std::string::npos ||
         f.find(std::string(",") + fna_gpu_test::op_name(op) + ",") != std::string::npos;
}

// Hand-made cases for the special cases of docs/semantics.md section 1 and the shapes around them.
// The configuration sweeps' random problems: past one 128-row tile on the first axis, several
// tiles per axis in 2-D / 3-D.
fna_test::RandomLimits sweep_limits(fna::DType dtype) {
  fna_test::RandomLimits lim;
  lim.max_axis[0] = 130;
  lim.max_axis[1] = 20;
  lim.max_axis[2] = 8;
  lim.dtypes = {dtype};
  return lim;
}

// Every (rank, dtype, dim, dim_v) a configuration sweep visits: ranks 1-3, the selected dtypes,
// `dims` (or --dim), dim_v = dim (or --dim-v); --rank narrows the ranks.
template <class F>
void for_each_sweep_shape(const Args& a, const std::vector<int64_t>& dims, F f) {
  for (int rank = 1; rank <= 3; ++rank) {
    if (a.rank != 0 && rank != a.rank) continue;
    for (fna::DType dtype : a.dtypes)
      for (int64_t dim : a.dim > 0 ? std::vector<int64_t>{a.dim} : dims)
        f(rank, dtype, dim, a.dim_v > 0 ? a.dim_v : dim);
  }
}

std::vector<Case> fixed_cases(fna::DType dtype) {
  std::vector<Case> out;
  auto add = [&](int rank, std::vector<int64_t> shape, std::vector<int64_t> kernel,
                 std::vector<int64_t> dilation, std::vector<int64_t> stride,
                 std::vector<bool> causal, int64_t H, int64_t Hkv, int64_t D, int64_t Dv,
                 int64_t n_add, fna_test::Layout layout) {
    Case c;
    fna::Problem& p = c.p;
    p.rank = rank;
    p.batch = 1 + static_cast<int64_t>(out.size() % 2);
    for (int i = 0; i < rank; ++i) {
      p.shape[i] = shape[i];
      p.kernel_size[i] = kernel[i];
      p.dilation[i] = dilation.empty() ? 1 : dilation[i];
      p.stride[i] = stride.empty() ? 1 : stride[i];
      p.is_causal[i] = causal.empty() ? false : causal[i];
    }
    p.heads = H;
    p.heads_kv = Hkv;
    p.dim = D;
    p.dim_v = Dv;
    p.num_additional = n_add;
    p.dtype = dtype;
    c.layout = layout;
    c.seed = 0xf1eed000u + out.size() * 131 + static_cast<uint64_t>(dtype);
    out.push_back(c);
  };
  using L = fna_test::Layout;
  add(1, {17}, {17}, {}, {}, {}, 2, 2, 32, 32, 0, L::contiguous);            // self attention
  add(2, {5, 7}, {5, 7}, {}, {}, {}, 2, 1, 16, 16, 0, L::heads_first);       // 2-D self, MQA
  add(1, {19}, {1}, {}, {}, {}, 1, 1, 8, 24, 0, L::contiguous);              // K = 1
  add(1, {33}, {33}, {}, {}, {true}, 2, 2, 16, 16, 0, L::padded);            // causal, K = L
  add(1, {24}, {6}, {}, {6}, {}, 2, 2, 32, 32, 0, L::contiguous);            // blocked
  add(2, {12, 8}, {4, 4}, {}, {4, 4}, {}, 3, 1, 16, 8, 0, L::mixed);         // blocked 2-D
  add(1, {23}, {5}, {3}, {2}, {}, 2, 1, 24, 24, 2, L::contiguous);           // dilation 3 | 23
  add(2, {9, 11}, {3, 4}, {2, 2}, {1, 3}, {false, true}, 4, 2, 8, 16, 3, L::heads_first);
  add(3, {6, 5, 7}, {3, 5, 2}, {1, 1, 3}, {2, 1, 1}, {true, false, false}, 2, 2, 16, 16, 1,
      L::padded);
  add(3, {4, 4, 4}, {4, 4, 4}, {}, {}, {true, true, true}, 1, 1, 64, 64, 0, L::contiguous);
  add(1, {70}, {13}, {}, {3}, {}, 2, 1, 64, 64, 0, L::contiguous);           // past a 64-tile
  add(2, {17, 9}, {7, 3}, {2, 1}, {1, 3}, {}, 2, 2, 128, 128, 0, L::contiguous);
  add(2, {16, 16}, {5, 5}, {}, {}, {true, false}, 4, 4, 64, 32, 2, L::contiguous);
  // Around the fused kernels' tile edges (64 / 128 queries in 1-D, 8x8 / 16x8 in 2-D, 4x4x4 in
  // 3-D): one below, at, and one past a tile, with windows at the borders.
  add(1, {63}, {63}, {}, {}, {}, 2, 2, 64, 64, 0, L::contiguous);
  add(1, {64}, {9}, {}, {}, {true}, 2, 1, 64, 64, 0, L::contiguous);
  add(1, {65}, {8}, {}, {2}, {}, 1, 1, 128, 128, 1, L::heads_first);
  add(1, {129}, {31}, {2}, {}, {}, 2, 2, 32, 32, 0, L::contiguous);
  add(1, {127}, {127}, {}, {}, {true}, 1, 1, 64, 64, 0, L::padded);
  add(2, {15, 17}, {7, 9}, {}, {}, {}, 2, 2, 64, 64, 0, L::contiguous);
  add(2, {16, 16}, {16, 16}, {}, {}, {}, 2, 1, 32, 32, 0, L::contiguous);
  add(2, {17, 33}, {5, 11}, {1, 3}, {1, 2}, {false, true}, 2, 2, 64, 64, 0, L::mixed);
  add(3, {8, 8, 8}, {3, 3, 3}, {}, {}, {}, 2, 2, 64, 64, 0, L::contiguous);
  add(3, {9, 5, 17}, {4, 5, 6}, {2, 1, 2}, {2, 1, 3}, {false, false, true}, 2, 1, 32, 64, 0,
      L::contiguous);
  add(3, {7, 9, 8}, {7, 3, 8}, {}, {}, {true, true, false}, 1, 1, 128, 128, 2, L::heads_first);
  // Head dims above 128 (padded to 256: on Hopper the warp-specialized dK / dV kernel, two
  // warpgroups splitting the head dim; the sm80 kernel runs dK and dV as two passes), also
  // with D != D_v on either side and a dim that is no multiple of 16.
  add(1, {70}, {13}, {}, {3}, {}, 2, 1, 256, 256, 1, L::contiguous);
  add(2, {11, 13}, {5, 7}, {2, 1}, {}, {true, false}, 2, 2, 160, 192, 0, L::heads_first);
  add(3, {5, 6, 7}, {3, 3, 5}, {}, {}, {false, false, true}, 2, 1, 256, 64, 0, L::padded);
  add(2, {9, 20}, {9, 7}, {}, {1, 2}, {}, 2, 1, 64, 256, 2, L::contiguous);
  add(1, {40}, {9}, {}, {}, {}, 1, 1, 136, 200, 0, L::mixed);
  return out;
}

// The problem of the TF32 contrast check: 2-D, 7x7 windows, head dim 64, float32.
Case tf32_contrast_case() {
  Case c;
  fna::Problem& p = c.p;
  p.rank = 2;
  p.batch = 2;
  p.shape[0] = 16;
  p.shape[1] = 24;
  p.kernel_size[0] = p.kernel_size[1] = 7;
  p.heads = p.heads_kv = 2;
  p.dim = p.dim_v = 64;
  p.dtype = fna::DType::f32;
  c.layout = fna_test::Layout::contiguous;
  c.with_lse = true;
  c.seed = 0x7f32c0de;
  return c;
}

std::vector<Case> make_cases(const Args& a) {
  std::vector<Case> cases;
  fna_test::RandomLimits lim;
  lim.dtypes = a.dtypes;
  for (fna::DType t : a.dtypes) {
    std::vector<Case> f = fixed_cases(t);
    if (a.sanitize) f.resize(4);  // small ones: memcheck is slow
    for (Case& c : f)
      if (a.rank == 0 || c.p.rank == a.rank) cases.push_back(c);
  }
  for (int rank = 1; rank <= 3; ++rank) {
    if (a.rank != 0 && rank != a.rank) continue;
    for (int i = 0; i < a.cases; ++i) {
      const int intensity = a.intensity > 0 ? a.intensity : (i % 4 == 3 ? 2 : 1);
      cases.push_back(fna_test::random_case(a.seed * 1000003ull + i, rank, intensity, lim));
    }
  }
  for (Case& c : cases) {
    if (a.dim > 0) c.p.dim = c.p.dim_v = a.dim;
    if (a.dim_v > 0) c.p.dim_v = a.dim_v;
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  // No device at all: exit 77, which ctest (SKIP_RETURN_CODE) reports as skipped.
  int device_count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&device_count);
  if (count_err != cudaSuccess || device_count == 0) {
    std::printf("fna-gpu-test: no CUDA device visible: skipped (%s)\n",
                count_err != cudaSuccess ? cudaGetErrorString(count_err) : "0 devices");
    return 77;
  }
  const Args args = parse(argc, argv);
  int passed = 0, failed = 0, unsupported = 0;
  if (!fna::cuda_available()) {
    std::printf("FAIL: no CUDA device is visible (fna::cuda_available() is false)\n");
    std::printf("0 passed, 1 failed\n");
    return 1;
  }
  if (args.backends.empty()) {
    std::printf("FAIL: no CUDA backend is compiled into this build\n0 passed, 1 failed\n");
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Case> cases = make_cases(args);
  const Op ops[] = {Op::forward, Op::backward, Op::qk_forward, Op::qk_backward, Op::av_forward,
                    Op::av_backward};
  // per backend/op: {passed, failed, unsupported}
  std::map<std::string, std::array<int, 3>> tally;
  std::map<std::string, double> worst_ratio;  // per row: the largest max|out-ref| / bound
  std::map<std::string, int> unsupported_reasons;
  // Counts one outcome in row `row` of the tally; true when it failed (the caller prints it).
  auto count = [&](const std::string& row, const Outcome& o) {
    auto& t = tally[row];
    if (o.verdict != Verdict::unsupported)
      worst_ratio[row] = std::max(worst_ratio[row], o.ratio);
    if (o.verdict == Verdict::pass) {
      ++passed;
      ++t[0];
      return false;
    }
    if (o.verdict == Verdict::unsupported) {
      ++unsupported;
      ++t[2];
      ++unsupported_reasons[o.detail];
      return false;
    }
    ++failed;
    ++t[1];
    return true;
  };

  for (fna::Backend backend : args.backends) {
    if (!fna::backend_compiled(backend) && backend != fna::Backend::automatic) {
      std::printf("FAIL [%s]: backend not compiled into this build\n", fna::backend_name(backend));
      ++failed;
      continue;
    }
    fna_gpu_test::RunConfig rc;
    rc.backend = backend;
    rc.config = args.config;
    const fna::Tuning base_tuning = backend == fna::Backend::cuda_fused ? args.tuning : fna::Tuning{};
    rc.tuning = base_tuning;
    // The Hopper backward kernels accumulate dQ by atomics only.
    const bool atomic_only = args.tuning.bwd_kernel == fna::BwdKernel::sm90 ||
                             args.tuning.bwd_kernel == fna::BwdKernel::sm90ws;
    const fna_gpu_test::ErrorResults er = fna_gpu_test::run_error_paths(backend);
    passed += er.passed;
    failed += static_cast<int>(er.failures.size());
    for (const std::string& f : er.failures) std::printf("FAIL %s\n", f.c_str());
    const bool fused_like =
        backend == fna::Backend::cuda_fused || backend == fna::Backend::automatic;
    bool any_f32 = false;
    for (const Case& c : cases) any_f32 = any_f32 || c.p.dtype == fna::DType::f32;
    for (Op op : ops) {
      if (!family_selected(args, op)) continue;
      // The fused backend has no unfused operators (API contract, checked in the error paths).
      if (fna_gpu_test::op_is_unfused(op) && backend == fna::Backend::cuda_fused) continue;
      // Pass 1 (forward / backward of cuda-fused / auto only): the float32 cases again with
      // allow_tf32.
      const int passes =
          (op == Op::forward || op == Op::backward) && fused_like && any_f32 ? 2 : 1;
      for (int pass = 0; pass < passes; ++pass) {
        rc.allow_tf32 = pass == 1;
        const std::string row = std::string(fna::backend_name(backend)) + " " +
                                fna_gpu_test::op_name(op) + (pass == 1 ? " tf32" : "");
        auto& t = tally[row];
        double& worst = worst_ratio[row];
        for (size_t i = 0; i < cases.size(); ++i) {
          if (args.only >= 0 && static_cast<int>(i) != args.only) continue;
          if (rc.allow_tf32 && cases[i].p.dtype != fna::DType::f32) continue;
          rc.use_stream = i % 2 == 1;
          rc.deterministic = i % 4 == 0 && !atomic_only;
          // Every third case makes cuda-naive's attention (forward / backward) split its
          // workspace into one (batch, kv head) pair per chunk, the path large problems take (a
          // tuning field of explicit cuda-naive calls; the unfused operators take no tuning).
          const bool naive = backend == fna::Backend::cuda_naive && !fna_gpu_test::op_is_unfused(op);
          rc.tuning = base_tuning;
          rc.tuning.naive_workspace_bytes = naive && i % 3 == 2 ? 1 : 0;
          const Outcome o = fna_gpu_test::run_case(op, cases[i], rc);
          if (o.verdict != Verdict::unsupported) worst = std::max(worst, o.ratio);
          if (o.verdict == Verdict::pass) {
            ++passed;
            ++t[0];
            if (args.verbose)
              std::printf("ok   [%s] %s #%zu %s\n", fna::backend_name(backend),
                          fna_gpu_test::op_name(op), i, cases[i].str().c_str());
          } else if (o.verdict == Verdict::unsupported) {
            ++unsupported;
            ++t[2];
            ++unsupported_reasons[o.detail];
          } else {
            ++failed;
            ++t[1];
            std::printf("FAIL [%s] %s%s #%zu %s\n%s\n", fna::backend_name(backend),
                        fna_gpu_test::op_name(op), rc.allow_tf32 ? " (allow_tf32)" : "", i,
                        cases[i].str().c_str(), o.detail.c_str());
            std::fflush(stdout);
          }
        }
      }
      rc.allow_tf32 = false;
      rc.tuning = base_tuning;
    }
    // (Not with --config: the contrast problem has its own rank and head dim.)
    for (Op op : {Op::forward, Op::backward}) {
      if (!(fused_like && any_f32 && family_selected(args, op) && args.only < 0 &&
            args.config.empty() && args.config_sweeps))
        continue;
      const Outcome o = fna_gpu_test::run_tf32_contrast(op, tf32_contrast_case(), rc);
      const std::string what = std::string("tf32 contrast ") + fna_gpu_test::op_name(op);
      auto& t = tally[std::string(fna::backend_name(backend)) + " " + what];
      if (o.verdict == Verdict::pass) {
        ++passed;
        ++t[0];
        std::printf("%s [%s]: %s\n", what.c_str(), fna::backend_name(backend), o.detail.c_str());
      } else if (o.verdict == Verdict::unsupported) {
        ++unsupported;
        ++t[2];
        ++unsupported_reasons[o.detail];
      } else {
        ++failed;
        ++t[1];
        std::printf("FAIL [%s] %s: %s\n", fna::backend_name(backend), what.c_str(),
                    o.detail.c_str());
      }
    }
    // Every listed forward configuration (mma.sync and, on compute capability 9.0, wgmma), on
    // three random cases of its rank and head dim; float32 also with allow_tf32. A Hopper-only
    // configuration on another device must answer `unsupported`, which is counted as such.
    if (backend == fna::Backend::cuda_fused && family_selected(args, Op::forward) &&
        args.only < 0 && args.config.empty() && args.config_sweeps) {
      const std::string row = "cuda-fused forward configs";
      tally[row];  // the row is listed even when every case is skipped
      int n = 0;
      for_each_sweep_shape(args, {32, 56, 128, 200}, [&](int rank, fna::DType dtype, int64_t dim,
                                                         int64_t dim_v) {
        const fna_test::RandomLimits lim = sweep_limits(dtype);
        const std::vector<std::string> names =
            fna::fused_configs(rank, dtype, std::max(dim, dim_v));
        for (size_t j = 0; j < names.size(); ++j) {
          for (int rep = 0; rep < 3; ++rep, ++n) {
            Case c =
                fna_test::random_case(args.seed * 1000003ull + 0xfc0f00 + 89 * n, rank, 1, lim);
            c.p.dim = dim;
            c.p.dim_v = dim_v;
            rc.config = names[j];
            rc.use_stream = false;
            for (int pass = 0; pass < (dtype == fna::DType::f32 ? 2 : 1); ++pass) {
              rc.allow_tf32 = pass == 1;
              Outcome o = fna_gpu_test::run_case(Op::forward, c, rc);
              // The plan the call consumed is the named configuration's.
#if defined(FNA_WITH_CUDA_FUSED)
              if (o.verdict == Verdict::pass && fna::detail::last_launch().forward != names[j]) {
                o.verdict = Verdict::fail;
                o.detail = "launched " + fna::detail::last_launch().forward;
              }
#endif
              if (count(row, o)) {
                std::printf("FAIL [cuda-fused] config=%s%s %s\n%s\n", names[j].c_str(),
                            rc.allow_tf32 ? " (allow_tf32)" : "", c.str().c_str(),
                            o.detail.c_str());
                std::fflush(stdout);
              }
            }
          }
        }
      });
      rc.config.clear();
      rc.allow_tf32 = false;
    }
    // The box and strip forwards (rank 2, 16-bit, head dims up to 64, small windows, no
    // additional keys), forced by name on random problems within those limits: axes up to 40
    // for the box forward (several CTA tiles and warp boxes per axis, ends that cut boxes), up to
    // 100 for the strip forward (its ring of 32-64 halo rows wraps, several strips, row segments
    // when batch x heads is small), kernels up to 13 with any dilation, stride and causal flag,
    // GQA, strided layouts, D != D_v. A case outside the kernel's limits (a stride that spreads
    // a box's windows) answers `unsupported`, counted as such.
    for (const char* family : {"box", "strip"})
    if (backend == fna::Backend::cuda_fused && family_selected(args, Op::forward) &&
        args.only < 0 && args.config.empty() && args.config_sweeps && (args.rank == 0 || args.rank == 2)) {
      const bool strip = std::string(family) == "strip";
      const std::string row = std::string("cuda-fused ") + family + " forward";
      tally[row];
      int n = 0;
      for (fna::DType dtype : args.dtypes) {
        if (dtype == fna::DType::f32) continue;
        // Head dim 32's list holds the head-dim-32 strips and the head-dim-64 configurations.
        std::vector<std::string> boxes;
        for (const std::string& name : fna::fused_configs(2, dtype, 32))
          if (name.rfind(std::string("fna_fwd_") + family + "_", 0) == 0) boxes.push_back(name);
        if (boxes.empty()) continue;
        fna_test::RandomLimits lim;
        lim.max_axis[1] = strip ? 100 : 40;
        lim.max_dim = 64;
        lim.allow_additional = false;
        lim.dtypes = {dtype};
        for (int i = 0; i < 40 * static_cast<int>(boxes.size()); ++i, ++n) {
          Case c = fna_test::random_case(args.seed * 1000003ull + (strip ? 0x57e100 : 0xb0c500) + 61 * n,
                                         2, 1, lim);
          for (int a = 0; a < 2; ++a) {
            c.p.kernel_size[a] = std::min<int64_t>(c.p.kernel_size[a], 1 + (n * 7 + a * 5) % 13);
            c.p.stride[a] = std::min(c.p.stride[a], c.p.kernel_size[a]);
          }
          const std::string& box = boxes[i % boxes.size()];
          // Head dims: multiples of 8 (the 16-byte copies' rule), 8 to the configuration's 32 or
          // 64.
          const int64_t dmax = box.find("_d32_") != std::string::npos ? 32 : 64;
          auto round8 = [dmax](int64_t d) {
            return std::min<int64_t>(dmax, std::max<int64_t>(8, (d + 7) / 8 * 8));
          };
          c.p.dim = round8(c.p.dim);
          c.p.dim_v = round8(c.p.dim_v);
          if (args.dim > 0) c.p.dim = c.p.dim_v = round8(args.dim);
          rc.config = box;
          rc.use_stream = n % 2 == 1;
          const Outcome o = fna_gpu_test::run_case(Op::forward, c, rc);
          if (count(row, o)) {
            std::printf("FAIL [cuda-fused] config=%s %s\n%s\n", box.c_str(), c.str().c_str(),
                        o.detail.c_str());
            std::fflush(stdout);
          }
        }
      }
      rc.config.clear();
    }
    // Every listed backward configuration, on a random case of its rank and head dim (padded
    // 64, 128, 256; --rank / --dim / --dtype narrow it), float32 also with allow_tf32.
    if (backend == fna::Backend::cuda_fused && family_selected(args, Op::backward) &&
        args.only < 0 && args.config.empty() && args.config_sweeps) {
      const std::string row = "cuda-fused backward configs";
      tally[row];  // the row is listed even when every case is skipped
      int n = 0;
      for_each_sweep_shape(args, {48, 128, 176}, [&](int rank, fna::DType dtype, int64_t dim,
                                                     int64_t dim_v) {
        const fna_test::RandomLimits lim = sweep_limits(dtype);
        const std::vector<std::string> names =
            fna::fused_backward_configs(rank, dtype, std::max(dim, dim_v));
        for (size_t j = 0; j < names.size(); ++j) {
          Case c =
              fna_test::random_case(args.seed * 1000003ull + 0xbc0f00 + 97 * n, rank, 1, lim);
          c.p.dim = dim;
          c.p.dim_v = dim_v;
          rc.backward_config = names[j];
          // The Hopper families accumulate dQ by atomics only (deterministic is sm80's).
          rc.deterministic = n % 2 == 1 && names[j].rfind("fna_bwd_sm80_", 0) == 0;
          rc.use_stream = false;
          for (int pass = 0; pass < (dtype == fna::DType::f32 ? 2 : 1); ++pass) {
            rc.allow_tf32 = pass == 1;
            const Outcome o = fna_gpu_test::run_case(Op::backward, c, rc);
            if (count(row, o)) {
              std::printf("FAIL [cuda-fused] backward_config=%s%s%s %s\n%s\n", names[j].c_str(),
                          rc.allow_tf32 ? " (allow_tf32)" : "",
                          rc.deterministic ? " (deterministic)" : "", c.str().c_str(),
                          o.detail.c_str());
              std::fflush(stdout);
            }
          }
          ++n;
        }
      });
      rc.backward_config.clear();
      rc.allow_tf32 = false;
      rc.deterministic = false;
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("---- %zu cases per op, %.1f s ----\n", cases.size(), secs);
  for (const auto& kv : tally)
    std::printf("%-24s %4d passed %4d failed %4d unsupported   max err/bound %.3g\n",
                kv.first.c_str(), kv.second[0], kv.second[1], kv.second[2],
                worst_ratio.count(kv.first) ? worst_ratio[kv.first] : 0.0);
  int shown = 0;
  for (const auto& kv : unsupported_reasons) {
    if (shown++ == 8) {
      std::printf("  (%zu more unsupported reasons)\n", unsupported_reasons.size() - 8);
      break;
    }
    std::printf("  unsupported x%d: %s\n", kv.second, kv.first.c_str());
  }
  std::printf("%d unsupported\n", unsupported);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
