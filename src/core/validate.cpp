#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <utility>

#include "core/backends.h"

namespace fna {

namespace {

// prod(v[0..rank)), saturating at INT64_MAX (these run before validation too: the tensor checks
// are built first, and a hostile shape must not wrap to a small product).
int64_t saturating_product(const int64_t* v, int rank) {
  int64_t n = 1;
  for (int i = 0; i < rank && i < kMaxRank; ++i)
    if (__builtin_mul_overflow(n, v[i], &n)) return INT64_MAX;
  return n;
}

}  // namespace

int64_t Problem::tokens() const { return saturating_product(shape, rank); }

int64_t Problem::window() const { return saturating_product(kernel_size, rank); }

int64_t Problem::query_extent(int a) const {
  return query_shape[a] != 0 ? query_shape[a] : shape[a] - query_offset[a];
}

int64_t Problem::query_tokens() const {
  int64_t e[kMaxRank] = {1, 1, 1};
  for (int a = 0; a < rank && a < kMaxRank; ++a) e[a] = query_extent(a);
  return saturating_product(e, rank);
}

bool Problem::has_query_region() const {
  bool whole = true;
  for (int a = 0; a < rank && a < kMaxRank; ++a)
    whole = whole && query_offset[a] == 0 && query_extent(a) == shape[a];
  return !whole;
}

namespace {

Status invalid(const std::string& msg) { return {Code::invalid_argument, msg}; }

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// a * b, false where it overflows int64.
bool mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Every size the kernels narrow to 32-bit int (heads, head dims, additional keys, per-axis
// lengths and parameters) is at most this; products of them are checked separately.
constexpr int64_t kMaxSize = int64_t(1) << 30;
// The largest scale whose scale * log2(e) (the kernels' float32 factor) is finite.
constexpr double kMaxScale = 3.4028234663852886e38 / 1.4426950408889634;
// The most bytes one tensor may span (its element count times the element size, and its largest
// offset from the data pointer): far above any memory, far below int64 overflow.
constexpr int64_t kMaxBytes = int64_t(1) << 62;

Status size_in_range(const char* name, int64_t v, int64_t lo) {
  if (v < lo || v > kMaxSize)
    return invalid(std::string(name) + "=" + str(v) + " must be in [" + str(lo) + ", 2^30]");
  return Status::Ok();
}

}  // namespace

Status validate_problem(const Problem& p) {
  if (p.rank < 1 || p.rank > kMaxRank)
    return invalid("rank=" + str(p.rank) + " must be 1, 2 or 3");
  // Sizes the kernels hold in 32-bit ints are bounded here, once for every backend, so that no
  // narrowing can wrap (a head dim of 2^32 + 1 must not run as 1).
  const std::pair<const char*, int64_t> sizes[] = {{"batch", p.batch}, {"heads", p.heads},
                                                   {"heads_kv", p.heads_kv}, {"dim", p.dim},
                                                   {"dim_v", p.dim_v}};
  for (const auto& s : sizes) {
    if (s.second < 1) return invalid(std::string(s.first) + "=" + str(s.second) + " must be >= 1");
    if (Status st = size_in_range(s.first, s.second, 1); !st.ok()) return st;
  }
  if (p.heads % p.heads_kv != 0)
    return invalid("heads=" + str(p.heads) + " is not a multiple of heads_kv=" + str(p.heads_kv) +
                   " (H % H_kv must be 0)");
  if (p.num_additional < 0)
    return invalid("num_additional=" + str(p.num_additional) + " must be >= 0");
  if (Status st = size_in_range("num_additional", p.num_additional, 0); !st.ok()) return st;
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
    // K * d > L without forming K * d (which can wrap: 2^32 * 2^32 is 0 in int64); for positive
    // integers K * d > L exactly when K > floor(L / d). Bounds K and d by L <= 2^30 too.
    if (p.kernel_size[i] > p.shape[i] / p.dilation[i])
      return invalid("kernel_size" + ax + "=" + str(p.kernel_size[i]) + " * dilation" + ax + "=" +
                     str(p.dilation[i]) + " exceeds input length " + str(p.shape[i]));
    if (p.stride[i] < 1 || p.stride[i] > p.kernel_size[i])
      return invalid("stride" + ax + "=" + str(p.stride[i]) + " must be in [1, kernel_size" + ax +
                     "=" + str(p.kernel_size[i]) + "]");
  }
  for (int i = 0; i < p.rank; ++i) {
    const std::string ax = "[" + str(i) + "]";
    if (p.query_offset[i] < 0 || p.query_offset[i] >= p.shape[i])
      return invalid("query_offset" + ax + "=" + str(p.query_offset[i]) + " must be in [0, shape" +
                     ax + "=" + str(p.shape[i]) + ")");
    if (p.query_shape[i] < 0 || p.query_shape[i] > p.shape[i] - p.query_offset[i])
      return invalid("query_shape" + ax + "=" + str(p.query_shape[i]) + " must be in [1, shape" +
                     ax + " - query_offset" + ax + " = " + str(p.shape[i] - p.query_offset[i]) +
                     "] (0: the rest of the axis)");
  }
  // The largest tensors of a call (query / output [B, *shape, H, D or D_v], key / value with
  // H_kv) must be addressable: their element counts and byte sizes may not overflow int64.
  // (The window is at most the token count, so attention rows are checked with their tensors.)
  int64_t elems = p.batch;
  const int64_t dmax = std::max(p.dim, p.dim_v);
  bool fits = true;
  for (int i = 0; i < p.rank; ++i) fits = fits && mul(elems, p.shape[i], &elems);
  fits = fits && mul(elems, p.heads, &elems) && mul(elems, dmax, &elems);
  int64_t bytes = 0;
  fits = fits && mul(elems, detail::dtype_size(p.dtype), &bytes) && bytes <= kMaxBytes;
  if (!fits) {
    std::string ext = "batch=" + str(p.batch);
    for (int i = 0; i < p.rank; ++i) ext += " * shape[" + str(i) + "]=" + str(p.shape[i]);
    return invalid(ext + " * heads=" + str(p.heads) + " * max(dim, dim_v)=" + str(dmax) +
                   " elements of " + dtype_name(p.dtype) + " exceed 2^62 bytes");
  }
  return Status::Ok();
}

Status validate_backend_limits(const Problem& p, Backend b) {
  Status st = validate_problem(p);
  if (!st.ok()) return st;
  constexpr int64_t kInt32Max = 2147483647;
  if (b == Backend::cuda_naive || b == Backend::cuda_gemm) {
    // make_geometry holds W + N_add (one row of attention weights) in an int.
    const int64_t cols = p.window() + p.num_additional;  // window() <= tokens() <= 2^62
    if (cols > kInt32Max)
      return {Code::unsupported, "window=" + str(p.window()) + " + num_additional=" +
                                     str(p.num_additional) + " = " + str(cols) +
                                     " exceeds backend=" + backend_name(b) + "'s limit of 2^31 - 1"};
  } else if (b == Backend::cuda_fused) {
    // ProblemBlock::groups (Geometry::num_groups) is an int.
    int64_t groups = 1;
    for (int i = 0; i < p.rank; ++i) groups *= p.dilation[i];  // each <= 2^30, rank <= 3: no wrap
    if (groups > kInt32Max)
      return {Code::unsupported, "the product of the dilations (dilation groups) = " + str(groups) +
                                     " exceeds backend=cuda-fused's limit of 2^31 - 1"};
  }
  return Status::Ok();
}

namespace detail {

void extents_qo(const Problem& p, int64_t heads, int64_t dim, int64_t* out, int* ndim,
                bool region) {
  int n = 0;
  out[n++] = p.batch;
  // Runs before validate_problem (the tensor checks are built first): an invalid rank must not
  // index past shape[] or out[].
  for (int i = 0; i < p.rank && i < kMaxRank; ++i) out[n++] = region ? p.query_extent(i) : p.shape[i];
  out[n++] = heads;
  out[n++] = dim;
  *ndim = n;
}

void extents_lse(const Problem& p, int64_t* out, int* ndim) {
  int n = 0;
  out[n++] = p.batch;
  for (int i = 0; i < p.rank && i < kMaxRank; ++i) out[n++] = p.query_extent(i);
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
  // The farthest element from the data pointer, sum_d (extent_d - 1) * |stride_d| elements,
  // times the element size: the backends form these offsets in int64, so a hostile stride (or an
  // extent * stride product) that wraps is an error here, not a wild pointer there.
  int64_t reach = 0;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t s = t.ref->strides[d];
    // Outputs must not alias themselves: every dimension of extent > 1 needs a positive stride.
    if (t.output && t.extents[d] > 1 && s < 1)
      return invalid(std::string(t.name) + " stride[" + str(d) + "]=" + str(s) +
                     " must be >= 1 for an output of extent " + str(t.extents[d]));
    if (t.extents[d] <= 1) continue;
    int64_t span = 0;
    const bool ok = s != INT64_MIN && mul(t.extents[d] - 1, s < 0 ? -s : s, &span) &&
                    mul(span, t.elem_size, &span) && span <= kMaxBytes &&
                    !__builtin_add_overflow(reach, span, &reach) && reach <= kMaxBytes;
    if (!ok)
      return invalid(std::string(t.name) + " extent " + str(t.extents[d]) + " * stride[" + str(d) +
                     "]=" + str(s) + " reaches beyond 2^62 bytes from its data pointer");
  }
  if (opt.device == Device::cuda) {
    Status st = cuda_check_pointer(t.ref->data, opt.device_index, t.name);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status check_num_threads(int64_t n, const char* name) {
  if (n < 0 || n > kMaxThreads)
    return invalid(std::string(name) + "=" + str(n) + " must be in [0, " + str(kMaxThreads) +
                   "] (0: the process-wide count, fna::get_num_threads())");
  return Status::Ok();
}

Status validate_options(const Problem& p, const Options& opt, Backend* resolved, bool unfused) {
  if (!(opt.scale <= 0.0 || std::isfinite(opt.scale)) || std::isnan(opt.scale))
    return invalid("scale=" + str(opt.scale) + " must be finite");
  if (opt.scale > kMaxScale)
    return invalid("scale=" + str(opt.scale) + " must be at most " + str(kMaxScale) +
                   " (scale * log2(e) must fit in float32)");
  if (Status st = check_num_threads(opt.num_threads); !st.ok()) return st;
  if (opt.device != Device::cpu && opt.device != Device::cuda)
    return invalid("device=" + str(static_cast<int>(opt.device)) + " is not cpu or cuda");
  const int b = static_cast<int>(opt.backend);
  if (b < 0 || b > static_cast<int>(Backend::cuda_gemm))
    return {Code::unsupported, "backend=" + str(b) + " is not a known backend"};
  Backend r = resolve_backend(opt.backend, opt.device);
  // For the unfused operators `auto` means the best backend that has them: on CUDA the GEMM
  // kernels (which answer `unsupported` where they cannot run, and the dispatcher then runs
  // cuda-naive's).
  if (unfused && opt.backend == Backend::automatic &&
      (r == Backend::cuda_fused || r == Backend::cuda_naive))
    r = Backend::cuda_gemm;
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
  const bool cuda_backend =
      r == Backend::cuda_naive || r == Backend::cuda_fused || r == Backend::cuda_gemm;
  if (cuda_backend && opt.device != Device::cuda)
    return invalid(std::string("backend=") + backend_name(r) +
                   " needs CUDA tensors, but the tensors are on the CPU");
  if (!cuda_backend && opt.device == Device::cuda)
    return invalid(std::string("backend=") + backend_name(r) +
                   " runs on the CPU, but the tensors are on a CUDA device");
  if (cuda_backend && !cuda_device_available())
    return {Code::runtime_error,
            std::string("backend=") + backend_name(r) + " needs a CUDA device, but none is visible"};
  if (unfused && p.has_query_region())
    return invalid("query_offset / query_shape: a query region is taken by the fused attention "
                   "(forward / backward), not by the unfused (qk / av) operators");
  if (unfused && p.rpb)
    return invalid("problem.rpb=true: the unfused operators take no Problem::rpb flag (qk takes "
                   "its bias table as QKArgs::rpb)");
  if (unfused && r == Backend::cuda_fused)
    return {Code::unsupported,
            "backend=cuda-fused has no unfused (qk / av) operators; use cuda-gemm, cuda-naive or cpu"};
  if (!opt.config.empty() && r != Backend::cuda_fused)
    return invalid("config='" + opt.config + "' names a cuda-fused tile configuration, but backend=" +
                   backend_name(r) + " runs this call");
  // The kernels' size limits, before any kernel runs. `auto` that resolved to cuda-fused falls
  // back to cuda-naive for problems the fused kernels do not take (their plans answer
  // `unsupported`), so it fails here only where neither backend can index the problem.
  Status lim = validate_backend_limits(p, r);
  if (!lim.ok() && opt.backend == Backend::automatic && r == Backend::cuda_fused) {
    lim = validate_backend_limits(p, Backend::cuda_naive);
  }
  if (!lim.ok()) return lim;
  Status st = validate_tuning(p, opt.tuning, r, unfused);
  if (!st.ok()) return st;
  *resolved = r;
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
