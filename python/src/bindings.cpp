// fna._C: the Python binding of the C++ API. Tensors arrive as DLPack arrays (NumPy, torch, CPU or
// CUDA) and are passed to the library zero-copy as (pointer, strides). The C++ API never allocates,
// so every output is allocated by the Python side and passed in.
//
// The C++ TensorRef carries no extents (they are implied by the tensor's role), so this file is the
// place where each array's shape is checked against its role: a wrong shape here would otherwise
// be an out-of-bounds access, not an error.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "core/launch_record.h"
#include "core/validate.h"

#include "fna/fna.h"
#include "bindings.h"

namespace nb = nanobind;

namespace {

// Inputs are read-only views so read-only NumPy arrays are accepted; outputs must be writable.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

// DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 (pinned host memory).
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAHost = 3;

[[noreturn]] void raise(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

// Status codes map to Python exception types; the message is the library's own.
void check(const fna::Status& st) {
  if (st.ok()) return;
  switch (st.code) {
    case fna::Code::invalid_argument: raise(PyExc_ValueError, st.message);
    case fna::Code::unsupported:
      // An unsupported dtype is a type problem; other unsupported inputs are missing features.
      if (st.message.rfind("dtype", 0) == 0) raise(PyExc_TypeError, st.message);
      raise(PyExc_NotImplementedError, st.message);
    case fna::Code::not_compiled: raise(PyExc_NotImplementedError, st.message);
    default: raise(PyExc_RuntimeError, st.message);
  }
}

std::string dtype_str(nb::dlpack::dtype t) {
  std::string name;
  switch (t.code) {
    case 0: name = "int" + std::to_string(static_cast<int>(t.bits)); break;
    case 1: name = "uint" + std::to_string(static_cast<int>(t.bits)); break;
    case 2: name = "float" + std::to_string(static_cast<int>(t.bits)); break;
    case 4: name = "bfloat" + std::to_string(static_cast<int>(t.bits)); break;
    case 5: name = "complex" + std::to_string(static_cast<int>(t.bits)); break;
    case 6: name = "bool"; break;
    // DLPack's low-precision float codes (dlpack.h DLDataTypeCode, v1.1), which nanobind's enum
    // does not name: torch exports its float8 types with these.
    case 7: name = "float8_e3m4"; break;
    case 8: name = "float8_e4m3"; break;
    case 9: name = "float8_e4m3b11fnuz"; break;
    case 10: name = "float8_e4m3fn"; break;
    case 11: name = "float8_e4m3fnuz"; break;
    case 12: name = "float8_e5m2"; break;
    case 13: name = "float8_e5m2fnuz"; break;
    case 14: name = "float8_e8m0fnu"; break;
    case 15: name = "float6_e2m3fn"; break;
    case 16: name = "float6_e3m2fn"; break;
    case 17: name = "float4_e2m1fn"; break;
    default:
      name = "(DLPack type code " + std::to_string(static_cast<int>(t.code)) + ", " +
             std::to_string(static_cast<int>(t.bits)) + " bits)";
  }
  if (t.lanes != 1) name += "x" + std::to_string(static_cast<int>(t.lanes));
  return name;
}

bool to_dtype(nb::dlpack::dtype t, fna::DType* out) {
  if (t.lanes != 1) return false;
  if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 32) {
    *out = fna::DType::f32;
  } else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16) {
    *out = fna::DType::f16;
  } else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) {
    *out = fna::DType::bf16;
  } else {
    return false;
  }
  return true;
}

template <typename A>
std::string shape_str(const A& a) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << (a.ndim() == 1 ? ",)" : ")");
  return os.str();
}

std::string extents_str(const std::vector<int64_t>& e) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < e.size(); ++i) os << (i ? ", " : "") << e[i];
  os << (e.size() == 1 ? ",)" : ")");
  return os.str();
}

// Spatial parameters as the Python layer passes them: one entry per axis.
struct Spatial {
  std::vector<int64_t> kernel_size, stride, dilation;
  std::vector<bool> is_causal;
};

