#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "core/backends.h"

namespace fna {

int64_t Problem::tokens() const {
  int64_t n = 1;
  for (int i = 0; i < rank && i < kMaxRank; ++i) n *= shape[i];
  return n;
}

int64_t Problem::window() const {
  int64_t w = 1;
  for (int i = 0; i < rank && i < kMaxRank; ++i) w *= kernel_size[i];
  return w;
}

namespace {

Status invalid(const std::string& msg) { return {Code::invalid_argument, msg}; }

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Status validate_problem(const Problem& p) {
  if (p.rank < 1 || p.rank > kMaxRank)
    return invalid("rank=" + str(p.rank) + " must be 1, 2 or 3");
  if (p.batch < 1) return invalid("batch=" + str(p.batch) + " must be >= 1");
  if (p.heads < 1) return invalid("heads=" + str(p.heads) + " must be >= 1");
  if (p.heads_kv < 1) return invalid("heads_kv=" + str(p.heads_kv) + " must be >= 1");
  if (p.heads % p.heads_kv != 0)
    return invalid("heads=" + str(p.heads) + " is not a multiple of heads_kv=" + str(p.heads_kv) +
                   " (H % H_kv must be 0)");
  if (p.dim < 1) return invalid("dim=" + str(p.dim) + " must be >= 1");
  if (p.dim_v < 1) return invalid("dim_v=" + str(p.dim_v) + " must be >= 1");
  if (p.num_additional < 0)
    return invalid("num_additional=" + str(p.num_additional) + " must be >= 0");
  if (p.dtype != DType::f32 && p.dtype != DType::f16 && p.dtype != DType::bf16)
    return {Code::unsupported, "dtype=" + str(static_cast<int>(p.dtype)) +
                                   " is not one of float32, float16, bfloat16"};
  // Kernels index with 32-bit coordinates per axis.
  constexpr int64_t kMaxLen = int64_t(1) << 30;
  for (int i = 0; i < p.rank; ++i) {
    const std::string ax = "[" + str(i) + "]";
    if (p.shape[i] < 1 || p.shape[i] > kMaxLen)
      return invalid("shape" + ax + "=" + str(p.shape[i]) + " must be in [1, 2^30]");
    if (p.kernel_size[i] < 1)
      return invalid("kernel_size" + ax + "=" + str(p.kernel_size[i]) + " must be >= 1");
    if (p.dilation[i] < 1)
      return invalid("dilation" + ax + "=" + str(p.dilation[i]) + " must be >= 1");
    if (p.kernel_size[i] * p.dilation[i] > p.shape[i])
      return invalid("kernel_size" + ax + "=" + str(p.kernel_size[i]) + " * dilation" + ax + "=" +
                     str(p.dilation[i]) + " exceeds input length " + str(p.shape[i]));
    if (p.stride[i] < 1 || p.stride[i] > p.kernel_size[i])
      return invalid("stride" + ax + "=" + str(p.stride[i]) + " must be in [1, kernel_size" + ax +
                     "=" + str(p.kernel_size[i]) + "]");
  }
  return Status::Ok();
}

namespace detail {

void extents_qo(const Problem& p, int64_t heads, int64_t dim, int64_t* out, int* ndim) {
  int n = 0;
  out[n++] = p.batch;
  // Runs before validate_problem (the tensor checks are built first): an invalid rank must not
  // index past shape[] or out[].
  for (int i = 0; i < p.rank && i < kMaxRank; ++i) out[n++] = p.shape[i];
  out[n++] = heads;
  out[n++] = dim;
  *ndim = n;
}

void extents_lse(const Problem& p, int64_t* out, int* ndim) {
  int n = 0;
  out[n++] = p.batch;
  for (int i = 0; i < p.rank && i < kMaxRank; ++i) out[n++] = p.shape[i];
  out[n++] = p.heads;
  *ndim = n;
}

void extents_add(const Problem& p, int64_t dim, int64_t* out, int* ndim) {
  out[0] = p.batch;
  out[1] = p.num_additional;
  out[2] = p.heads_kv;
  out[3] = dim;
  *ndim = 4;
}

Status check_tensor(const TensorCheck& t, const Options& opt) {
  if (t.ref->data == nullptr) {
    if (t.required) return invalid(std::string(t.name) + " is a null pointer");
    return Status::Ok();
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(t.ref->data);
  if (addr % static_cast<std::uintptr_t>(t.elem_size) != 0)
    return invalid(std::string(t.name) + " pointer " + str(t.ref->data) +
                   " is not aligned to its element size " + str(t.elem_size));
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t s = t.ref->strides[d];
    // Outputs must not alias themselves: every dimension of extent > 1 needs a positive stride.
    if (t.output && t.extents[d] > 1 && s < 1)
      return invalid(std::string(t.name) + " stride[" + str(d) + "]=" + str(s) +
                     " must be >= 1 for an output of extent " + str(t.extents[d]));
  }
  if (opt.device == Device::cuda) {
    Status st = cuda_check_pointer(t.ref->data, opt.device_index, t.name);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status validate_options(const Problem& p, const Options& opt, Backend* resolved, bool unfused) {
  if (!(opt.scale <= 0.0 || std::isfinite(opt.scale)) || std::isnan(opt.scale))
    return invalid("scale=" + str(opt.scale) + " must be finite");
  if (opt.num_threads < 0)
    return invalid("num_threads=" + str(opt.num_threads) + " must be >= 0");
  if (opt.device != Device::cpu && opt.device != Device::cuda)
    return invalid("device=" + str(static_cast<int>(opt.device)) + " is not cpu or cuda");
  const int b = static_cast<int>(opt.backend);
  if (b < 0 || b > static_cast<int>(Backend::cuda_fused))
    return {Code::unsupported, "backend=" + str(b) + " is not a known backend"};
  Backend r = resolve_backend(opt.backend, opt.device);
  // For the unfused operators `auto` means the best backend that has them.
  if (unfused && opt.backend == Backend::automatic && r == Backend::cuda_fused)
    r = Backend::cuda_naive;
  if (!backend_compiled(r))
    return {Code::not_compiled, std::string("backend=") + backend_name(r) +
                                    " is not compiled into this build of fna"};
  // Checked before any device is touched, so that a wrong name reads as such everywhere.
  if (!opt.backward_config.empty()) {
    if (r != Backend::cuda_fused)
      return invalid("backward_config='" + opt.backward_config +
                     "' names a cuda-fused backward tile configuration, but backend=" +
                     backend_name(r) + " runs this call");
    const int64_t dim = std::max(p.dim, p.dim_v);
    const std::vector<std::string> names = cuda_fused_backward_configs(p.rank, p.dtype, dim);
    std::string valid;
    bool found = false;
    for (const std::string& n : names) {
      found = found || n == opt.backward_config;
      valid += (valid.empty() ? "" : ", ") + n;
    }
    if (!found)
      return invalid("backward_config='" + opt.backward_config +
                     "' is not a cuda-fused backward configuration for rank=" + str(p.rank) +
                     ", dtype=" + dtype_name(p.dtype) + ", dim=" + str(dim) +
                     "; valid: " + (valid.empty() ? "(none)" : valid));
  }
  const bool cuda_backend = r == Backend::cuda_naive || r == Backend::cuda_fused;
  if (cuda_backend && opt.device != Device::cuda)
    return invalid(std::string("backend=") + backend_name(r) +
                   " needs CUDA tensors, but the tensors are on the CPU");
  if (!cuda_backend && opt.device == Device::cuda)
    return invalid(std::string("backend=") + backend_name(r) +
                   " runs on the CPU, but the tensors are on a CUDA device");
  if (cuda_backend && !cuda_device_available())
    return {Code::runtime_error,
            std::string("backend=") + backend_name(r) + " needs a CUDA device, but none is visible"};
  if (unfused && r == Backend::cuda_fused)
    return {Code::unsupported,
            "backend=cuda-fused has no unfused (qk / av) operators; use cuda-naive or cpu"};
  if (!opt.config.empty() && r != Backend::cuda_fused)
    return invalid("config='" + opt.config + "' names a cuda-fused tile configuration, but backend=" +
                   backend_name(r) + " runs this call");
  Status st = validate_tuning(p, opt.tuning, r, unfused);
  if (!st.ok()) return st;
  *resolved = r;
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
