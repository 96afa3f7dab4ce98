// The API boundary: validate once, resolve the backend and the scale, dispatch.
#include <cmath>
#include <string>

#include "core/autotune.h"
#include "core/backends.h"
#include "core/validate.h"
#include "cpu/pool.h"
#include "fna/fna.h"

namespace fna {

namespace {

using detail::TensorCheck;

// Whether Options::tuning asks anything of the fused kernels beyond how to pick among them (the
// autotuner's mode, cache and budget): then `auto` must not fall back to the naive kernels,
// which would ignore it.
bool tuning_binds_fused(const Tuning& t) { return !tuning_string(detail::kernel_tuning(t)).empty(); }

TensorCheck make(const char* name, const TensorRef& ref, const Problem& p, int role_heads,
                 int64_t dim, bool output, bool required, int64_t elem) {
  TensorCheck t{name, &ref, 0, {}, elem, output, required};
  int64_t heads = role_heads == 0 ? p.heads : p.heads_kv;
  detail::extents_qo(p, heads, dim, t.extents, &t.ndim, role_heads == 0);
  return t;
}

TensorCheck make_lse(const char* name, const TensorRef& ref, const Problem& p, bool output,
                     bool required) {
  TensorCheck t{name, &ref, 0, {}, 4, output, required};
  detail::extents_lse(p, t.extents, &t.ndim);
  return t;
}

TensorCheck make_add(const char* name, const TensorRef& ref, const Problem& p, int64_t dim,
                     bool output, int64_t elem) {
  TensorCheck t{name, &ref, 0, {}, elem, output, p.num_additional > 0};
  detail::extents_add(p, dim, t.extents, &t.ndim);
  return t;
}

TensorCheck make_attn(const char* name, const TensorRef& ref, const Problem& p, bool output,
                      int64_t elem) {
  TensorCheck t{name, &ref, 0, {}, elem, output, true};
  detail::extents_qo(p, p.heads, p.window() + p.num_additional, t.extents, &t.ndim);
  return t;
}

// The bias table of ForwardArgs::rpb: [H, 2 K_a - 1 ..], float32.
// Built before validate_problem runs (as the other checks): an invalid rank must not index past
// kernel_size[] or extents[], nor a hostile kernel size overflow (the problem's error comes first).
TensorCheck make_rpb(const char* name, const TensorRef& ref, const Problem& p, bool output,
                     bool required) {
  TensorCheck t{name, &ref, 1, {}, 4, output, required};
  t.extents[0] = p.heads;
  for (int a = 0; a < p.rank && a < kMaxRank; ++a) {
    const int64_t k = p.kernel_size[a];
    t.extents[t.ndim++] = k >= 1 && k <= (int64_t(1) << 40) ? 2 * k - 1 : 1;
  }
  return t;
}

Status no_rpb(Backend b) {
  return {Code::unsupported, std::string("rpb: backend=") + backend_name(b) +
                                 " does not take a relative positional bias (backends reference, "
                                 "cpu and cuda-fused do)"};
}

// The problem of a call with bias table `rpb` (null: none): Problem::rpb set from it; the flag
// without a table is an error.
Status with_bias(const Problem& p, const TensorRef& rpb, Problem* out) {
  if (p.rpb && rpb.data == nullptr)
    return {Code::invalid_argument,
            "problem.rpb=true but rpb is a null pointer (the flag announces a bias table)"};
  *out = p;
  out->rpb = rpb.data != nullptr;
  return Status::Ok();
}

// Validates the problem, options and every tensor; resolves backend and scale into `out`.
template <size_t N>
Status prepare(const Problem& p, const Options& opt, const TensorCheck (&checks)[N], bool unfused,
               Backend* backend, Options* out) {
  Status st = validate_problem(p);
  if (!st.ok()) return st;
  st = detail::validate_options(p, opt, backend, unfused);
  if (!st.ok()) return st;
  for (const auto& c : checks) {
    st = detail::check_tensor(c, opt);
    if (!st.ok()) return st;
  }
  *out = opt;
  out->backend = *backend;
  if (!(out->scale > 0.0)) out->scale = 1.0 / std::sqrt(static_cast<double>(p.dim));
  return Status::Ok();
}

// The backends whose forward / backward take a query region (Problem::query_offset /
// query_shape); the others answer `unsupported`, naming the backends that do.
bool takes_query_region(Backend b) {
  switch (b) {
    case Backend::reference:
    case Backend::cpu:
    case Backend::cuda_naive:
    case Backend::cuda_fused: return true;
    default: return false;  // cuda-gemm: whole grids only
  }
}

Status no_query_region(Backend b) {
  return {Code::unsupported, std::string("query_offset / query_shape: backend=") + backend_name(b) +
                                 " does not take a query region"};
}

Status no_unfused(Backend b) {
  return {Code::unsupported,
          std::string("backend=") + backend_name(b) + " has no unfused (qk / av) operators"};
}

}  // namespace

// The backends whose forward / backward add a relative positional bias (ForwardArgs::rpb).
bool takes_rpb(Backend b) {
  return b == Backend::reference || b == Backend::cpu || b == Backend::cuda_fused;
}

Status forward(const Problem& p_in, const ForwardArgs& a, const Options& opt) {
  Problem p;
  Status bst = with_bias(p_in, a.rpb, &p);
  if (!bst.ok()) return bst;
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make("query", a.q, p, 0, p.dim, false, true, e),
      make("key", a.k, p, 1, p.dim, false, true, e),
      make("value", a.v, p, 1, p.dim_v, false, true, e),
      make("output", a.o, p, 0, p.dim_v, true, true, e),
      make_lse("lse", a.lse, p, true, false),
      make_add("additional_keys", a.add_k, p, p.dim, false, e),
      make_add("additional_values", a.add_v, p, p.dim_v, false, e),
      make_rpb("rpb", a.rpb, p, false, false),
  };
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, false, &b, &o);
  if (!st.ok()) return st;
  if (p.has_query_region() && !takes_query_region(b)) return no_query_region(b);
  if (a.rpb.data && !takes_rpb(b)) return no_rpb(b);
  switch (b) {
    case Backend::reference: return detail::reference_forward(p, a, o);
    case Backend::cpu: return detail::cpu_forward(p, a, o);
    case Backend::cuda_naive: return detail::cuda_naive_forward(p, a, o);
    case Backend::cuda_gemm: return detail::cuda_gemm_forward(p, a, o);
    case Backend::cuda_fused: {
      st = detail::cuda_fused_forward(p, a, o);
      // `auto` falls back to the naive kernels for problems the fused tiles do not cover, unless
      // the caller named a fused configuration or tuning (which the naive kernels would ignore)
      // or gave a bias (which they do not add).
      if (st.code == Code::unsupported && opt.backend == Backend::automatic && opt.config.empty() &&
          !tuning_binds_fused(opt.tuning) && (!p.rpb || takes_rpb(Backend::cuda_naive)))
        return detail::cuda_naive_forward(p, a, o);
      return st;
    }
    default: return {Code::unsupported, "backend could not be resolved"};
  }
}

