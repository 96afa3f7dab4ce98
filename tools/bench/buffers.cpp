#include "buffers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/backends.h"
#include "core/dtype.h"

#if defined(FNA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace fna_bench {

using fna::detail::load_as_float;
using fna::detail::store_from_float;

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Timer::Timer(fna::Device d) : device_(d) {
#if defined(FNA_WITH_CUDA)
  if (device_ == fna::Device::cuda) {
    cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&ev_[0]));
    cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&ev_[1]));
    cudaEventRecord(static_cast<cudaEvent_t>(ev_[0]), nullptr);
    return;
  }
#endif
  t0_ = now_ms();
}

Timer::~Timer() {
#if defined(FNA_WITH_CUDA)
  for (void* e : ev_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

double Timer::stop_ms() {
#if defined(FNA_WITH_CUDA)
  if (device_ == fna::Device::cuda) {
    cudaEventRecord(static_cast<cudaEvent_t>(ev_[1]), nullptr);
    cudaEventSynchronize(static_cast<cudaEvent_t>(ev_[1]));
    float ms = 0;
    cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(ev_[0]), static_cast<cudaEvent_t>(ev_[1]));
    return ms;
  }
#endif
  return now_ms() - t0_;
}

bool planned_bytes(const fna::Problem& p, fna::Device device, int64_t* bytes) {
  bool ok = true;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    ok = ok && !__builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    ok = ok && !__builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t e = fna::detail::dtype_size(p.dtype);
  int64_t grid = p.batch;  // batch * tokens
  for (int i = 0; i < p.rank; ++i) grid = mul(grid, p.shape[i]);
  // The tensors of the constructor below: q, dq (H x D), o, do (H x D_v), k, dk (H_kv x D),
  // v, dv (H_kv x D_v), lse (H, float32), and 4 additional ones (N_add x H_kv x D or D_v).
  const int64_t dims = add(p.dim, p.dim_v);
  const int64_t per_token = add(mul(mul(2, p.heads), dims), mul(mul(2, p.heads_kv), dims));
  int64_t total = add(mul(mul(grid, per_token), e), mul(mul(grid, p.heads), 4));
  if (p.num_additional > 0)
    total = add(total, mul(mul(mul(p.batch, p.num_additional), mul(mul(2, p.heads_kv), dims)), e));
  if (device == fna::Device::cuda) total = mul(total, 2);  // the host copies stay
  if (ok) *bytes = total;
  return ok;
}

Buffers::Buffers(const fna::Problem& p, fna::Device device, uint64_t seed)
    : p_(p), device_(device), rng_(seed) {
  const int64_t e = fna::detail::dtype_size(p.dtype);
  auto qo = [&](int64_t heads, int64_t dim) {
    std::vector<int64_t> x{p.batch};
    for (int i = 0; i < p.rank; ++i) x.push_back(p.shape[i]);
    x.push_back(heads);
    x.push_back(dim);
    return x;
  };
  std::vector<int64_t> lse_ext = qo(p.heads, 1);
  lse_ext.pop_back();
  q_ = &make(qo(p.heads, p.dim), e, true);
  k_ = &make(qo(p.heads_kv, p.dim), e, true);
  v_ = &make(qo(p.heads_kv, p.dim_v), e, true);
  o_ = &make(qo(p.heads, p.dim_v), e, false);
  lse_ = &make(lse_ext, 4, false);
  do_ = &make(qo(p.heads, p.dim_v), e, true);
  dq_ = &make(qo(p.heads, p.dim), e, false);
  dk_ = &make(qo(p.heads_kv, p.dim), e, false);
  dv_ = &make(qo(p.heads_kv, p.dim_v), e, false);
  if (p.num_additional > 0) {
    ak_ = &make({p.batch, p.num_additional, p.heads_kv, p.dim}, e, true);
    av_ = &make({p.batch, p.num_additional, p.heads_kv, p.dim_v}, e, true);
    dak_ = &make({p.batch, p.num_additional, p.heads_kv, p.dim}, e, false);
    dav_ = &make({p.batch, p.num_additional, p.heads_kv, p.dim_v}, e, false);
  }
  if (device_ == fna::Device::cuda) {
#if defined(FNA_WITH_CUDA)
    for (Tensor* t : all_) {
      if (cudaMalloc(&t->dev, t->count * t->elem) != cudaSuccess) {
        error_ = "cudaMalloc of " + std::to_string(t->count * t->elem) + " bytes failed";
        return;
      }
      device_bytes_ += static_cast<double>(t->count * t->elem);
      upload(*t);
    }
    // The backends' workspaces come from the default stream-ordered pool: reset its high-water mark.
    cudaMemPool_t pool;
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t zero = 0;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    }
#else
    error_ = "this build of fna has no CUDA support";
#endif
  }
}

Buffers::~Buffers() {
  for (Tensor* t : all_) {
#if defined(FNA_WITH_CUDA)
    if (t->dev) cudaFree(t->dev);
#endif
    delete t;
  }
}

