#include "harness.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

namespace fna_gpu_test {

using fna_test::Case;
using fna_test::Check;
using fna_test::HostTensor;
using fna_test::ProblemTensors;

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward: return "backward";
    case Op::qk_forward: return "qk";
    case Op::qk_backward: return "qk_backward";
    case Op::av_forward: return "av";
    case Op::av_backward: return "av_backward";
  }
  return "?";
}

const char* op_family(Op op) {
  switch (op) {
    case Op::forward: return "fwd";
    case Op::backward: return "bwd";
    case Op::qk_forward:
    case Op::qk_backward: return "qk";
    default: return "av";
  }
}

bool op_is_unfused(Op op) { return op != Op::forward && op != Op::backward; }

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Device copies of host tensors, storage for storage (same strides, padding included), freed
// when the object dies.
class DeviceTensors {
 public:
  DeviceTensors() = default;
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;
  ~DeviceTensors() {
    for (auto& b : bufs_) cudaFree(b.second);
  }
  // Uploads `h` (an empty tensor gives a null view) and remembers it for download().
  fna::TensorRef up(HostTensor& h) {
    if (h.empty() || !error_.empty()) return {};
    void* d = nullptr;
    cudaError_t e = cudaMalloc(&d, h.bytes() > 0 ? h.bytes() : 1);
    if (e != cudaSuccess) {
      error_ = cuda_error("cudaMalloc", e);
      return {};
    }
    bufs_.push_back({&h, d});
    e = cudaMemcpy(d, h.data(), h.bytes(), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) error_ = cuda_error("cudaMemcpy to device", e);
    return h.ref_at(d);
  }
  // Copies the device contents of `h` back into it.
  void down(HostTensor& h) {
    for (auto& b : bufs_) {
      if (b.first != &h) continue;
      const cudaError_t e = cudaMemcpy(h.data(), b.second, h.bytes(), cudaMemcpyDeviceToHost);
      if (e != cudaSuccess && error_.empty()) error_ = cuda_error("cudaMemcpy to host", e);
    }
  }
  // Poisons the device copy of `h` again (all-ones bytes: NaN in f32, f16 and bf16).
  void poison(HostTensor& h) {
    for (auto& b : bufs_)
      if (b.first == &h) cudaMemset(b.second, 0xff, h.bytes());
  }
  const std::string& error() const { return error_; }

 private:
  std::vector<std::pair<HostTensor*, void*>> bufs_;
  std::string error_;
};

