// Tensors of one benchmark problem on the host or a CUDA device, random-filled, with poisoning,
// timing and the sampled reference check.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fna/fna.h"

namespace fna_bench {

// Reference rows for a sample of queries: all heads of each sampled (batch, token).
struct ReferenceSample {
  std::vector<int64_t> rows;   // flattened (batch, token) indices
  std::vector<float> out;      // [rows, H, D_v]
};

struct ErrorStat {
  double max_err = 0;
  double scale = 0;  // max |ref|
};

class Timer {
 public:
  explicit Timer(fna::Device d);
  ~Timer();
  double stop_ms();

 private:
  fna::Device device_;
  double t0_ = 0;
  void* ev_[2] = {nullptr, nullptr};
};

// The bytes Buffers would allocate for problem `p` (every tensor: inputs, outputs, gradients;
// on a CUDA device as much again on the device), computed without overflow: false where the
// count exceeds int64. Checked before constructing Buffers, so that an absurd size is refused
// with a message instead of failing in the allocator.
bool planned_bytes(const fna::Problem& p, fna::Device device, int64_t* bytes);

// Peak memory of one backend's runs (issue 29), not the process's cumulative peak. CPU: the
// process's resident-set high-water mark (VmHWM in /proc/self/status, reset to the current
// resident set at start() by writing 5 to /proc/self/clear_refs) minus the resident set at
// start(); where that reset is refused, the resident set after the runs minus that before
// (/proc/self/statm), which misses memory freed before the runs end. CUDA: the high-water mark
// of the default stream-ordered pool (reset at start()) over its use at start(), plus device
// memory still held after the runs (cudaMemGetInfo). The benchmark's tensors, allocated before
// start(), are not included.
class PeakMemory {
 public:
  explicit PeakMemory(fna::Device device);
  void start();
  double stop_mb();               // MB (2^20 bytes) as described above; NaN if unmeasurable
  bool exact() const { return exact_; }  // CPU: true when the high-water mark was reset
  static const char* legend(fna::Device device, bool exact);

 private:
  fna::Device device_;
  bool exact_ = false;
  double base_ = 0;       // CPU: resident bytes; CUDA: pool bytes in use
  double free_base_ = 0;  // CUDA: free device bytes at start()
};

// The device the benchmark runs on, in words: the CPU model (/proc/cpuinfo) or the CUDA device's
// name and compute capability.
std::string device_description(fna::Device device);

class Buffers {
 public:
  Buffers(const fna::Problem& p, fna::Device device, uint64_t seed);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  const std::string& error() const { return error_; }
  fna::ForwardArgs forward_args();
  fna::BackwardArgs backward_args();
  void poison_outputs();
  void poison_grads();
  // Computes the reference for `samples` random queries; returns an error string on failure.
  std::string make_reference_sample(int samples, ReferenceSample* out);
  ErrorStat compare_forward(const ReferenceSample& ref);
  double tensor_mb() const;  // MB of the tensors allocated (on the device for CUDA)

 private:
  struct Tensor {
    std::vector<int64_t> extents;
    int64_t elem = 2;
    int64_t count = 0;
    std::vector<uint8_t> host;  // dtype bytes; the device copy's source
    void* dev = nullptr;
    void* ptr() { return dev ? dev : host.data(); }
  };
  Tensor& make(const std::vector<int64_t>& extents, int64_t elem, bool random);
  fna::TensorRef ref(Tensor& t);
  void upload(Tensor& t);
  void poison(Tensor& t);
  std::vector<float> download_as_float(Tensor& t);

  fna::Problem p_;
  fna::Device device_;
  std::mt19937_64 rng_;
  std::string error_;
  std::vector<Tensor*> all_;
  Tensor *q_, *k_, *v_, *o_, *lse_, *do_, *dq_, *dk_, *dv_;
  Tensor *ak_ = nullptr, *av_ = nullptr, *dak_ = nullptr, *dav_ = nullptr;
  double device_bytes_ = 0;
};

}  // namespace fna_bench