struct Call {
  fna::Problem p;
  fna::Options opt;
  bool have_device = false;
  const char* first_name = nullptr;
  int dev_type = 0, dev_id = 0;

  // Device of every array must agree; the first array seen sets it.
  template <typename A>
  void note_device(const char* name, const A& a) {
    const int t = a.device_type() == kDLCUDAHost ? kDLCPU : a.device_type();
    if (t != kDLCPU && t != kDLCUDA)
      raise(PyExc_ValueError, std::string(name) + " lives on DLPack device type " +
                                  std::to_string(a.device_type()) +
                                  "; fna supports CPU and CUDA memory");
    const int id = t == kDLCPU ? 0 : a.device_id();
    if (!have_device) {
      have_device = true;
      first_name = name;
      dev_type = t;
      dev_id = id;
      opt.device = t == kDLCUDA ? fna::Device::cuda : fna::Device::cpu;
      opt.device_index = id;
      return;
    }
    if (t != dev_type || id != dev_id) {
      auto where = [](int type, int idx) {
        return type == kDLCUDA ? "cuda:" + std::to_string(idx) : std::string("cpu");
      };
      raise(PyExc_ValueError, std::string(name) + " is on " + where(t, id) + " but " + first_name +
                                  " is on " + where(dev_type, dev_id) +
                                  "; all tensors must be on one device");
    }
  }

  // Checks `a` against its role (extents, dtype, device) and returns its strided view.
  template <typename A>
  fna::TensorRef ref(const char* name, const A& a, const std::vector<int64_t>& extents,
                     bool float32_only = false) {
    note_device(name, a);
    fna::DType t;
    if (!to_dtype(a.dtype(), &t))
      raise(PyExc_TypeError, std::string(name) + " has dtype " + dtype_str(a.dtype()) +
                                 "; fna supports float32, float16 and bfloat16 (" +
                                 dtype_str(a.dtype()) + " is unsupported)");
    if (float32_only && t != fna::DType::f32)
      raise(PyExc_TypeError,
            std::string(name) + " has dtype " + dtype_str(a.dtype()) + "; it must be float32");
    if (!float32_only && t != p.dtype)
      raise(PyExc_TypeError, std::string(name) + " has dtype " + fna::dtype_name(t) +
                                 " but the problem's dtype is " + fna::dtype_name(p.dtype) +
                                 "; all tensors must share one dtype");
    bool same = a.ndim() == extents.size();
    for (size_t i = 0; same && i < extents.size(); ++i)
      same = static_cast<int64_t>(a.shape(i)) == extents[i];
    if (!same)
      raise(PyExc_ValueError, std::string(name) + " has shape " + shape_str(a) + ", expected " +
                                  extents_str(extents));
    fna::TensorRef r;
    r.data = const_cast<void*>(static_cast<const void*>(a.data()));
    for (size_t i = 0; i < a.ndim(); ++i) r.strides[i] = a.stride(i);
    return r;
  }

  template <typename A>
  fna::TensorRef opt_ref(const char* name, const std::optional<A>& a,
                         const std::vector<int64_t>& extents, bool float32_only = false) {
    if (!a.has_value()) return fna::TensorRef{};
    return ref(name, *a, extents, float32_only);
  }

  // Extents of each role (the C++ API's table in fna.h); Q-role tensors and LSE take the query
  // region's (`region`), K-role ones the grid's.
  std::vector<int64_t> grid(int64_t heads, int64_t last, bool region = false) const {
    std::vector<int64_t> e{p.batch};
    for (int i = 0; i < p.rank; ++i) e.push_back(region ? p.query_extent(i) : p.shape[i]);
    e.push_back(heads);
    if (last >= 0) e.push_back(last);
    return e;
  }
  std::vector<int64_t> q(int64_t dim) const { return grid(p.heads, dim, true); }
  std::vector<int64_t> kv(int64_t dim) const { return grid(p.heads_kv, dim); }
  std::vector<int64_t> lse() const { return grid(p.heads, -1, true); }
  std::vector<int64_t> attn() const { return grid(p.heads, p.window() + p.num_additional); }
  std::vector<int64_t> add(int64_t dim) const { return {p.batch, p.num_additional, p.heads_kv, dim}; }
  std::vector<int64_t> rpb() const {  // [H, 2 K_a - 1 ..]
    std::vector<int64_t> e{p.heads};
    for (int i = 0; i < p.rank; ++i) e.push_back(2 * p.kernel_size[i] - 1);
    return e;
  }
};