// A created stream or the legacy default one, for the duration of one run.
struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(bool create) {
    if (create) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

fna::Options device_options(const Case& c, const RunConfig& rc, cudaStream_t stream) {
  fna::Options o = fna_test::options_for(c, rc.backend);
  o.device = fna::Device::cuda;
  o.device_index = 0;
  o.stream = stream;
  o.config = rc.config;
  o.backward_config = rc.backward_config;
  o.allow_tf32 = rc.allow_tf32;
  o.tuning = rc.tuning;
  return o;
}

fna::Options reference_options(const Case& c, const RunConfig& rc) {
  return fna_test::options_for(c, fna::Backend::reference, rc.ref_threads);
}

Outcome fail(const std::string& why) { return {Verdict::fail, why}; }

Outcome from_status(const fna::Status& st, const char* who) {
  if (st.code == fna::Code::unsupported) return {Verdict::unsupported, st.message};
  return fail(std::string(who) + " returned code " + std::to_string(static_cast<int>(st.code)) +
              ": " + st.message);
}

Outcome from_check(const Check& c) {
  Outcome o = c.ok ? Outcome{} : fail(c.str());
  o.ratio = c.bound > 0 ? c.err / c.bound : -1;
  return o;
}

// Finishes a device run: waits for the stream, surfaces asynchronous errors.
std::string finish(cudaStream_t s) {
  cudaError_t e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? "" : cuda_error("after the run", e);
}

// The reference forward on f32 copies, its o (rounded to the case dtype) and LSE stored into `t`:
// the backward inputs, the same for the backend under test and the reference.
fna::Status reference_forward_into(ProblemTensors& t, const RunConfig& rc) {
  ProblemTensors r = t.as_f32();
  r.c.with_lse = true;
  const fna::Status st = fna::forward(r.c.p, r.forward_args(), reference_options(r.c, rc));
  if (!st.ok()) return st;
  t.o.from_double(r.o.to_double());
  t.lse.from_double(r.lse.to_double());
  return st;
}

fna_test::Tolerance tolerance(const RunConfig& rc) {
  fna_test::Tolerance tol;
  tol.tf32 = rc.allow_tf32;
  return tol;
}

// Runs the forward of one case and checks it; `rel_err` (when given, float32) receives
// max|out - ref| / max|ref| over O and LSE (the larger).
Outcome run_forward(const Case& c, const RunConfig& rc, double* rel_err = nullptr) {
  ProblemTensors got(c);  // outputs poisoned (NaN)
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::ForwardArgs a;
    a.q = dev.up(got.q);
    a.k = dev.up(got.k);
    a.v = dev.up(got.v);
    a.o = dev.up(got.o);
    if (c.with_lse) a.lse = dev.up(got.lse);
    a.add_k = dev.up(got.add_k);
    a.add_v = dev.up(got.add_v);
    if (!dev.error().empty()) return fail(dev.error());
    const fna::Status st = fna::forward(c.p, a, device_options(c, rc, stream.s));
    if (!st.ok()) return from_status(st, "forward");
    const std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    dev.down(got.o);
    if (c.with_lse) dev.down(got.lse);
    if (!dev.error().empty()) return fail(dev.error());
  }
  ProblemTensors ref = got.as_f32();
  ref.poison_outputs();
  const fna::Status st = fna::forward(ref.c.p, ref.forward_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference forward failed: " + st.message);
  if (rel_err != nullptr) {
    fna_test::Tolerance unit;  // float32 rule with f32_rel = 1: err / bound = relative error
    unit.f32_rel = 1.0;
    const Check r = fna_test::check_forward(got, ref, unit);
    *rel_err = r.bound > 0 ? r.err / r.bound : 0.0;
  }
  return from_check(fna_test::check_forward(got, ref, tolerance(rc)));
}

// `rel_err` (when given, float32): max|grad - ref| / max|ref| of the worst gradient.
Outcome run_backward(const Case& c, const RunConfig& rc, double* rel_err = nullptr) {
  ProblemTensors got(c);
  fna::Status st = reference_forward_into(got, rc);
  if (!st.ok()) return fail("reference forward failed: " + st.message);
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::BackwardArgs a;
    a.q = dev.up(got.q);
    a.k = dev.up(got.k);
    a.v = dev.up(got.v);
    a.o = dev.up(got.o);
    a.d_o = dev.up(got.d_o);
    a.lse = dev.up(got.lse);
    a.dq = dev.up(got.dq);
    a.dk = dev.up(got.dk);
    a.dv = dev.up(got.dv);
    a.add_k = dev.up(got.add_k);
    a.add_v = dev.up(got.add_v);
    a.d_add_k = dev.up(got.d_add_k);
    a.d_add_v = dev.up(got.d_add_v);
    if (!dev.error().empty()) return fail(dev.error());
    fna::Options opt = device_options(c, rc, stream.s);
    opt.deterministic = rc.deterministic;
    st = fna::backward(c.p, a, opt);
    if (!st.ok()) return from_status(st, "backward");
    std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    HostTensor* outs[] = {&got.dq, &got.dk, &got.dv, &got.d_add_k, &got.d_add_v};
    for (HostTensor* h : outs) dev.down(*h);
    if (!dev.error().empty()) return fail(dev.error());
    if (rc.deterministic) {
      std::vector<HostTensor> first;
      for (HostTensor* h : outs) {
        first.push_back(*h);
        dev.poison(*h);
      }
      st = fna::backward(c.p, a, opt);
      if (!st.ok()) return from_status(st, "backward (second deterministic run)");
      err = finish(stream.s);
      if (!err.empty()) return fail(err);
      const char* names[] = {"d_query", "d_key", "d_value", "d_additional_keys",
                             "d_additional_values"};
      for (int i = 0; i < 5; ++i) {
        dev.down(*outs[i]);
        // Logical elements only: the padding of a strided layout is never written.
        const std::vector<double> x = outs[i]->to_double(), y = first[i].to_double();
        if (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) != 0)
          return fail(std::string("deterministic=true: two runs gave different ") + names[i]);
      }
      if (!dev.error().empty()) return fail(dev.error());
    }
  }
  ProblemTensors ref = got.as_f32();
  for (HostTensor* h : {&ref.dq, &ref.dk, &ref.dv, &ref.d_add_k, &ref.d_add_v})
    if (!h->empty()) h->fill(kNaN);
  st = fna::backward(ref.c.p, ref.backward_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference backward failed: " + st.message);
  if (rel_err != nullptr) {
    fna_test::Tolerance unit;  // as in run_forward
    unit.f32_rel = 1.0;
    const Check r = fna_test::check_backward(got, ref, unit);
    *rel_err = r.bound > 0 ? r.err / r.bound : 0.0;
  }
  return from_check(fna_test::check_backward(got, ref, tolerance(rc)));
}

Outcome run_qk_forward(const Case& c, const RunConfig& rc) {
  ProblemTensors got(c);
  got.attn.fill(kNaN);  // the output of qk; poison_outputs leaves it (it is av's input)
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::QKArgs a;
    a.q = dev.up(got.q);
    a.k = dev.up(got.k);
    a.add_k = dev.up(got.add_k);
    a.attn = dev.up(got.attn);
    if (!dev.error().empty()) return fail(dev.error());
    const fna::Status st = fna::qk_forward(c.p, a, device_options(c, rc, stream.s));
    if (!st.ok()) return from_status(st, "qk_forward");
    const std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    dev.down(got.attn);
    if (!dev.error().empty()) return fail(dev.error());
  }
  ProblemTensors ref = got.as_f32();
  ref.attn.fill(kNaN);
  const fna::Status st = fna::qk_forward(ref.c.p, ref.qk_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference qk_forward failed: " + st.message);
  return from_check(fna_test::check_qk(got, ref));
}

