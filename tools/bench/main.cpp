// fna-bench: times forward and backward of one problem (or a sweep) on each backend and prints a
// table: backend, forward ms, backward ms, effective TFLOP/s (docs/semantics.md section 3), max error against
// the reference on a sample of queries, peak memory.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "buffers.h"
#include "core/neighborhood.h"

namespace fna_bench {
namespace {

#ifndef FNA_GIT_COMMIT
#define FNA_GIT_COMMIT "unknown"  // set by CMake at configure time (git rev-parse of the source tree)
#endif

// What a result was measured with: printed once as the output's header and written to every
// --json / --csv record.
struct RunInfo {
  std::string version = fna::version();
  std::string commit = FNA_GIT_COMMIT;
  std::string date;    // UTC, ISO 8601
  std::string device;  // device_description
};
RunInfo g_info;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Attended (query, key) pairs summed over all queries of one (batch, head): N*W for non-causal NA,
// fewer with causal windows; plus N * N_add for additional keys.
double attended_pairs(const fna::Problem& p) {
  double total = 1.0;
  for (int ax = 0; ax < p.rank; ++ax) {
    fna::nbr::Axis a{static_cast<int>(p.shape[ax]), static_cast<int>(p.kernel_size[ax]),
                     static_cast<int>(p.dilation[ax]), static_cast<int>(p.stride[ax]),
                     p.is_causal[ax]};
    double axis_sum = 0;
    for (int g = 0; g < a.dilation; ++g) {
      const int lg = fna::nbr::group_length(a, g);
      for (int i = 0; i < lg; ++i) axis_sum += fna::nbr::window_size(a, lg, i);
    }
    total *= axis_sum;  // the neighborhood is a product over axes, so the pair count factorizes
  }
  return total + static_cast<double>(p.tokens()) * static_cast<double>(p.num_additional);
}

double forward_flops(const fna::Problem& p) {
  return 2.0 * p.batch * p.heads * attended_pairs(p) * static_cast<double>(p.dim + p.dim_v);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The CPU worker threads the library runs with for Options::num_threads = `requested`: 0 means the
// process-wide count, fna::get_num_threads() (the cores available to the process; src/cpu/parallel.h
// resolve_threads further caps the count at the number of tasks of a call, which this does not).
int resolved_threads(int requested) {
  const int n = requested > 0 ? requested : fna::get_num_threads();
  return n < 1 ? 1 : n;
}

std::string problem_string(const fna::Problem& p) {
  auto axes = [&](const int64_t* v) {
    std::string s;
    for (int i = 0; i < p.rank; ++i) s += (i ? "x" : "") + std::to_string(v[i]);
    return s;
  };
  std::string causal;
  for (int i = 0; i < p.rank; ++i) causal += (i ? "x" : "") + std::to_string(p.is_causal[i] ? 1 : 0);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "B=%lld H=%lld/%lld shape=%s D=%lld/%lld kernel=%s dilation=%s stride=%s causal=%s "
                "add=%lld %s",
                (long long)p.batch, (long long)p.heads, (long long)p.heads_kv,
                axes(p.shape).c_str(), (long long)p.dim, (long long)p.dim_v,
                axes(p.kernel_size).c_str(), axes(p.dilation).c_str(), axes(p.stride).c_str(),
                causal.c_str(), (long long)p.num_additional, fna::dtype_name(p.dtype));
  return buf;
}

struct Result {
  std::string backend;
  double fwd_min = NAN, fwd_max = NAN, bwd_min = NAN, bwd_max = NAN;  // spread over --repeats
  double fwd_ms = NAN, bwd_ms = NAN, fwd_tflops = NAN, bwd_tflops = NAN, total_tflops = NAN;
  double max_err = NAN, err_bound = NAN;
  double peak_mb = NAN;   // this backend's runs only (PeakMemory in buffers.h)
  int repeats = 0;         // timed calls behind each median (the reference backend: 1)
  bool peak_exact = true;  // CPU: a true peak (VmHWM reset), not an after - before difference
  std::string error;
};

Result run_backend(const BenchConfig& cfg, fna::Backend backend, Buffers& buf,
                   const ReferenceSample* ref) {
  const fna::Problem& p = cfg.problem;
  Result r;
  r.backend = fna::backend_name(backend);
  fna::Options opt;
  opt.backend = backend;
  opt.device = cfg.device;
  opt.num_threads = cfg.threads;
  // The tile configuration names a cuda-fused kernel; other backends run without it.
  if (backend == fna::Backend::cuda_fused) {
    opt.config = cfg.config;
    opt.backward_config = cfg.backward_config;
  }
  opt.allow_tf32 = cfg.allow_tf32;
  opt.deterministic = cfg.deterministic;
  opt.tuning = cfg.tuning;
  const int repeats = backend == fna::Backend::reference ? 1 : cfg.repeats;
  const int warmup = backend == fna::Backend::reference ? 0 : cfg.warmup;
  r.repeats = repeats;

  PeakMemory mem(cfg.device);
  mem.start();
  std::vector<double> times;
  // --mode bwd: one untimed forward produces O and LSE for the backward.
  const int fwd_runs = cfg.forward ? warmup + repeats : 1;
  for (int it = 0; it < fwd_runs; ++it) {
    buf.poison_outputs();
    Timer t(cfg.device);
    fna::Status st = fna::forward(p, buf.forward_args(), opt);
    const double ms = t.stop_ms();
    if (!st.ok()) {
      r.error = st.message;
      return r;
    }
    if (cfg.forward && it >= warmup) times.push_back(ms);
  }
  const double flops = forward_flops(p);
  if (cfg.forward) {
    r.fwd_ms = median(times);
    r.fwd_min = *std::min_element(times.begin(), times.end());
    r.fwd_max = *std::max_element(times.begin(), times.end());
    r.fwd_tflops = flops / (r.fwd_ms * 1e-3) / 1e12;
  }
  if (ref != nullptr) {
    ErrorStat e = buf.compare_forward(*ref);
    r.max_err = e.max_err;
    r.err_bound = e.scale;
  }
  if (cfg.backward) {
    times.clear();
    for (int it = 0; it < warmup + repeats; ++it) {
      buf.poison_grads();
      Timer t(cfg.device);
      fna::Status st = fna::backward(p, buf.backward_args(), opt);
      const double ms = t.stop_ms();
      if (!st.ok()) {
        r.error = "backward: " + st.message;
        break;
      }
      if (it >= warmup) times.push_back(ms);
    }
    if (!times.empty()) {
      r.bwd_ms = median(times);
      r.bwd_min = *std::min_element(times.begin(), times.end());
      r.bwd_max = *std::max_element(times.begin(), times.end());
      r.bwd_tflops = 2.5 * flops / (r.bwd_ms * 1e-3) / 1e12;
      if (cfg.forward) r.total_tflops = 3.5 * flops / ((r.fwd_ms + r.bwd_ms) * 1e-3) / 1e12;
    }
  }
  r.peak_mb = mem.stop_mb();
  r.peak_exact = mem.exact();
  return r;
}

void print_header() {
  std::printf("%-11s %10s %10s %9s %9s %9s %10s %8s %9s %17s %17s\n", "backend", "fwd ms", "bwd ms",
              "fwd TF/s", "bwd TF/s", "f+b TF/s", "max err", "(scale)", "peak MB", "fwd min/max ms", "bwd min/max ms");
}

// One table cell: `v` printed with `spec` (a printf conversion) in `width` columns, "-" where it
// was not measured (NaN: e.g. the forward under --mode bwd).
std::string cell(const char* spec, int width, double v) {
  char buf[64], out[80];
  if (std::isfinite(v)) std::snprintf(buf, sizeof buf, spec, v);
  else std::snprintf(buf, sizeof buf, "-");
  std::snprintf(out, sizeof out, " %*s", width, buf);
  return out;
}

// "min/max" of a time's repeats, or "-".
std::string spread(double lo, double hi) {
  char buf[64];
  if (!std::isfinite(lo) || !std::isfinite(hi)) return cell("%s", 17, NAN);
  std::snprintf(buf, sizeof buf, "%.3f/%.3f", lo, hi);
  char out[80];
  std::snprintf(out, sizeof out, " %17s", buf);
  return out;
}

void print_result(const Result& r) {
  if (!r.error.empty()) {
    std::printf("%-11s %s\n", r.backend.c_str(), r.error.c_str());
    return;
  }
  std::printf("%-11s%s%s%s%s%s%s%s%s%s%s\n", r.backend.c_str(), cell("%.3f", 10, r.fwd_ms).c_str(),
              cell("%.3f", 10, r.bwd_ms).c_str(), cell("%.4f", 9, r.fwd_tflops).c_str(),
              cell("%.4f", 9, r.bwd_tflops).c_str(), cell("%.4f", 9, r.total_tflops).c_str(),
              cell("%.2e", 10, r.max_err).c_str(), cell("%.1e", 8, r.err_bound).c_str(),
              cell("%.1f", 9, r.peak_mb).c_str(), spread(r.fwd_min, r.fwd_max).c_str(),
              spread(r.bwd_min, r.bwd_max).c_str());
}

// The number --json and --csv write: 6 significant digits (%.6g: a max error of 3e-7 stays
// 3e-07, not 0.000000); empty for NaN / infinity (null in JSON, which has no literal for them).
std::string number_text(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// One field of a result record (--json and --csv have the same fields, in the same order).
struct Field {
  const char* key;
  std::string text;  // a string field's value
  double number;     // a number field's value (NaN: null / empty)
  bool is_number;
};

std::vector<Field> result_fields(const BenchConfig& cfg, const Result& r) {
  auto str = [](const char* k, std::string v) { return Field{k, std::move(v), NAN, false}; };
  auto num = [](const char* k, double v) { return Field{k, "", v, true}; };
  const char* measure = cfg.device == fna::Device::cuda ? "cuda_pool_high_water_plus_held"
                        : r.peak_exact                  ? "rss_high_water_minus_start"
                                                        : "rss_after_minus_before";
  return {str("problem", problem_string(cfg.problem)),
          str("fna_version", g_info.version),
          str("commit", g_info.commit),
          str("date", g_info.date),
          str("device", g_info.device),
          str("name", cfg.name),
          str("backend", r.backend),
          num("threads", resolved_threads(cfg.threads)),
          str("mode", cfg.forward && cfg.backward ? "both" : cfg.forward ? "fwd" : "bwd"),
          num("repeats", r.repeats),
          num("fwd_ms", r.fwd_ms),
          num("fwd_ms_min", r.fwd_min),
          num("fwd_ms_max", r.fwd_max),
          num("bwd_ms", r.bwd_ms),
          num("bwd_ms_min", r.bwd_min),
          num("bwd_ms_max", r.bwd_max),
          num("fwd_tflops", r.fwd_tflops),
          num("bwd_tflops", r.bwd_tflops),
          num("fwd_bwd_tflops", r.total_tflops),
          num("max_err", r.max_err),
          num("peak_mb", r.peak_mb),
          str("peak_mb_measure", measure),
          str("error", r.error)};
}

// Appends one result line to --json (nlohmann/json writes it: escaping, UTF-8, numbers); false
// (with a message on stderr) if it cannot be written. Fields in result_fields' order.
bool write_json(const BenchConfig& cfg, const Result& r) {
  if (cfg.json.empty()) return true;
  nlohmann::ordered_json rec = nlohmann::ordered_json::object();
  for (const Field& fd : result_fields(cfg, r)) {
    const std::string num = fd.is_number ? number_text(fd.number) : "";
    if (!fd.is_number) {
      rec[fd.key] = fd.text;
    } else if (num.empty()) {
      rec[fd.key] = nullptr;
    } else if (fd.number == std::floor(fd.number) && std::fabs(fd.number) < 9.0e15) {
      rec[fd.key] = static_cast<long long>(fd.number);  // counts (threads, repeats) as integers
    } else {
      rec[fd.key] = std::strtod(num.c_str(), nullptr);
    }
  }
  std::string line;
  try {
    // Invalid UTF-8 in a label (--name) is replaced by U+FFFD rather than aborting the run.
    line = rec.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fna-bench: cannot encode a --json record: %s\n", e.what());
    return false;
  }
  std::ofstream f(cfg.json, std::ios::app);
  f << line << "\n";
  f.flush();
  if (!f) {
    std::fprintf(stderr, "fna-bench: cannot write --json file %s\n", cfg.json.c_str());
    return false;
  }
  return true;
}

// A CSV field (RFC 4180): quoted, with quotes doubled, where it holds a comma, quote or line break.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Appends one result row to --csv (a header row first where the file is empty); false (with a
// message on stderr) if it cannot be written. Numbers as in --json; not measured: empty.
bool write_csv(const BenchConfig& cfg, const Result& r) {
  if (cfg.csv.empty()) return true;
  std::ofstream f(cfg.csv, std::ios::app);
  const std::vector<Field> fields = result_fields(cfg, r);
  if (f && f.tellp() == 0) {
    for (size_t i = 0; i < fields.size(); ++i) f << (i ? "," : "") << fields[i].key;
    f << "\r\n";
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    const Field& fd = fields[i];
    f << (i ? "," : "") << (fd.is_number ? number_text(fd.number) : csv_field(fd.text));
  }
  f << "\r\n";
  f.flush();
  if (!f) {
    std::fprintf(stderr, "fna-bench: cannot write --csv file %s\n", cfg.csv.c_str());
    return false;
  }
  return true;
}

// The most bytes of tensors fna-bench allocates: the machine's memory, and at most 2^40.
int64_t memory_limit_bytes() {
  int64_t limit = int64_t(1) << 40;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0 && static_cast<int64_t>(pages) <= limit / page)
    limit = static_cast<int64_t>(pages) * page;
  return limit;
}

int run_one(const BenchConfig& cfg) {
  fna::Status st = fna::validate_problem(cfg.problem);
  if (!st.ok()) {
    std::fprintf(stderr, "fna-bench: %s\n", st.message.c_str());
    return 2;
  }
  // Refuse sizes that cannot be allocated before allocating anything.
  int64_t bytes = 0;
  const int64_t limit = memory_limit_bytes();
  if (!planned_bytes(cfg.problem, cfg.device, &bytes) || bytes > limit) {
    std::fprintf(stderr,
                 "fna-bench: the problem's tensors need %s bytes, more than the %lld bytes "
                 "fna-bench allocates at most (the machine's memory, at most 2^40)\n",
                 bytes > 0 ? std::to_string(bytes).c_str() : "over 2^63",
                 static_cast<long long>(limit));
    return 2;
  }
  std::vector<fna::Backend> backends = cfg.backends;
  if (backends.empty()) {
    if (cfg.device == fna::Device::cpu) {
      backends = {fna::Backend::cpu, fna::Backend::reference};
    } else {
      for (fna::Backend b : {fna::Backend::cuda_naive, fna::Backend::cuda_fused})
        if (fna::backend_compiled(b)) backends.push_back(b);
    }
  }
  for (const auto& [flag, name] : {std::make_pair("--config", cfg.config),
                                    std::make_pair("--backward-config", cfg.backward_config)}) {
    if (!name.empty() &&
        std::find(backends.begin(), backends.end(), fna::Backend::cuda_fused) == backends.end()) {
      std::fprintf(stderr, "fna-bench: %s=%s names a cuda-fused configuration, but cuda-fused "
                   "is not among the backends run\n", flag, name.c_str());
      return 2;
    }
  }
  if (cfg.device == fna::Device::cuda && !fna::cuda_available()) {
    std::fprintf(stderr, "fna-bench: --device cuda, but %s\n",
                 fna::backend_compiled(fna::Backend::cuda_naive)
                     ? "no CUDA device is visible"
                     : "this build of fna has no CUDA backends");
    return 2;
  }
  std::printf("problem: %s\n", problem_string(cfg.problem).c_str());
  std::printf("forward FLOPs: %.4g (docs/semantics.md section 3), device: %s%s, threads: %d%s\n",
              forward_flops(cfg.problem), cfg.device == fna::Device::cpu ? "cpu" : "cuda",
              cfg.device_set              ? ""
              : cfg.device == fna::Device::cuda ? " (default: a CUDA device is visible)"
                                                : " (default: no CUDA device visible)",
              resolved_threads(cfg.threads),
              cfg.threads > 0 ? "" : " (default: the cores available)");
  if (!fna::tuning_string(cfg.tuning).empty())
    std::printf("tuning: %s\n", fna::tuning_string(cfg.tuning).c_str());
  Buffers buf(cfg.problem, cfg.device, /*seed=*/1234);
  if (!buf.error().empty()) {
    std::fprintf(stderr, "fna-bench: %s\n", buf.error().c_str());
    return 2;
  }
  ReferenceSample ref;
  const ReferenceSample* ref_ptr = nullptr;
  if (cfg.check_samples > 0) {
    std::string err = buf.make_reference_sample(cfg.check_samples, &ref);
    if (err.empty()) ref_ptr = &ref;
    else std::fprintf(stderr, "fna-bench: reference check skipped: %s\n", err.c_str());
  }
  print_header();
  int failures = 0;
  bool peak_exact = true;
  for (fna::Backend b : backends) {
    Result r = run_backend(cfg, b, buf, ref_ptr);
    if (r.error.empty()) peak_exact = peak_exact && r.peak_exact;
    print_result(r);
    if (!write_json(cfg, r) || !write_csv(cfg, r)) return 2;
    if (!r.error.empty()) ++failures;
    // A sanity bound, not the SPEC criterion (the test suites apply that): far above the
    // rounding of the output dtype, so only a wrong result trips it.
    const bool tf32 = cfg.allow_tf32 && b == fna::Backend::cuda_fused;
    const double tol = cfg.problem.dtype == fna::DType::f32 && !tf32 ? 1e-4 : 3e-2;
    if (std::isfinite(r.err_bound) && !(r.max_err <= tol * std::max(r.err_bound, 1e-3))) {
      std::printf("FAILED: %s max err %.3g exceeds %.0e x max|ref|\n", r.backend.c_str(),
                  r.max_err, tol);
      ++failures;
    }
  }
  if (cfg.check_samples <= 0)
    std::printf("max err: not checked (--check N compares N sampled queries with the float64 "
                "reference)\n");
  if (ref_ptr)
    std::printf("max err: max |out - ref| over %d sampled queries x all heads (ref: float64 "
                "reference); scale: max |ref|\n", cfg.check_samples);
  std::printf("%s (tensors: %.1f MB)\n", PeakMemory::legend(cfg.device, peak_exact),
              buf.tensor_mb());
  return failures ? 1 : 0;
}

std::vector<std::pair<std::string, fna::Problem>> sweep_problems(const BenchConfig& base) {
  std::vector<std::pair<std::string, fna::Problem>> out;
  auto make = [&](const char* name, int rank, std::vector<int64_t> shape, int64_t b, int64_t h,
                  int64_t d, std::vector<int64_t> k) {
    fna::Problem p = base.problem;
    p.rank = rank;
    p.batch = b;
    p.heads = p.heads_kv = h;
    p.dim = p.dim_v = d;
    for (int i = 0; i < rank; ++i) {
      p.shape[i] = shape[i];
      p.kernel_size[i] = k[i];
      p.dilation[i] = 1;
      p.stride[i] = 1;
      p.is_causal[i] = false;
    }
    out.emplace_back(name, p);
    fna::Problem dil = p;
    for (int i = 0; i < rank; ++i) dil.dilation[i] = 2;
    out.emplace_back(std::string(name) + "-dil2", dil);
    fna::Problem causal = p;
    causal.is_causal[0] = true;
    out.emplace_back(std::string(name) + "-causal0", causal);
  };
  if (base.device == fna::Device::cpu) {
    make("1d", 1, {4096}, 1, 4, 64, {255});
    make("2d", 2, {64, 64}, 1, 4, 64, {13, 13});
    make("3d", 3, {12, 16, 16}, 1, 4, 64, {5, 7, 7});
  } else {  // docs/semantics.md section 3 standard problems
    make("1d-long", 1, {32768}, 1, 16, 128, {2048});
    make("2d-nat", 2, {128, 128}, 8, 8, 64, {13, 13});
    make("2d-large", 2, {256, 256}, 1, 16, 128, {63, 63});
    make("3d-video", 3, {30, 48, 80}, 1, 24, 128, {18, 24, 24});
  }
  return out;
}

}  // namespace
}  // namespace fna_bench