// Fills rank, batch, shape, heads, dim (= last dim) and dtype from the array that defines the
// problem (query, or attn for av), plus the spatial parameters.
template <typename A>
void init_problem(Call& c, const char* name, const A& a, const Spatial& s) {
  const int ndim = static_cast<int>(a.ndim());
  if (ndim < 4 || ndim > fna::kMaxDims)
    raise(PyExc_ValueError, std::string(name) + " has " + std::to_string(ndim) +
                                " dimensions; expected 4, 5 or 6 ([batch, *spatial (1-3 axes), "
                                "heads, head_dim])");
  const int rank = ndim - 3;
  auto count = [&](const char* arg, size_t n) {
    if (n != static_cast<size_t>(rank))
      raise(PyExc_ValueError, std::string(arg) + " has " + std::to_string(n) + " entries for a " +
                                  std::to_string(rank) + "-D input");
  };
  count("kernel_size", s.kernel_size.size());
  count("stride", s.stride.size());
  count("dilation", s.dilation.size());
  count("is_causal", s.is_causal.size());
  fna::Problem& p = c.p;
  p.rank = rank;
  p.batch = static_cast<int64_t>(a.shape(0));
  for (int i = 0; i < rank; ++i) {
    p.shape[i] = static_cast<int64_t>(a.shape(1 + i));
    p.kernel_size[i] = s.kernel_size[i];
    p.stride[i] = s.stride[i];
    p.dilation[i] = s.dilation[i];
    p.is_causal[i] = s.is_causal[i];
  }
  p.heads = static_cast<int64_t>(a.shape(rank + 1));
  p.dim = p.dim_v = static_cast<int64_t>(a.shape(rank + 2));
  if (!to_dtype(a.dtype(), &p.dtype))
    raise(PyExc_TypeError, std::string(name) + " has dtype " + dtype_str(a.dtype()) +
                               "; fna supports float32, float16 and bfloat16 (" +
                               dtype_str(a.dtype()) + " is unsupported)");
  c.note_device(name, a);
}

// A query region (fna::Problem::query_offset): `offset` per axis (empty: none). The grid is the
// key's spatial shape, the region's extents the query's (set by init_problem as the shape).
template <typename A>
void query_region(Call& c, const A& key, const std::vector<int64_t>& offset) {
  if (offset.empty()) return;
  fna::Problem& p = c.p;
  if (offset.size() != static_cast<size_t>(p.rank))
    raise(PyExc_ValueError, "query_offset has " + std::to_string(offset.size()) +
                                " entries for a " + std::to_string(p.rank) + "-D input");
  if (static_cast<int>(key.ndim()) != p.rank + 3)
    raise(PyExc_ValueError, "key has " + std::to_string(key.ndim()) + " dimensions; expected " +
                                std::to_string(p.rank + 3));
  for (int i = 0; i < p.rank; ++i) {
    p.query_offset[i] = offset[i];
    p.query_shape[i] = p.shape[i];
    p.shape[i] = static_cast<int64_t>(key.shape(1 + i));
  }
}

// Reads heads_kv and a head dim from a K or V array (shape checked later by Call::ref).
template <typename A>
void kv_dims(Call& c, const char* name, const A& a, int64_t* dim) {
  if (static_cast<int>(a.ndim()) != c.p.rank + 3)
    raise(PyExc_ValueError, std::string(name) + " has " + std::to_string(a.ndim()) +
                                " dimensions; expected " + std::to_string(c.p.rank + 3));
  c.p.heads_kv = static_cast<int64_t>(a.shape(c.p.rank + 1));
  *dim = static_cast<int64_t>(a.shape(c.p.rank + 2));
}