Buffers::Tensor& Buffers::make(const std::vector<int64_t>& extents, int64_t elem, bool random) {
  auto* t = new Tensor;
  t->extents = extents;
  t->elem = elem;
  t->count = 1;
  for (int64_t x : extents) t->count *= x;
  t->host.resize(static_cast<size_t>(t->count * elem));
  const fna::DType dt = elem == 4 ? fna::DType::f32 : p_.dtype;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t->count; ++i)
    store_from_float(t->host.data(), i, dt, random ? dist(rng_) : std::nanf(""));
  all_.push_back(t);
  return *t;
}

fna::TensorRef Buffers::ref(Tensor& t) { return fna::dense(t.ptr(), t.extents); }

void Buffers::upload(Tensor& t) {
#if defined(FNA_WITH_CUDA)
  if (t.dev) cudaMemcpy(t.dev, t.host.data(), t.host.size(), cudaMemcpyHostToDevice);
#else
  (void)t;
#endif
}

void Buffers::poison(Tensor& t) {
  if (t.dev) {
#if defined(FNA_WITH_CUDA)
    cudaMemset(t.dev, 0xff, t.count * t.elem);  // all-ones bits: NaN in every float format
#endif
  } else {
    std::memset(t.host.data(), 0xff, t.host.size());
  }
}

void Buffers::poison_outputs() {
  poison(*o_);
  poison(*lse_);
}

void Buffers::poison_grads() {
  for (Tensor* t : {dq_, dk_, dv_, dak_, dav_})
    if (t) poison(*t);
}

fna::ForwardArgs Buffers::forward_args() {
  fna::ForwardArgs a;
  a.q = ref(*q_);
  a.k = ref(*k_);
  a.v = ref(*v_);
  a.o = ref(*o_);
  a.lse = ref(*lse_);
  if (ak_) {
    a.add_k = ref(*ak_);
    a.add_v = ref(*av_);
  }
  return a;
}

fna::BackwardArgs Buffers::backward_args() {
  fna::BackwardArgs a;
  a.q = ref(*q_);
  a.k = ref(*k_);
  a.v = ref(*v_);
  a.o = ref(*o_);
  a.d_o = ref(*do_);
  a.lse = ref(*lse_);
  a.dq = ref(*dq_);
  a.dk = ref(*dk_);
  a.dv = ref(*dv_);
  if (ak_) {
    a.add_k = ref(*ak_);
    a.add_v = ref(*av_);
    a.d_add_k = ref(*dak_);
    a.d_add_v = ref(*dav_);
  }
  return a;
}

std::vector<float> Buffers::download_as_float(Tensor& t) {
  std::vector<uint8_t> bytes(t.host.size());
  if (t.dev) {
#if defined(FNA_WITH_CUDA)
    cudaMemcpy(bytes.data(), t.dev, bytes.size(), cudaMemcpyDeviceToHost);
#endif
  } else {
    bytes = t.host;
  }
  const fna::DType dt = t.elem == 4 ? fna::DType::f32 : p_.dtype;
  std::vector<float> out(static_cast<size_t>(t.count));
  for (int64_t i = 0; i < t.count; ++i) out[i] = load_as_float(bytes.data(), i, dt);
  return out;
}

std::string Buffers::make_reference_sample(int samples, ReferenceSample* out) {
  // The reference loops over every key for every query (it is the definition, not a kernel):
  // B * H * N^2 membership tests. Beyond a few billion that takes minutes, so large problems are
  // not checked here; the test suites check every backend against it on smaller problems.
  const double n = static_cast<double>(p_.tokens());
  const double work = static_cast<double>(p_.batch) * p_.heads * n * (n + p_.num_additional);
  if (work > 4e9)
    return "the problem is too large for the all-keys reference (" + std::to_string(work / 1e9) +
           "G query-key pairs > 4G)";
  // float32 copies of the (already rounded) inputs, so the reference sees exactly the same values.
  fna::Problem pf = p_;
  pf.dtype = fna::DType::f32;
  auto to_f32 = [&](Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.count));
    const fna::DType dt = t.elem == 4 ? fna::DType::f32 : p_.dtype;
    for (int64_t i = 0; i < t.count; ++i) v[i] = load_as_float(t.host.data(), i, dt);
    return v;
  };
  std::vector<float> q = to_f32(*q_), k = to_f32(*k_), v = to_f32(*v_);
  std::vector<float> o(static_cast<size_t>(o_->count)), lse(static_cast<size_t>(lse_->count));
  std::vector<float> ak, av;
  fna::ForwardArgs a;
  a.q = fna::dense(q.data(), q_->extents);
  a.k = fna::dense(k.data(), k_->extents);
  a.v = fna::dense(v.data(), v_->extents);
  a.o = fna::dense(o.data(), o_->extents);
  a.lse = fna::dense(lse.data(), lse_->extents);
  if (ak_) {
    ak = to_f32(*ak_);
    av = to_f32(*av_);
    a.add_k = fna::dense(ak.data(), ak_->extents);
    a.add_v = fna::dense(av.data(), av_->extents);
  }
  fna::Options opt;
  opt.backend = fna::Backend::reference;
  fna::Status st = fna::forward(pf, a, opt);
  if (!st.ok()) return st.message;
  const int64_t rows = p_.batch * p_.tokens();
  const int64_t row_size = p_.heads * p_.dim_v;
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  out->rows.clear();
  out->out.clear();
  for (int s = 0; s < samples; ++s) {
    const int64_t r = pick(rng_);
    out->rows.push_back(r);
    out->out.insert(out->out.end(), o.begin() + r * row_size, o.begin() + (r + 1) * row_size);
  }
  return "";
}

