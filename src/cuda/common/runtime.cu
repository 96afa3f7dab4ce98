#include "cuda/common/runtime.cuh"

#include <atomic>
#include <mutex>
#include <string>

namespace fna {
namespace detail {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return {Code::runtime_error, std::string(what) + ": " + cudaGetErrorString(err)};
}

bool cuda_device_available() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // No driver / no device is an answer here, not an error for the next launch check to find.
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

Status cuda_check_pointer(const void* ptr, int device_index, const char* arg) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return {Code::invalid_argument, std::string(arg) +
                                        " is not a CUDA pointer (cudaPointerGetAttributes: " +
                                        cudaGetErrorString(err) + ")"};
  }
  switch (attr.type) {
    case cudaMemoryTypeManaged: return Status::Ok();
    case cudaMemoryTypeDevice:
      if (attr.device != device_index)
        return {Code::invalid_argument,
                std::string(arg) + " lives on CUDA device " + std::to_string(attr.device) +
                    ", but device_index=" + std::to_string(device_index)};
      return Status::Ok();
    case cudaMemoryTypeHost:
      return {Code::invalid_argument,
              std::string(arg) + " is pinned host memory, but device=cuda needs device memory"};
    default:
      return {Code::invalid_argument,
              std::string(arg) + " is host memory, but device=cuda needs device memory"};
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

Status DeviceGuard::set(int device_index) {
  int count = 0;
  FNA_CUDA_TRY(cudaGetDeviceCount(&count));
  if (device_index < 0 || device_index >= count)
    return {Code::invalid_argument, "device_index=" + std::to_string(device_index) +
                                        " is not a visible CUDA device (count " +
                                        std::to_string(count) + ")"};
  int current = 0;
  FNA_CUDA_TRY(cudaGetDevice(&current));
  if (current != device_index) {
    FNA_CUDA_TRY(cudaSetDevice(device_index));
    previous_ = current;
  }
  return Status::Ok();
}

Workspace::~Workspace() {
  if (ptr_ == nullptr) return;
  if (async_)
    cudaFreeAsync(ptr_, stream_);
  else
    cudaFree(ptr_);  // synchronizes the device: the kernels using the buffer have finished
}

Status Workspace::allocate(size_t bytes, const char* what) {
  if (bytes == 0) return Status::Ok();
  cudaError_t err = cudaMallocAsync(&ptr_, bytes, stream_);
  if (err == cudaSuccess) {
    async_ = true;
    return Status::Ok();
  }
  cudaGetLastError();
  ptr_ = nullptr;
  if (err == cudaErrorNotSupported) {
    err = cudaMalloc(&ptr_, bytes);
    if (err == cudaSuccess) return Status::Ok();
    cudaGetLastError();
    ptr_ = nullptr;
  }
  return {Code::runtime_error, std::string("allocating ") + std::to_string(bytes) +
                                   " bytes of workspace for " + what + ": " +
                                   cudaGetErrorString(err)};
}

size_t cuda_free_memory() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free_b;
}

Status device_props(int device_index, DeviceProps* out) {
  constexpr int kCached = 64;
  static std::mutex mu;
  static DeviceProps cache[kCached];  // cc_major 0: not asked yet
  const bool cacheable = device_index >= 0 && device_index < kCached;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mu);
    if (cache[device_index].cc_major > 0) {
      *out = cache[device_index];
      return Status::Ok();
    }
  }
  DeviceProps d;
  const cudaDeviceAttr attrs[] = {cudaDevAttrComputeCapabilityMajor,
                                  cudaDevAttrComputeCapabilityMinor,
                                  cudaDevAttrMultiProcessorCount,
                                  cudaDevAttrMaxSharedMemoryPerBlockOptin};
  int* dst[] = {&d.cc_major, &d.cc_minor, &d.sms, &d.smem_optin};
  for (int i = 0; i < 4; ++i) {
    const cudaError_t err = cudaDeviceGetAttribute(dst[i], attrs[i], device_index);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return {Code::runtime_error, "querying CUDA device " + std::to_string(device_index) + ": " +
                                       cudaGetErrorString(err)};
    }
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mu);
    cache[device_index] = d;
  }
  *out = d;
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
