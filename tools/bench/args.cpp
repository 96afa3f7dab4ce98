#include "args.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "default_problem.h"

namespace fna_bench {

const char* usage() {
  return R"(fna-bench: time one neighborhood-attention problem on each backend.

usage: fna-bench [flags]            (no flags: a 2-D fp32 problem that runs in seconds on the CPU)
       fna-bench profile [flags]    (the installed command only: python -m fna.profiler, the
                                     cuda-fused configurations of a problem listed and timed)
  every flag that takes a value accepts --flag VALUE and --flag=VALUE
  --shape 128x128        token grid; its number of axes is the rank (1, 2 or 3)
  --batch N  --heads N  --heads-kv N  --dim N  --dim-v N
  --kernel 13x13         per-axis window (an int means every axis)
  --dilation 1  --stride 1
  --causal 0             per-axis causal flags, e.g. 1x0 (an int means every axis)
  --additional N         additional (global) keys/values per batch
  --dtype float32|float16|bfloat16
  --device cpu|cuda      default: cuda where a CUDA device is visible (fna::cuda_available), else cpu
  --backend LIST         comma list of cpu, reference, cuda-naive, cuda-fused (default: all compiled
                         backends for the device, reference excluded on cuda)
  --mode fwd|bwd|both    time the forward only, the backward only (the forward runs once,
                         untimed, for O and LSE), or both (default both)
  --repeats N  --warmup N
  --threads N            CPU threads, at most 1024 (default 0: fna::get_num_threads(), the cores
                         available to the process)
  --check N              queries checked against the float64 reference (default: 64 on cpu; on
                         cuda none unless asked, the reference being slow; 0 = none)
  --config NAME          cuda-fused forward tile configuration (names: an invalid one lists them)
  --backward-config NAME cuda-fused backward tile configuration (likewise)
  --tuning K=V[,K=V..]   Options::tuning fields (keys: fna::tuning_keys; e.g. fwd_copy=cp_async),
                         applied to every backend run: name the backend they concern (--backend)
  --allow-tf32           cuda-fused float32: plain TF32 products (default: split TF32)
  --deterministic        CUDA backward in a fixed order (bitwise reproducible)
  --sweep                run the built-in list of problems for the device, with a progress line
  --json FILE            append one JSON object per result line to FILE
  --csv FILE             append one CSV row per result (backend) to FILE; a header row first when
                         FILE is new or empty; same fields as --json
  --name NAME            the label of the results in --json / --csv (default: custom; --sweep:
                         the problem's name, NAME/ before it when given)
)";
}

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == 'x' || c == ',' || c == 'X') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

bool to_int(const std::string& s, long long* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *v = std::strtoll(s.c_str(), &end, 10);
  return end && *end == '\0' && errno != ERANGE;  // out of range: not silently LLONG_MAX
}

}  // namespace

bool parse_axes(const std::string& s, int rank, long long out[3], std::string* err,
                const char* flag) {
  auto parts = split(s);
  if (parts.size() != 1 && static_cast<int>(parts.size()) != rank) {
    *err = std::string(flag) + "=" + s + " has " + std::to_string(parts.size()) +
           " entries for a rank-" + std::to_string(rank) + " problem";
    return false;
  }
  for (int i = 0; i < rank; ++i) {
    long long v;
    if (!to_int(parts.size() == 1 ? parts[0] : parts[i], &v)) {
      *err = std::string(flag) + "=" + s + " is not an integer list";
      return false;
    }
    out[i] = v;
  }
  return true;
}