template <typename A>
void num_additional(Call& c, const char* name, const std::optional<A>& a) {
  if (!a.has_value()) return;
  if (a->ndim() != 4)
    raise(PyExc_ValueError, std::string(name) + " has " + std::to_string(a->ndim()) +
                                " dimensions; expected 4 ([batch, n_additional, heads_kv, dim])");
  c.p.num_additional = static_cast<int64_t>(a->shape(1));
}

// Options::tuning from "key=value,key=value" (what the Python layer passes; fna::parse_tuning
// names the entry, key or value it rejects).
fna::Tuning parse_tuning(const std::string& text) {
  fna::Tuning t;
  check(fna::parse_tuning(text, &t));
  return t;
}

void set_options(Call& c, const std::string& backend, double scale, uintptr_t stream,
                 int64_t num_threads, bool deterministic, const std::string& config, bool allow_tf32,
                 const std::string& backward_config, const std::string& tuning) {
  // Problem errors first: the role extents checked next are only meaningful for a valid problem.
  check(fna::validate_problem(c.p));
  check(fna::parse_backend(backend, &c.opt.backend));
  c.opt.scale = scale;
  c.opt.stream = reinterpret_cast<void*>(stream);
  check(fna::detail::check_num_threads(num_threads));  // before narrowing to int
  c.opt.num_threads = static_cast<int>(num_threads);
  c.opt.deterministic = deterministic;
  c.opt.config = config;
  c.opt.allow_tf32 = allow_tf32;
  c.opt.backward_config = backward_config;
  c.opt.tuning = parse_tuning(tuning);
}

// Runs `fn` without the GIL: the arrays stay alive in the caller's frame.
template <typename F>
void run(F&& fn) {
  fna::Status st;
  {
    nb::gil_scoped_release release;
    st = fn();
  }
  check(st);
}

#define FNA_OPTION_PARAMS                                                                     \
  const std::vector<int64_t>&kernel_size, const std::vector<int64_t>&stride,                  \
      const std::vector<int64_t>&dilation, const std::vector<bool>&is_causal,                 \
      const std::string &backend, double scale, uintptr_t stream, int64_t num_threads,        \
      bool deterministic, const std::string &config, bool allow_tf32,                          \
      const std::string &backward_config, const std::string &tuning

#define FNA_OPTION_ARGS                                                                       \
  nb::kw_only(), nb::arg("kernel_size"), nb::arg("stride"), nb::arg("dilation"),              \
      nb::arg("is_causal"), nb::arg("backend") = "auto", nb::arg("scale") = -1.0,             \
      nb::arg("stream") = 0, nb::arg("num_threads") = 0, nb::arg("deterministic") = false,    \
      nb::arg("config") = "", nb::arg("allow_tf32") = false, nb::arg("backward_config") = "", \
      nb::arg("tuning") = ""

void forward(const In& q, const In& k, const In& v, const Out& o, const OptOut& lse,
             const OptIn& add_k, const OptIn& add_v, FNA_OPTION_PARAMS,
             const std::vector<int64_t>& query_offset, const OptIn& rpb) {
  Call c;
  init_problem(c, "query", q, {kernel_size, stride, dilation, is_causal});
  query_region(c, k, query_offset);
  kv_dims(c, "value", v, &c.p.dim_v);
  num_additional(c, "additional_keys", add_k);
  if (add_k.has_value() != add_v.has_value())
    raise(PyExc_ValueError, "additional_keys and additional_values must be given together");
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::ForwardArgs a;
  a.q = c.ref("query", q, c.q(c.p.dim));
  a.k = c.ref("key", k, c.kv(c.p.dim));
  a.v = c.ref("value", v, c.kv(c.p.dim_v));
  a.o = c.ref("output", o, c.q(c.p.dim_v));
  a.lse = c.opt_ref("lse", lse, c.lse(), true);
  a.add_k = c.opt_ref("additional_keys", add_k, c.add(c.p.dim));
  a.add_v = c.opt_ref("additional_values", add_v, c.add(c.p.dim_v));
  a.rpb = c.opt_ref("rpb", rpb, c.rpb(), true);
  run([&] { return fna::forward(c.p, a, c.opt); });
}