Status backward(const Problem& p_in, const BackwardArgs& a, const Options& opt) {
  Problem p;
  Status bst = with_bias(p_in, a.rpb, &p);
  if (!bst.ok()) return bst;
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make("query", a.q, p, 0, p.dim, false, true, e),
      make("key", a.k, p, 1, p.dim, false, true, e),
      make("value", a.v, p, 1, p.dim_v, false, true, e),
      make("output", a.o, p, 0, p.dim_v, false, true, e),
      make("d_output", a.d_o, p, 0, p.dim_v, false, true, e),
      make_lse("lse", a.lse, p, false, true),
      make_lse("d_lse", a.d_lse, p, false, false),
      make("d_query", a.dq, p, 0, p.dim, true, true, e),
      make("d_key", a.dk, p, 1, p.dim, true, true, e),
      make("d_value", a.dv, p, 1, p.dim_v, true, true, e),
      make_add("additional_keys", a.add_k, p, p.dim, false, e),
      make_add("additional_values", a.add_v, p, p.dim_v, false, e),
      make_add("d_additional_keys", a.d_add_k, p, p.dim, true, e),
      make_add("d_additional_values", a.d_add_v, p, p.dim_v, true, e),
      make_rpb("rpb", a.rpb, p, false, false),
      make_rpb("d_rpb", a.d_rpb, p, true, a.rpb.data != nullptr),
  };
  if (a.d_rpb.data && !a.rpb.data)
    return {Code::invalid_argument, "d_rpb is given but rpb is a null pointer (the gradient of a "
                                    "bias needs the bias)"};
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, false, &b, &o);
  if (!st.ok()) return st;
  if (p.has_query_region() && !takes_query_region(b)) return no_query_region(b);
  if (a.rpb.data && !takes_rpb(b)) return no_rpb(b);
  switch (b) {
    case Backend::reference: return detail::reference_backward(p, a, o);
    case Backend::cpu: return detail::cpu_backward(p, a, o);
    case Backend::cuda_naive: return detail::cuda_naive_backward(p, a, o);
    case Backend::cuda_gemm: return detail::cuda_gemm_backward(p, a, o);
    case Backend::cuda_fused: {
      st = detail::cuda_fused_backward(p, a, o);
      // As in the forward: no silent fallback from a named backward configuration.
      if (st.code == Code::unsupported && opt.backend == Backend::automatic &&
          opt.backward_config.empty() && !tuning_binds_fused(opt.tuning) &&
          (!p.rpb || takes_rpb(Backend::cuda_naive)))
        return detail::cuda_naive_backward(p, a, o);
      return st;
    }
    default: return {Code::unsupported, "backend could not be resolved"};
  }
}