// The whole CLI; the executable's main (cli.cpp) and the Python extension's fna-bench entry point
// (fna._C.bench_main) both call it, so a wheel carries the kernels once.
int fna_bench_main(int argc, char** argv) {
  using namespace fna_bench;
  BenchConfig cfg;
  std::string err;
  bool help = false;
  if (!parse_args(argc, argv, &cfg, &err, &help)) {
    std::fprintf(stderr, "fna-bench: %s\n%s", err.c_str(), usage());
    return 2;
  }
  if (help) {
    std::printf("%s", usage());
    return 0;
  }
  // Fail before any work if the results cannot be written.
  for (const auto& [flag, path] : {std::make_pair("--json", cfg.json),
                                   std::make_pair("--csv", cfg.csv)}) {
    if (path.empty()) continue;
    std::ofstream f(path, std::ios::app);
    if (!f) {
      std::fprintf(stderr, "fna-bench: cannot open %s file %s for appending\n", flag, path.c_str());
      return 2;
    }
  }
  // GPU by default where a CUDA device is visible; an explicit --device wins. On the GPU the
  // float64 reference check is slow, so it runs only when --check asks for it.
  if (!cfg.device_set) cfg.device = fna::cuda_available() ? fna::Device::cuda : fna::Device::cpu;
  if (cfg.device == fna::Device::cuda && !cfg.check_set) cfg.check_samples = 0;
  g_info.date = utc_now();
  if (cfg.device == fna::Device::cpu || fna::cuda_available())
    g_info.device = device_description(cfg.device);
  else
    g_info.device = "cuda (none visible)";
  std::printf("fna-bench: fna %s, commit %s, device %s, date %s (UTC)\n", g_info.version.c_str(),
              g_info.commit.c_str(), g_info.device.c_str(), g_info.date.c_str());
  if (!cfg.sweep) return run_one(cfg);
  auto problems = sweep_problems(cfg);
  int rc = 0, i = 0;
  for (auto& [name, p] : problems) {
    ++i;
    std::printf("\n[%d/%zu] %s\n", i, problems.size(), name.c_str());
    std::fflush(stdout);
    BenchConfig c = cfg;
    c.problem = p;
    c.name = cfg.name == "custom" ? name : cfg.name + "/" + name;  // --name prefixes the sweep's
    rc |= run_one(c);
  }
  return rc;
}