void backward(const In& q, const In& k, const In& v, const In& o, const In& d_o, const In& lse,
              const Out& dq, const Out& dk, const Out& dv, const OptIn& add_k, const OptIn& add_v,
              const OptOut& d_add_k, const OptOut& d_add_v, const OptIn& d_lse,
              FNA_OPTION_PARAMS, const std::vector<int64_t>& query_offset, const OptIn& rpb,
              const OptOut& d_rpb) {
  Call c;
  init_problem(c, "query", q, {kernel_size, stride, dilation, is_causal});
  query_region(c, k, query_offset);
  kv_dims(c, "value", v, &c.p.dim_v);
  num_additional(c, "additional_keys", add_k);
  if (add_k.has_value() != add_v.has_value() || add_k.has_value() != d_add_k.has_value() ||
      add_k.has_value() != d_add_v.has_value())
    raise(PyExc_ValueError,
          "additional_keys, additional_values, d_additional_keys and d_additional_values must be "
          "given together");
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::BackwardArgs a;
  a.q = c.ref("query", q, c.q(c.p.dim));
  a.k = c.ref("key", k, c.kv(c.p.dim));
  a.v = c.ref("value", v, c.kv(c.p.dim_v));
  a.o = c.ref("output", o, c.q(c.p.dim_v));
  a.d_o = c.ref("d_output", d_o, c.q(c.p.dim_v));
  a.lse = c.ref("lse", lse, c.lse(), true);
  a.d_lse = c.opt_ref("d_lse", d_lse, c.lse(), true);
  a.dq = c.ref("d_query", dq, c.q(c.p.dim));
  a.dk = c.ref("d_key", dk, c.kv(c.p.dim));
  a.dv = c.ref("d_value", dv, c.kv(c.p.dim_v));
  a.add_k = c.opt_ref("additional_keys", add_k, c.add(c.p.dim));
  a.add_v = c.opt_ref("additional_values", add_v, c.add(c.p.dim_v));
  a.d_add_k = c.opt_ref("d_additional_keys", d_add_k, c.add(c.p.dim));
  a.d_add_v = c.opt_ref("d_additional_values", d_add_v, c.add(c.p.dim_v));
  if (rpb.has_value() != d_rpb.has_value())
    raise(PyExc_ValueError, "rpb and d_rpb must be given together");
  a.rpb = c.opt_ref("rpb", rpb, c.rpb(), true);
  a.d_rpb = c.opt_ref("d_rpb", d_rpb, c.rpb(), true);
  run([&] { return fna::backward(c.p, a, c.opt); });
}

void qk_forward(const In& q, const In& k, const Out& attn, const OptIn& add_k, FNA_OPTION_PARAMS,
                const OptIn& rpb) {
  Call c;
  init_problem(c, "query", q, {kernel_size, stride, dilation, is_causal});
  int64_t dim_k = 0;
  kv_dims(c, "key", k, &dim_k);
  num_additional(c, "additional_keys", add_k);
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::QKArgs a;
  a.q = c.ref("query", q, c.q(c.p.dim));
  a.k = c.ref("key", k, c.kv(c.p.dim));
  a.add_k = c.opt_ref("additional_keys", add_k, c.add(c.p.dim));
  a.attn = c.ref("attn", attn, c.attn());
  a.rpb = c.opt_ref("rpb", rpb, c.rpb(), true);
  run([&] { return fna::qk_forward(c.p, a, c.opt); });
}