Outcome run_qk_backward(const Case& c, const RunConfig& rc) {
  ProblemTensors got(c);
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::QKBackwardArgs a;
    a.q = dev.up(got.q);
    a.k = dev.up(got.k);
    a.add_k = dev.up(got.add_k);
    a.d_attn = dev.up(got.d_attn);
    a.dq = dev.up(got.dq);
    a.dk = dev.up(got.dk);
    a.d_add_k = dev.up(got.d_add_k);
    if (!dev.error().empty()) return fail(dev.error());
    const fna::Status st = fna::qk_backward(c.p, a, device_options(c, rc, stream.s));
    if (!st.ok()) return from_status(st, "qk_backward");
    const std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    for (HostTensor* h : {&got.dq, &got.dk, &got.d_add_k}) dev.down(*h);
    if (!dev.error().empty()) return fail(dev.error());
  }
  ProblemTensors ref = got.as_f32();
  ref.poison_outputs();
  const fna::Status st =
      fna::qk_backward(ref.c.p, ref.qk_backward_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference qk_backward failed: " + st.message);
  return from_check(fna_test::check_qk_backward(got, ref));
}

Outcome run_av_forward(const Case& c, const RunConfig& rc) {
  ProblemTensors got(c);
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::AVArgs a;
    a.attn = dev.up(got.attn);
    a.v = dev.up(got.v);
    a.add_v = dev.up(got.add_v);
    a.o = dev.up(got.o);
    if (!dev.error().empty()) return fail(dev.error());
    const fna::Status st = fna::av_forward(c.p, a, device_options(c, rc, stream.s));
    if (!st.ok()) return from_status(st, "av_forward");
    const std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    dev.down(got.o);
    if (!dev.error().empty()) return fail(dev.error());
  }
  ProblemTensors ref = got.as_f32();
  ref.poison_outputs();
  const fna::Status st = fna::av_forward(ref.c.p, ref.av_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference av_forward failed: " + st.message);
  return from_check(fna_test::check_av(got, ref));
}

Outcome run_av_backward(const Case& c, const RunConfig& rc) {
  ProblemTensors got(c);
  got.d_attn.fill(kNaN);  // an output here
  {
    Stream stream(rc.use_stream);
    DeviceTensors dev;
    fna::AVBackwardArgs a;
    a.attn = dev.up(got.attn);
    a.v = dev.up(got.v);
    a.add_v = dev.up(got.add_v);
    a.d_o = dev.up(got.d_o);
    a.d_attn = dev.up(got.d_attn);
    a.dv = dev.up(got.dv);
    a.d_add_v = dev.up(got.d_add_v);
    if (!dev.error().empty()) return fail(dev.error());
    const fna::Status st = fna::av_backward(c.p, a, device_options(c, rc, stream.s));
    if (!st.ok()) return from_status(st, "av_backward");
    const std::string err = finish(stream.s);
    if (!err.empty()) return fail(err);
    for (HostTensor* h : {&got.d_attn, &got.dv, &got.d_add_v}) dev.down(*h);
    if (!dev.error().empty()) return fail(dev.error());
  }
  ProblemTensors ref = got.as_f32();
  ref.poison_outputs();
  ref.d_attn.fill(kNaN);
  const fna::Status st =
      fna::av_backward(ref.c.p, ref.av_backward_args(), reference_options(c, rc));
  if (!st.ok()) return fail("reference av_backward failed: " + st.message);
  return from_check(fna_test::check_av_backward(got, ref));
}

}  // namespace

Outcome run_tf32_contrast(Op op, const Case& c, const RunConfig& rc) {
  if (c.p.dtype != fna::DType::f32) return fail("run_tf32_contrast needs a float32 case");
  if (op != Op::forward && op != Op::backward) return fail("run_tf32_contrast: forward or backward");
  double rel[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    RunConfig r = rc;
    r.allow_tf32 = mode == 1;
    const Outcome o =
        op == Op::forward ? run_forward(c, r, &rel[mode]) : run_backward(c, r, &rel[mode]);
    if (o.verdict != Verdict::pass)
      return {o.verdict, std::string(mode ? "allow_tf32=true: " : "allow_tf32=false: ") + o.detail};
  }
  std::ostringstream os;
  os << "relative error: split TF32 " << rel[0] << ", plain TF32 " << rel[1];
  if (!(rel[1] > 1e-5 && rel[1] > 10 * rel[0]))
    return fail(os.str() + ": plain TF32 should be measurably (>1e-5, >10x) less accurate");
  return {Verdict::pass, os.str()};
}

Outcome run_case(Op op, const Case& c, const RunConfig& rc) {
  switch (op) {
    case Op::forward: return run_forward(c, rc);
    case Op::backward: return run_backward(c, rc);
    case Op::qk_forward: return run_qk_forward(c, rc);
    case Op::qk_backward: return run_qk_backward(c, rc);
    case Op::av_forward: return run_av_forward(c, rc);
    case Op::av_backward: return run_av_backward(c, rc);
  }
  return fail("unknown op");
}

}  // namespace fna_gpu_test
