// The device side of the autotuner (Tuning::mode = autotune): the problem signature, the timing
// of one candidate with CUDA events on the call's stream, and whether timing is allowed (never
// inside CUDA graph capture). The choice and its cache are core/autotune.h's.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "fna/fna.h"

namespace fna {
namespace detail {

// The device part of a signature (name, compute capability, SMs, driver, fna version), queried
// once per device.
inline std::string autotune_device_key(int device) {
  static std::mutex mu;
  static std::map<int, std::string> keys;
  std::lock_guard<std::mutex> lock(mu);
  auto it = keys.find(device);
  if (it != keys.end()) return it->second;
  cudaDeviceProp prop{};
  int driver = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDriverGetVersion(&driver) != cudaSuccess) {
    cudaGetLastError();
    return "device" + std::to_string(device);  // not cached: asked again next time
  }
  std::string k = std::string(prop.name) + "|cc" + std::to_string(prop.major) + "." +
                  std::to_string(prop.minor) + "|sm" + std::to_string(prop.multiProcessorCount) +
                  "|drv" + std::to_string(driver) + "|fna" + version();
  keys[device] = k;
  return k;
}

// The signature of a call for direction `dir` ("fwd" / "bwd"): the device, and every problem
// field and option that changes what can run or how fast (the tuning fields other than the
// autotuner's own).
inline std::string autotune_signature(const char* dir, const Problem& p, const Options& opt) {
  const Tuning rest = kernel_tuning(opt.tuning);
  std::string s = std::string(dir) + "|" + autotune_device_key(opt.device_index) + "|" +
                  dtype_name(p.dtype) + (opt.allow_tf32 ? "+tf32" : "") +
                  (opt.deterministic ? "|det" : "") + "|b" + std::to_string(p.batch) + "|h" +
                  std::to_string(p.heads) + "/" + std::to_string(p.heads_kv) + "|d" +
                  std::to_string(p.dim) + "/" + std::to_string(p.dim_v) + "|add" +
                  std::to_string(p.num_additional) + (p.rpb ? "|rpb" : "");
  for (int i = 0; i < p.rank; ++i)
    s += "|ax" + std::to_string(p.shape[i]) + "k" + std::to_string(p.kernel_size[i]) + "d" +
         std::to_string(p.dilation[i]) + "s" + std::to_string(p.stride[i]) +
         (p.is_causal[i] ? "c" : "");
  return s + "|" + tuning_string(rest);
}

// Choices already made in this process, by signature and cache directory: a call that finds its
// signature here skips building the candidate list (the autotuner's own caches sit behind it).
struct AutotuneMemo {
  std::mutex mu;
  std::map<std::string, std::string> choice;
  static AutotuneMemo& get() {
    static AutotuneMemo m;
    return m;
  }
  bool find(const std::string& key, std::string* out) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = choice.find(key);
    if (it == choice.end()) return false;
    *out = it->second;
    return true;
  }
  void put(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu);
    choice[key] = value;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu);
    choice.clear();
  }
};

// Whether the autotuner may time on this stream: not while it is being captured into a graph.
inline bool autotune_may_time(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st == cudaStreamCaptureStatusNone;
}

// Median GPU time (ms) of `run` on `stream` over 3 timed calls after one warm-up; -1 when a call
// fails.
inline double autotune_time(cudaStream_t stream, const std::function<Status()>& run) {
  cudaEvent_t a, b;
  if (cudaEventCreate(&a) != cudaSuccess) return -1;
  if (cudaEventCreate(&b) != cudaSuccess) {
    cudaEventDestroy(a);
    return -1;
  }
  std::vector<double> ms;
  bool ok = run().ok();
  for (int i = 0; ok && i < 3; ++i) {
    cudaEventRecord(a, stream);
    ok = run().ok();
    cudaEventRecord(b, stream);
    float t = 0;
    ok = ok && cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&t, a, b) == cudaSuccess;
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!ok) {
    cudaGetLastError();
    return -1;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The request's common fields from the options.
inline AutotuneRequest autotune_request(std::string signature, const Options& opt) {
  AutotuneRequest r;
  r.signature = std::move(signature);
  r.cache_dir = opt.tuning.autotune_cache_dir;
  r.budget_ms = opt.tuning.autotune_budget_ms > 0 ? double(opt.tuning.autotune_budget_ms) : 2000.0;
  r.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  return r;
}

}  // namespace detail
}  // namespace fna