void qk_backward(const In& q, const In& k, const In& d_attn, const Out& dq, const Out& dk,
                 const OptIn& add_k, const OptOut& d_add_k, FNA_OPTION_PARAMS) {
  Call c;
  init_problem(c, "query", q, {kernel_size, stride, dilation, is_causal});
  int64_t dim_k = 0;
  kv_dims(c, "key", k, &dim_k);
  num_additional(c, "additional_keys", add_k);
  if (add_k.has_value() != d_add_k.has_value())
    raise(PyExc_ValueError, "additional_keys and d_additional_keys must be given together");
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::QKBackwardArgs a;
  a.q = c.ref("query", q, c.q(c.p.dim));
  a.k = c.ref("key", k, c.kv(c.p.dim));
  a.add_k = c.opt_ref("additional_keys", add_k, c.add(c.p.dim));
  a.d_attn = c.ref("d_attn", d_attn, c.attn());
  a.dq = c.ref("d_query", dq, c.q(c.p.dim));
  a.dk = c.ref("d_key", dk, c.kv(c.p.dim));
  a.d_add_k = c.opt_ref("d_additional_keys", d_add_k, c.add(c.p.dim));
  run([&] { return fna::qk_backward(c.p, a, c.opt); });
}

// For av the problem is read from attn ([B, *shape, H, W + N_add]) and value; `dim` is unused
// by av and set to dim_v.
template <typename A>
void init_av(Call& c, const A& attn, const In& v, const OptIn& add_v, const Spatial& s) {
  init_problem(c, "attn", attn, s);
  kv_dims(c, "value", v, &c.p.dim_v);
  c.p.dim = c.p.dim_v;
  num_additional(c, "additional_values", add_v);
  const int64_t last = static_cast<int64_t>(attn.shape(c.p.rank + 2));
  check(fna::validate_problem(c.p));
  if (last != c.p.window() + c.p.num_additional)
    raise(PyExc_ValueError,
          "attn has " + std::to_string(last) + " entries in its last dimension, expected " +
              std::to_string(c.p.window() + c.p.num_additional) + " (window " +
              std::to_string(c.p.window()) + " + additional " +
              std::to_string(c.p.num_additional) + ")");
}

void av_forward(const In& attn, const In& v, const Out& o, const OptIn& add_v, FNA_OPTION_PARAMS) {
  Call c;
  init_av(c, attn, v, add_v, {kernel_size, stride, dilation, is_causal});
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::AVArgs a;
  a.attn = c.ref("attn", attn, c.attn());
  a.v = c.ref("value", v, c.kv(c.p.dim_v));
  a.add_v = c.opt_ref("additional_values", add_v, c.add(c.p.dim_v));
  a.o = c.ref("output", o, c.q(c.p.dim_v));
  run([&] { return fna::av_forward(c.p, a, c.opt); });
}

void av_backward(const In& attn, const In& v, const In& d_o, const Out& d_attn, const Out& dv,
                 const OptIn& add_v, const OptOut& d_add_v, FNA_OPTION_PARAMS) {
  Call c;
  init_av(c, attn, v, add_v, {kernel_size, stride, dilation, is_causal});
  if (add_v.has_value() != d_add_v.has_value())
    raise(PyExc_ValueError, "additional_values and d_additional_values must be given together");
  set_options(c, backend, scale, stream, num_threads, deterministic, config, allow_tf32,
              backward_config, tuning);
  fna::AVBackwardArgs a;
  a.attn = c.ref("attn", attn, c.attn());
  a.v = c.ref("value", v, c.kv(c.p.dim_v));
  a.add_v = c.opt_ref("additional_values", add_v, c.add(c.p.dim_v));
  a.d_o = c.ref("d_output", d_o, c.q(c.p.dim_v));
  a.d_attn = c.ref("d_attn", d_attn, c.attn());
  a.dv = c.ref("d_value", dv, c.kv(c.p.dim_v));
  a.d_add_v = c.opt_ref("d_additional_values", d_add_v, c.add(c.p.dim_v));
  run([&] { return fna::av_backward(c.p, a, c.opt); });
}

fna::Backend backend_arg(const std::string& name) {
  fna::Backend b;
  check(fna::parse_backend(name, &b));
  return b;
}

fna::DType dtype_arg(const std::string& name) {
  const fna::DType all[] = {fna::DType::f32, fna::DType::f16, fna::DType::bf16};
  for (fna::DType t : all)
    if (name == fna::dtype_name(t)) return t;
  raise(PyExc_TypeError, "dtype='" + name + "' is not one of float32, float16, bfloat16");
}

}  // namespace