bool parse_args(int argc, char** argv, BenchConfig* cfg, std::string* err, bool* help) {
  fna::Problem& p = cfg->problem;
  p = default_problem();
  std::string shape, kernel = "13", dilation = "1", stride = "1", causal = "0";
  bool heads_kv_set = false, dim_v_set = false;
  *help = false;
  if (argc > 1 && std::string(argv[1]) == "profile") {
    *err = "`fna-bench profile` is the configuration profiler of the Python package: run it "
           "through the installed fna-bench command (pip install .) or as python -m fna.profiler; "
           "this executable has no Python";
    return false;
  }
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    // --flag=value is the same as --flag value (the value may itself contain '=', e.g. --tuning).
    std::string inline_value;
    bool has_inline = false;
    if (f.rfind("--", 0) == 0) {
      const size_t eq = f.find('=');
      if (eq != std::string::npos) {
        inline_value = f.substr(eq + 1);
        f = f.substr(0, eq);
        has_inline = true;
      }
    }
    bool value_used = false;
    auto value = [&](std::string* out) {
      value_used = true;
      if (has_inline) {
        *out = inline_value;
        return true;
      }
      if (i + 1 >= argc) {
        *err = f + " needs a value";
        return false;
      }
      *out = argv[++i];
      return true;
    };
    auto int_value = [&](long long* out) {
      std::string s;
      if (!value(&s)) return false;
      if (!to_int(s, out)) {
        *err = f + "=" + s + " is not an integer";
        return false;
      }
      // Flags held in an int must fit one (the problem's sizes are checked by validate_problem).
      const bool narrow = f == "--repeats" || f == "--warmup" || f == "--threads" || f == "--check";
      if (narrow && (*out < -2147483647LL || *out > 2147483647LL)) {
        *err = f + "=" + s + " is out of range";
        return false;
      }
      return true;
    };
    long long v = 0;
    std::string s;
    if (f == "-h" || f == "--help") {
      *help = true;
      return true;
    } else if (f == "--shape") {
      if (!value(&shape)) return false;
    } else if (f == "--kernel") {
      if (!value(&kernel)) return false;
    } else if (f == "--dilation") {
      if (!value(&dilation)) return false;
    } else if (f == "--stride") {
      if (!value(&stride)) return false;
    } else if (f == "--causal") {
      if (!value(&causal)) return false;
    } else if (f == "--batch") {
      if (!int_value(&v)) return false;
      p.batch = v;
    } else if (f == "--heads") {
      if (!int_value(&v)) return false;
      p.heads = v;
      if (!heads_kv_set) p.heads_kv = v;
    } else if (f == "--heads-kv") {
      if (!int_value(&v)) return false;
      p.heads_kv = v;
      heads_kv_set = true;
    } else if (f == "--dim") {
      if (!int_value(&v)) return false;
      p.dim = v;
      if (!dim_v_set) p.dim_v = v;
    } else if (f == "--dim-v") {
      if (!int_value(&v)) return false;
      p.dim_v = v;
      dim_v_set = true;
    } else if (f == "--additional") {
      if (!int_value(&v)) return false;
      p.num_additional = v;
    } else if (f == "--repeats") {
      if (!int_value(&v)) return false;
      if (v < 1) { *err = "--repeats=" + std::to_string(v) + " must be >= 1"; return false; }
      cfg->repeats = static_cast<int>(v);
    } else if (f == "--warmup") {
      if (!int_value(&v)) return false;
      if (v < 0) { *err = "--warmup=" + std::to_string(v) + " must be >= 0"; return false; }
      cfg->warmup = static_cast<int>(v);
    } else if (f == "--threads") {
      if (!int_value(&v)) return false;
      if (v < 0 || v > fna::kMaxThreads) {
        *err = "--threads=" + std::to_string(v) + " must be in [0, " + std::to_string(fna::kMaxThreads) +
               "] (0: the cores available to the process)";
        return false;
      }
      cfg->threads = static_cast<int>(v);
    } else if (f == "--check") {
      if (!int_value(&v)) return false;
      cfg->check_samples = static_cast<int>(v);
      cfg->check_set = true;
    } else if (f == "--dtype") {
      if (!value(&s)) return false;
      if (s == "float32" || s == "fp32" || s == "f32") p.dtype = fna::DType::f32;
      else if (s == "float16" || s == "fp16" || s == "f16") p.dtype = fna::DType::f16;
      else if (s == "bfloat16" || s == "bf16") p.dtype = fna::DType::bf16;
      else { *err = "--dtype=" + s + " is not one of float32, float16, bfloat16"; return false; }
    } else if (f == "--device") {
      if (!value(&s)) return false;
      if (s == "cpu") cfg->device = fna::Device::cpu;
      else if (s == "cuda") cfg->device = fna::Device::cuda;
      else { *err = "--device=" + s + " is not cpu or cuda"; return false; }
      cfg->device_set = true;
    } else if (f == "--backend") {
      if (!value(&s)) return false;
      std::stringstream ss(s);
      std::string name;
      while (std::getline(ss, name, ',')) {
        fna::Backend b;
        fna::Status st = fna::parse_backend(name, &b);
        if (!st.ok()) { *err = "--backend: " + st.message; return false; }
        cfg->backends.push_back(b);
      }
    } else if (f == "--mode") {
      if (!value(&s)) return false;
      if (s == "fwd") { cfg->forward = true; cfg->backward = false; }
      else if (s == "bwd") { cfg->forward = false; cfg->backward = true; }
      else if (s == "both") { cfg->forward = true; cfg->backward = true; }
      else { *err = "--mode=" + s + " is not fwd, bwd or both"; return false; }
    } else if (f == "--sweep") {
      cfg->sweep = true;
    } else if (f == "--config") {
      if (!value(&cfg->config)) return false;
      if (cfg->config.empty()) { *err = "--config needs a configuration name"; return false; }
    } else if (f == "--backward-config") {
      if (!value(&cfg->backward_config)) return false;
      if (cfg->backward_config.empty()) {
        *err = "--backward-config needs a configuration name";
        return false;
      }
    } else if (f == "--tuning") {
      std::string text;
      if (!value(&text)) return false;
      const fna::Status st = fna::parse_tuning(text, &cfg->tuning);
      if (!st.ok()) {
        *err = st.message;
        return false;
      }
    } else if (f == "--allow-tf32") {
      cfg->allow_tf32 = true;
    } else if (f == "--deterministic") {
      cfg->deterministic = true;
    } else if (f == "--json") {
      if (!value(&cfg->json)) return false;
    } else if (f == "--csv") {
      if (!value(&cfg->csv)) return false;
    } else if (f == "--name") {
      if (!value(&cfg->name)) return false;
    } else {
      *err = "unknown flag " + f + " (see --help)";
      return false;
    }
    if (has_inline && !value_used) {
      *err = f + " takes no value (got " + f + "=" + inline_value + ")";
      return false;
    }
  }
  if (!shape.empty()) {
    auto parts = split(shape);
    if (parts.empty() || parts.size() > 3) {
      *err = "--shape=" + shape + " must have 1 to 3 axes";
      return false;
    }
    p.rank = static_cast<int>(parts.size());
    for (int i = 0; i < p.rank; ++i) {
      long long n;
      if (!to_int(parts[i], &n)) { *err = "--shape=" + shape + " is not an integer list"; return false; }
      p.shape[i] = n;
    }
  }
  long long k[3], d[3], st[3], c[3];
  if (!parse_axes(kernel, p.rank, k, err, "--kernel")) return false;
  if (!parse_axes(dilation, p.rank, d, err, "--dilation")) return false;
  if (!parse_axes(stride, p.rank, st, err, "--stride")) return false;
  if (!parse_axes(causal, p.rank, c, err, "--causal")) return false;
  for (int i = 0; i < p.rank; ++i) {
    if (c[i] != 0 && c[i] != 1) {
      *err = "--causal=" + causal + ": each entry must be 0 or 1 (got " + std::to_string(c[i]) + ")";
      return false;
    }
  }
  for (int i = 0; i < p.rank; ++i) {
    p.kernel_size[i] = k[i];
    p.dilation[i] = d[i];
    p.stride[i] = st[i];
    p.is_causal[i] = c[i] != 0;
  }
  return true;
}

}  // namespace fna_bench