// Unfused ops: `scale` is applied by qk only when given explicitly (> 0).
#define FNA_UNFUSED_DISPATCH(fn, args)                                        \
  switch (b) {                                                                \
    case Backend::reference: return detail::reference_##fn(p, args, o);       \
    case Backend::cpu: return detail::cpu_##fn(p, args, o);                   \
    case Backend::cuda_naive: return detail::cuda_naive_##fn(p, args, o);     \
    case Backend::cuda_gemm: {                                                \
      /* `auto` runs the naive kernels where the GEMM ones cannot (old GPU, D > 256) */ \
      const Status gst = detail::cuda_gemm_##fn(p, args, o);                  \
      if (gst.code == Code::unsupported && opt.backend == Backend::automatic) \
        return detail::cuda_naive_##fn(p, args, o);                           \
      return gst;                                                             \
    }                                                                         \
    default: return no_unfused(b);                                            \
  }

Status qk_forward(const Problem& p, const QKArgs& a, const Options& opt) {
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make("query", a.q, p, 0, p.dim, false, true, e),
      make("key", a.k, p, 1, p.dim, false, true, e),
      make_add("additional_keys", a.add_k, p, p.dim, false, e),
      make_attn("attn", a.attn, p, true, e),
      make_rpb("rpb", a.rpb, p, false, false),
  };
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, true, &b, &o);
  if (!st.ok()) return st;
  if (!(opt.scale > 0.0)) o.scale = 1.0;
  FNA_UNFUSED_DISPATCH(qk_forward, a)
}

Status qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt) {
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make("query", a.q, p, 0, p.dim, false, true, e),
      make("key", a.k, p, 1, p.dim, false, true, e),
      make_add("additional_keys", a.add_k, p, p.dim, false, e),
      make_attn("d_attn", a.d_attn, p, false, e),
      make("d_query", a.dq, p, 0, p.dim, true, true, e),
      make("d_key", a.dk, p, 1, p.dim, true, true, e),
      make_add("d_additional_keys", a.d_add_k, p, p.dim, true, e),
  };
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, true, &b, &o);
  if (!st.ok()) return st;
  if (!(opt.scale > 0.0)) o.scale = 1.0;
  FNA_UNFUSED_DISPATCH(qk_backward, a)
}

Status av_forward(const Problem& p, const AVArgs& a, const Options& opt) {
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make_attn("attn", a.attn, p, false, e),
      make("value", a.v, p, 1, p.dim_v, false, true, e),
      make_add("additional_values", a.add_v, p, p.dim_v, false, e),
      make("output", a.o, p, 0, p.dim_v, true, true, e),
  };
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, true, &b, &o);
  if (!st.ok()) return st;
  FNA_UNFUSED_DISPATCH(av_forward, a)
}