// What plan.cpp (the fused_plan binding) shares with this file (bindings.h).
namespace fna_py {
void raise_error(PyObject* type, const std::string& msg) { raise(type, msg); }
void check_status(const fna::Status& st) { check(st); }
fna::Tuning tuning_arg(const std::string& text) { return parse_tuning(text); }
fna::DType dtype_of_name(const std::string& name) { return dtype_arg(name); }
}  // namespace fna_py

// The fna-bench CLI (tools/bench), linked into the extension so that the installed `fna-bench`
// command (fna._bench) needs no second copy of the kernels.
int fna_bench_main(int argc, char** argv);

NB_MODULE(_C, m) {
  m.doc() = "fna: neighborhood attention (C++ core). Use the functions of the `fna` package.";

  m.def("forward", &forward, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("output"), nb::arg("lse").none() = nb::none(),
        nb::arg("additional_keys").none() = nb::none(),
        nb::arg("additional_values").none() = nb::none(), FNA_OPTION_ARGS,
        nb::arg("query_offset") = std::vector<int64_t>{}, nb::arg("rpb").none() = nb::none(),
        "Fused NA forward into preallocated `output` (and `lse`, float32, if given). With "
        "`query_offset`, `query` holds the queries of the box at that offset of the key grid. "
        "`rpb`: a float32 relative positional bias [H, 2K-1 ..] (backends reference, cpu, and "
        "cuda-fused for dense tables).");
  m.def("backward", &backward, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("output"), nb::arg("d_output"), nb::arg("lse"), nb::arg("d_query"),
        nb::arg("d_key"), nb::arg("d_value"), nb::arg("additional_keys").none() = nb::none(),
        nb::arg("additional_values").none() = nb::none(),
        nb::arg("d_additional_keys").none() = nb::none(),
        nb::arg("d_additional_values").none() = nb::none(), nb::arg("d_lse").none() = nb::none(),
        FNA_OPTION_ARGS, nb::arg("query_offset") = std::vector<int64_t>{},
        nb::arg("rpb").none() = nb::none(), nb::arg("d_rpb").none() = nb::none(),
        "Fused NA backward into preallocated gradients (overwritten, not accumulated); `d_lse` "
        "(float32, like `lse`; None = zero) is the gradient flowing into the forward's LSE. "
        "`query_offset`, `rpb`: as in forward; `d_rpb` (float32, like `rpb`) receives its "
        "gradient.");
  m.def("qk_forward", &qk_forward, nb::arg("query"), nb::arg("key"), nb::arg("attn"),
        nb::arg("additional_keys").none() = nb::none(), FNA_OPTION_ARGS,
        nb::arg("rpb").none() = nb::none(),
        "Unfused logits over the neighborhood (+ additional keys) into `attn`; `rpb` (float32 "
        "[H, 2K-1 ..], every backend) adds each neighbor slot's bias entry.");
  m.def("qk_backward", &qk_backward, nb::arg("query"), nb::arg("key"), nb::arg("d_attn"),
        nb::arg("d_query"), nb::arg("d_key"), nb::arg("additional_keys").none() = nb::none(),
        nb::arg("d_additional_keys").none() = nb::none(), FNA_OPTION_ARGS);
  m.def("av_forward", &av_forward, nb::arg("attn"), nb::arg("value"), nb::arg("output"),
        nb::arg("additional_values").none() = nb::none(), FNA_OPTION_ARGS,
        "Unfused weights x values over the neighborhood (+ additional values) into `output`.");
  m.def("av_backward", &av_backward, nb::arg("attn"), nb::arg("value"), nb::arg("d_output"),
        nb::arg("d_attn"), nb::arg("d_value"), nb::arg("additional_values").none() = nb::none(),
        nb::arg("d_additional_values").none() = nb::none(), FNA_OPTION_ARGS);

  m.def("takes_rpb", [](const std::string& name) { return fna::takes_rpb(backend_arg(name)); },
        nb::arg("backend"), "Does the named backend's forward / backward take `rpb` natively?");
  m.def("backend_compiled", [](const std::string& name) {
    return fna::backend_compiled(backend_arg(name));
  }, nb::arg("backend"), "Is the named backend in this build?");
  m.def("resolve_backend", [](const std::string& name, const std::string& device) {
    fna::Device d;
    if (device == "cpu") d = fna::Device::cpu;
    else if (device == "cuda") d = fna::Device::cuda;
    else raise(PyExc_ValueError, "device='" + device + "' is not 'cpu' or 'cuda'");
    const fna::Backend r = fna::resolve_backend(backend_arg(name), d);
    const bool cuda_backend = r == fna::Backend::cuda_naive || r == fna::Backend::cuda_fused ||
                              r == fna::Backend::cuda_gemm;
    if (cuda_backend != (d == fna::Device::cuda))
      raise(PyExc_ValueError, std::string("backend ") + fna::backend_name(r) +
                                  " cannot run on " + device + " tensors");
    return std::string(fna::backend_name(r));
  }, nb::arg("backend"), nb::arg("device"), "The backend `backend` runs as on `device`.");
  m.def("cuda_available", &fna::cuda_available,
        "Compiled with CUDA and a device is visible.");
  m.def("fused_configs", [](int rank, const std::string& dtype, int64_t dim) {
    return fna::fused_configs(rank, dtype_arg(dtype), dim);
  }, nb::arg("rank"), nb::arg("dtype"), nb::arg("dim"),
     "Tile configurations of cuda-fused for (rank, dtype, head dim); empty without it.");
  m.def("fused_backward_configs", [](int rank, const std::string& dtype, int64_t dim) {
    return fna::fused_backward_configs(rank, dtype_arg(dtype), dim);
  }, nb::arg("rank"), nb::arg("dtype"), nb::arg("dim"),
     "Names of the cuda-fused backward tile configurations for (rank, dtype, max(D, D_v)).");
  fna_py::bind_fused_plan(m);
  m.def("tuning_keys", &fna::tuning_keys, "The keys Options::tuning accepts.");
  m.def("autotune_clear_memory_cache", [] {
#if defined(FNA_WITH_CUDA_FUSED)
    fna::detail::autotune_clear_all();
#else
    fna::detail::autotune_clear_memory_cache();
#endif
  }, "Forgets the autotuner's in-process choices (the disk cache stays).");
  m.def("last_fused_launch", [] {
    nb::dict d;
#if defined(FNA_WITH_CUDA_FUSED)
    const fna::detail::LaunchRecord r = fna::detail::last_launch();
    d["forward"] = r.forward;
    d["backward"] = r.backward;
    d["forward_tma"] = r.forward_tma;
    d["backward_tma"] = r.backward_tma;
    d["forward_grid"] = r.forward_grid;
    d["forward_smem"] = r.forward_smem;
#endif
    return d;
  }, "What the last cuda-fused launches ran (for tests: the plan is what runs).");
  m.def("set_num_threads", [](int64_t num_threads) {
    check(fna::detail::check_num_threads(num_threads));
    check(fna::set_num_threads(static_cast<int>(num_threads)));
  }, nb::arg("num_threads"),
     "Process-wide CPU thread count for calls that pass num_threads=0 (0: the cores available).");
  m.def("get_num_threads", &fna::get_num_threads,
        "The CPU thread count of calls that pass num_threads=0.");
  m.attr("max_threads") = fna::kMaxThreads;
  m.def("version", [] { return std::string(fna::version()); });
  m.def(
      "bench_main",
      [](std::vector<std::string> args) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        int rc;
        {
          nb::gil_scoped_release release;
          rc = fna_bench_main(static_cast<int>(args.size()), argv.data());
        }
        std::fflush(stdout);
        std::fflush(stderr);
        return rc;
      },
      nb::arg("argv"), "Runs the fna-bench CLI with argv (argv[0] is the program name); returns its exit code.");
  m.attr("backends") =
      nb::make_tuple("auto", "reference", "cpu", "cuda-naive", "cuda-fused", "cuda-gemm");
}
