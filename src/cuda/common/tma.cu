// Tensor maps for the TMA (host side; tma.h).
#include "cuda/common/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>

namespace fna {
namespace tma {
namespace {

// cuTensorMapEncodeTiled from the driver the runtime loaded (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else
      (void)cudaGetLastError();
  });
  return fn;
}

}  // namespace

bool token_map(TokenMap* m, const void* base, int64_t dim, const int64_t (&len)[5],
               const int64_t (&stride)[5], const int (&box)[3], const int (&dil)[3],
               std::string* why) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    *why = "base address not 16-byte aligned";
    return false;
  }
  cuuint64_t gdim[5] = {cuuint64_t(dim), 1, 1, 1, 1};
  cuuint64_t gstride[4] = {0, 0, 0, 0};
  cuuint32_t bdim[5] = {64, 1, 1, 1, 1};
  cuuint32_t estride[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < 4; ++i) m->role[i] = kPad;
  // Candidate dims innermost first: head (index 4 of the lifted arrays), axes 2, 1, 0, batch.
  const int src[5] = {4, 3, 2, 1, 0};
  const Role role[5] = {kHead, kAxis2, kAxis1, kAxis0, kBatch};
  int n = 1;
  int64_t last_stride = dim * 2;
  for (int c = 0; c < 5; ++c) {
    const int s = src[c];
    const int ext = (s >= 1 && s <= 3) ? box[s - 1] : 1;
    const int d = (s >= 1 && s <= 3) ? dil[s - 1] : 1;
    if (len[s] == 1 && ext == 1) continue;
    if (d < 1 || d > 8 || ext < 1 || int64_t(ext) * d > 256) {
      *why = "box " + std::to_string(ext) + " x dilation " + std::to_string(d) +
             " (TMA takes element strides up to 8 and boxes up to 256)";
      return false;
    }
    if (n == 5) {
      *why = "more than four dims of length > 1 besides the head dim";
      return false;
    }
    const int64_t bytes = stride[s] * 2;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t(1) << 40)) {
      *why = "stride " + std::to_string(stride[s]) + " is not a positive multiple of 16 bytes";
      return false;
    }
    gdim[n] = cuuint64_t(len[s]);
    gstride[n - 1] = cuuint64_t(bytes);
    bdim[n] = cuuint32_t(ext * d);  // traversed every d-th element: ext rows land
    estride[n] = cuuint32_t(d);
    m->role[n - 1] = role[c];
    last_stride = bytes * len[s];
    ++n;
  }
  // Padding dims (length 1, coordinate 0): any valid stride.
  for (; n < 5; ++n) {
    last_stride = (last_stride + 15) / 16 * 16;
    gstride[n - 1] = cuuint64_t(last_stride < (int64_t(1) << 40) ? last_stride : 16);
  }
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) {
    *why = "the driver has no cuTensorMapEncodeTiled";
    return false;
  }
  auto encode = [&] {
    return fn(&m->map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<void*>(base), gdim, gstride,
              bdim, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = encode();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A thread the runtime has not bound a context to yet (PyTorch's autograd thread before its
    // first CUDA runtime call: the first backward of a process): cudaFree(nullptr) binds the
    // current device's primary context, as any runtime call would.
    if (cudaFree(nullptr) == cudaSuccess) r = encode();
    (void)cudaGetLastError();
  }
  if (r != CUDA_SUCCESS) {
    *why = "cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")";
    return false;
  }
  return true;
}

}  // namespace tma
}  // namespace fna
