// Error paths of the CUDA entry points: bad pointers and options must come back as Status values
// whose message names the argument, without a crash, without changing the caller's device and
// without leaving a CUDA error behind for the caller's next call.
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "harness.h"

namespace fna_gpu_test {

namespace {

// A small valid problem that every CUDA backend can run (f16, head dim 64).
fna::Problem small_problem() {
  fna::Problem p;
  p.rank = 1;
  p.batch = 1;
  p.shape[0] = 16;
  p.heads = p.heads_kv = 1;
  p.dim = p.dim_v = 64;
  p.kernel_size[0] = 5;
  p.dtype = fna::DType::f16;
  return p;
}

// Device (and host) buffers big enough for every tensor of small_problem(), dense.
struct Buffers {
  std::vector<void*> dev;
  std::vector<unsigned char> host;
  void* pinned = nullptr;
  fna::TensorRef d(const std::vector<int64_t>& extents) {
    int64_t n = 1;
    for (int64_t e : extents) n *= e;
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, static_cast<size_t>(n) * 4) != cudaSuccess) return {};
    cudaMemset(ptr, 0x3c, static_cast<size_t>(n) * 4);  // f16 ~1.0, never read as a result
    dev.push_back(ptr);
    return fna::dense(ptr, extents);
  }
  fna::TensorRef h(const std::vector<int64_t>& extents) {
    host.assign(1 << 16, 0x3c);
    return fna::dense(host.data(), extents);
  }
  fna::TensorRef pin(const std::vector<int64_t>& extents) {
    if (!pinned && cudaMallocHost(&pinned, 1 << 16) != cudaSuccess) return {};
    return fna::dense(pinned, extents);
  }
  ~Buffers() {
    for (void* p : dev) cudaFree(p);
    if (pinned) cudaFreeHost(pinned);
  }
};

struct Expect {
  const char* name;
  fna::Code code;
  const char* must_mention;  // the message must contain this
  std::function<fna::Status()> call;
};

}  // namespace

ErrorResults run_error_paths(fna::Backend backend) {
  ErrorResults res;
  const fna::Problem p = small_problem();
  const std::vector<int64_t> qe = {1, 16, 1, 64}, lsee = {1, 16, 1};
  Buffers buf;
  fna::ForwardArgs good;
  good.q = buf.d(qe);
  good.k = buf.d(qe);
  good.v = buf.d(qe);
  good.o = buf.d(qe);
  good.lse = buf.d(lsee);
  fna::Options opt;
  opt.backend = backend;
  opt.device = fna::Device::cuda;
  int count = 0;
  cudaGetDeviceCount(&count);

  std::vector<Expect> expects;
  expects.push_back({"host query with device=cuda", fna::Code::invalid_argument, "query", [&] {
                       fna::ForwardArgs a = good;
                       a.q = buf.h(qe);
                       return fna::forward(p, a, opt);
                     }});
  expects.push_back({"host output with device=cuda", fna::Code::invalid_argument, "output", [&] {
                       fna::ForwardArgs a = good;
                       a.o = buf.h(qe);
                       return fna::forward(p, a, opt);
                     }});
  expects.push_back({"pinned host value with device=cuda", fna::Code::invalid_argument, "value",
                     [&] {
                       fna::ForwardArgs a = good;
                       a.v = buf.pin(qe);
                       return fna::forward(p, a, opt);
                     }});
  expects.push_back({"device_index past the last device", fna::Code::invalid_argument,
                     "device", [&] {
                       fna::Options o = opt;
                       o.device_index = count;
                       return fna::forward(p, good, o);
                     }});
  expects.push_back({"CUDA backend with device=cpu", fna::Code::invalid_argument, "backend", [&] {
                       fna::Options o = opt;
                       o.device = fna::Device::cpu;
                       // `auto` with device=cpu is the CPU backend, which would read the device
                       // pointers: device must say where the pointers live (fna.h), so this
                       // case names a CUDA backend explicitly.
                       if (o.backend == fna::Backend::automatic) o.backend = fna::Backend::cuda_naive;
                       return fna::forward(p, good, o);
                     }});
  expects.push_back({"null output", fna::Code::invalid_argument, "output", [&] {
                       fna::ForwardArgs a = good;
                       a.o = {};
                       return fna::forward(p, a, opt);
                     }});
  expects.push_back({"backward with host d_output", fna::Code::invalid_argument, "d_output", [&] {
                       fna::BackwardArgs a;
                       a.q = good.q;
                       a.k = good.k;
                       a.v = good.v;
                       a.o = good.o;
                       a.lse = good.lse;
                       a.d_o = buf.h(qe);
                       a.dq = buf.d(qe);
                       a.dk = buf.d(qe);
                       a.dv = buf.d(qe);
                       return fna::backward(p, a, opt);
                     }});
  if (backend == fna::Backend::cuda_fused) {
    expects.push_back({"unfused qk on cuda-fused", fna::Code::unsupported, "cuda-fused", [&] {
                         fna::QKArgs a;
                         a.q = good.q;
                         a.k = good.k;
                         a.attn = buf.d({1, 16, 1, 5});
                         return fna::qk_forward(p, a, opt);
                       }});
  } else {
    expects.push_back({"qk with host key", fna::Code::invalid_argument, "key", [&] {
                         fna::QKArgs a;
                         a.q = good.q;
                         a.k = buf.h(qe);
                         a.attn = buf.d({1, 16, 1, 5});
                         return fna::qk_forward(p, a, opt);
                       }});
  }

  for (const Expect& e : expects) {
    int dev_before = -1, dev_after = -1;
    cudaGetDevice(&dev_before);
    const fna::Status st = e.call();
    cudaGetDevice(&dev_after);
    const cudaError_t pending = cudaGetLastError();
    std::string why;
    if (st.code != e.code)
      why = "code " + std::to_string(static_cast<int>(st.code)) + " (expected " +
            std::to_string(static_cast<int>(e.code)) + ")";
    else if (st.message.find(e.must_mention) == std::string::npos)
      why = std::string("message does not mention '") + e.must_mention + "'";
    else if (dev_before != dev_after)
      why = "the current device changed from " + std::to_string(dev_before) + " to " +
            std::to_string(dev_after);
    else if (pending != cudaSuccess)
      why = std::string("left a CUDA error pending: ") + cudaGetErrorString(pending);
    if (why.empty()) {
      ++res.passed;
    } else {
      res.failures.push_back(std::string("error path [") + fna::backend_name(backend) + "] " +
                             e.name + ": " + why + "; message: " + st.message);
    }
  }
  return res;
}

}  // namespace fna_gpu_test