ErrorStat Buffers::compare_forward(const ReferenceSample& ref) {
  std::vector<float> o = download_as_float(*o_);
  const int64_t row_size = p_.heads * p_.dim_v;
  ErrorStat e;
  for (size_t s = 0; s < ref.rows.size(); ++s) {
    for (int64_t j = 0; j < row_size; ++j) {
      const double r = ref.out[s * row_size + j];
      const double x = o[ref.rows[s] * row_size + j];
      const double d = std::isnan(x) ? INFINITY : std::fabs(x - r);
      e.max_err = std::max(e.max_err, d);
      e.scale = std::max(e.scale, std::fabs(r));
    }
  }
  return e;
}

double Buffers::tensor_mb() const {
  if (device_ == fna::Device::cuda) return device_bytes_ / (1024.0 * 1024.0);
  double bytes = 0;
  for (const Tensor* t : all_) bytes += static_cast<double>(t->host.size());
  return bytes / (1024.0 * 1024.0);
}

namespace {
// Resident bytes of this process (/proc/self/statm's second field); NaN if unreadable.
double resident_bytes() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(f >> size >> resident)) return NAN;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

// VmHWM of /proc/self/status in bytes; NaN if absent.
double resident_high_water_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  }
  return NAN;
}
}  // namespace

std::string device_description(fna::Device device) {
  if (device == fna::Device::cuda) {
#if defined(FNA_WITH_CUDA)
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      return "cuda:" + std::to_string(dev) + " " + prop.name + " (sm_" +
             std::to_string(prop.major) + std::to_string(prop.minor) + ")";
#endif
    return "cuda";
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(" \t", colon + 1);
        if (b != std::string::npos) return "cpu " + line.substr(b);
      }
    }
  }
  return "cpu";
}

PeakMemory::PeakMemory(fna::Device device) : device_(device) {}

void PeakMemory::start() {
  if (device_ == fna::Device::cpu) {
    // "5" resets the peak resident set size to the current one (Linux >= 4.0).
    FILE* f = std::fopen("/proc/self/clear_refs", "w");
    exact_ = f != nullptr && std::fputs("5", f) >= 0;
    if (f != nullptr && std::fclose(f) != 0) exact_ = false;
    base_ = resident_bytes();
    if (exact_ && !std::isfinite(resident_high_water_bytes())) exact_ = false;
    return;
  }
#if defined(FNA_WITH_CUDA)
  cudaDeviceSynchronize();
  cudaMemPool_t pool;
  int dev = 0;
  cudaGetDevice(&dev);
  base_ = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t used = 0, zero = 0;
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);  // to the current use
    base_ = static_cast<double>(used);
  }
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  free_base_ = static_cast<double>(free);
  exact_ = true;
#endif
}

double PeakMemory::stop_mb() {
  double bytes = NAN;
  if (device_ == fna::Device::cpu) {
    bytes = (exact_ ? resident_high_water_bytes() : resident_bytes()) - base_;
  } else {
#if defined(FNA_WITH_CUDA)
    cudaDeviceSynchronize();
    cudaMemPool_t pool;
    int dev = 0;
    cudaGetDevice(&dev);
    double pool_peak = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t high = 0;
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
      pool_peak = std::max(0.0, static_cast<double>(high) - base_);
    }
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    // Device memory held after the runs outside the pool's use (e.g. kept workspaces); the pool's
    // own reserve is counted by its high-water mark, so only the excess is added.
    const double held = std::max(0.0, free_base_ - static_cast<double>(free) - pool_peak);
    bytes = pool_peak + held;
#endif
  }
  if (!std::isfinite(bytes)) return NAN;
  return std::max(0.0, bytes) / (1024.0 * 1024.0);
}

const char* PeakMemory::legend(fna::Device device, bool exact) {
  if (device == fna::Device::cuda)
    return "peak MB: per backend, the high-water mark of the stream-ordered pool (backend "
           "workspaces) during its runs over the pool's use before them, plus device memory "
           "still held after them (cudaMemGetInfo); the benchmark's tensors are not included";
  return exact ? "peak MB: per backend, the process's peak resident memory during its runs "
                 "(VmHWM, reset before them via /proc/self/clear_refs) minus its resident memory "
                 "before them; the benchmark's tensors are not included"
               : "peak MB: per backend, resident memory after its runs minus before them "
                 "(/proc/self/statm; the peak could not be reset, so memory freed within the "
                 "runs is missed); the benchmark's tensors are not included";
}

}  // namespace fna_bench