Status av_backward(const Problem& p, const AVBackwardArgs& a, const Options& opt) {
  const int64_t e = detail::dtype_size(p.dtype);
  const TensorCheck checks[] = {
      make_attn("attn", a.attn, p, false, e),
      make("value", a.v, p, 1, p.dim_v, false, true, e),
      make_add("additional_values", a.add_v, p, p.dim_v, false, e),
      make("d_output", a.d_o, p, 0, p.dim_v, false, true, e),
      make_attn("d_attn", a.d_attn, p, true, e),
      make("d_value", a.dv, p, 1, p.dim_v, true, true, e),
      make_add("d_additional_values", a.d_add_v, p, p.dim_v, true, e),
  };
  Backend b;
  Options o;
  Status st = prepare(p, opt, checks, true, &b, &o);
  if (!st.ok()) return st;
  FNA_UNFUSED_DISPATCH(av_backward, a)
}
#undef FNA_UNFUSED_DISPATCH

TensorRef dense(void* data, const std::vector<int64_t>& extents) {
  TensorRef t;
  t.data = data;
  int64_t s = 1;
  for (int d = static_cast<int>(extents.size()) - 1; d >= 0; --d) {
    if (d < kMaxDims) t.strides[d] = s;
    s *= extents[d];
  }
  return t;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda_naive: return "cuda-naive";
    case Backend::cuda_fused: return "cuda-fused";
    case Backend::cuda_gemm: return "cuda-gemm";
  }
  return "unknown";
}

Status parse_backend(const std::string& name, Backend* out) {
  const Backend all[] = {Backend::automatic, Backend::reference, Backend::cpu, Backend::cuda_naive,
                         Backend::cuda_fused, Backend::cuda_gemm};
  for (Backend b : all) {
    if (name == backend_name(b)) {
      *out = b;
      return Status::Ok();
    }
  }
  if (name == "automatic" || name.empty()) {
    *out = Backend::automatic;
    return Status::Ok();
  }
  return {Code::invalid_argument,
          "backend='" + name +
              "' is not one of auto, reference, cpu, cuda-naive, cuda-fused, cuda-gemm"};
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "unknown";
}

bool backend_compiled(Backend b) {
  switch (b) {
    case Backend::automatic:
    case Backend::reference:
    case Backend::cpu: return true;
#if defined(FNA_WITH_CUDA)
    case Backend::cuda_naive:
    case Backend::cuda_gemm: return true;
#if defined(FNA_WITH_CUDA_FUSED)
    case Backend::cuda_fused: return true;
#endif
#endif
    default: return false;
  }
}

bool cuda_available() { return detail::cuda_device_available(); }

Backend resolve_backend(Backend requested, Device device) {
  if (requested != Backend::automatic) return requested;
  if (device == Device::cpu) return Backend::cpu;
  if (backend_compiled(Backend::cuda_fused)) return Backend::cuda_fused;
  return Backend::cuda_naive;
}

std::vector<std::string> fused_configs(int rank, DType dtype, int64_t dim) {
#if defined(FNA_WITH_CUDA_FUSED)
  return detail::cuda_fused_configs(rank, dtype, dim);
#else
  (void)rank; (void)dtype; (void)dim;
  return {};
#endif
}

std::vector<std::string> fused_backward_configs(int rank, DType dtype, int64_t dim) {
#if defined(FNA_WITH_CUDA_FUSED)
  return detail::cuda_fused_backward_configs(rank, dtype, dim);
#else
  (void)rank; (void)dtype; (void)dim;
  return {};
#endif
}

Status fused_plan(const Problem& p, const Options& opt, FusedPlan* out) {
  if (out == nullptr) return {Code::invalid_argument, "out is a null pointer"};
  Status st = validate_problem(p);
  if (!st.ok()) return st;
  if (!backend_compiled(Backend::cuda_fused))
    return {Code::not_compiled, "backend=cuda-fused is not compiled into this build of fna"};
  if (!cuda_available())
    return {Code::runtime_error, "backend=cuda-fused needs a CUDA device, but none is visible"};
  return detail::cuda_fused_plan(p, opt, out);
}

Status set_num_threads(int num_threads) {
  Status st = detail::check_num_threads(num_threads);
  if (!st.ok()) return st;
  cpu::set_default_threads(num_threads);
  return Status::Ok();
}

int get_num_threads() { return cpu::default_threads(); }

// The one version string: CMakeLists.txt's project(fna VERSION x.y.z), passed as a definition
// (builds outside CMake, e.g. tools/experiments/cpu_builds_ab.sh, report "unknown").
#ifndef FNA_VERSION_STRING
#define FNA_VERSION_STRING "unknown"
#endif
const char* version() { return FNA_VERSION_STRING; }

}  // namespace fna
