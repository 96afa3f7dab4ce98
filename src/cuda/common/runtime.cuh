// CUDA runtime helpers shared by the CUDA backends: errors as Status values, the device guard,
// the stream of a call, and stream-ordered workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/backends.h"
#include "fna/fna.h"

namespace fna {
namespace detail {

// `what: <cudaGetErrorString>` as a runtime_error; Ok for cudaSuccess.
Status cuda_status(cudaError_t err, const char* what);

// Return from the enclosing Status-returning function when a CUDA call fails.
#define FNA_CUDA_TRY(expr)                                                          \
  do {                                                                              \
    const cudaError_t fna_err_ = (expr);                                            \
    if (fna_err_ != cudaSuccess) return ::fna::detail::cuda_status(fna_err_, #expr); \
  } while (0)

// After every kernel launch: a bad launch configuration is only reported by cudaGetLastError.
#define FNA_CUDA_CHECK_LAUNCH(kernel_name)                                               \
  do {                                                                                  \
    const cudaError_t fna_err_ = cudaGetLastError();                                    \
    if (fna_err_ != cudaSuccess)                                                        \
      return ::fna::detail::cuda_status(fna_err_, "launching " kernel_name);            \
  } while (0)

// Makes Options::device_index current for the lifetime of the guard and restores the caller's
// device afterwards, so a library call never changes the thread's current device.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();
  Status set(int device_index);

 private:
  int previous_ = -1;
};

inline cudaStream_t stream_of(const Options& opt) { return static_cast<cudaStream_t>(opt.stream); }

// Scratch memory ordered on the call's stream (cudaMallocAsync; plain cudaMalloc where the device
// has no memory pools). Freed when the object dies, after the work queued before that point.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();
  // `what` names the buffer in the out-of-memory message.
  Status allocate(size_t bytes, const char* what);
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  bool async_ = false;
};

// Free device memory on the current device (bytes), for sizing workspaces; 0 when unknown.
size_t cuda_free_memory();

// What the plans need of a device, queried once per device and cached.
struct DeviceProps {
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sms = 0;                     // streaming multiprocessors
  int smem_optin = 0;              // most dynamic shared memory one block may opt into (bytes)
  bool hopper() const { return cc_major == 9 && cc_minor == 0; }
};
// The properties of device `device_index`; a runtime_error Status when it cannot be asked.
Status device_props(int device_index, DeviceProps* out);

}  // namespace detail
}  // namespace fna
