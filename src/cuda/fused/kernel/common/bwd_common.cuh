// Host and device pieces every backward launcher shares: setting a kernel's shared memory, the
// launch check, and the conversion of the float32 dQ accumulator into dQ.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/backends.h"
#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

// Sets the dynamic shared memory of `kernel` (the plan checked that the device holds it).
template <typename Kernel>
Status set_smem(Kernel kernel, size_t bytes, const char* name) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err != cudaSuccess) return {Code::runtime_error, std::string(name) + ": " + cudaGetErrorString(err)};
  return Status::Ok();
}

// dQ = scale * dq_accum, into the strided dQ tensor. Each thread converts 4 consecutive elements
// of one row per step (one 16-byte load of the accumulator), 2^log_tpr threads per row. A row's
// place in dQ takes no division when dQ is laid out densely ([B, N.., H, D] contiguous: `dense`);
// `vec` (dense, D % 4 == 0, aligned) stores the 4 elements at once.
template <typename T>
__global__ void dq_convert_kernel(const Params p, int log_tpr, bool dense, bool vec) {
  using E = typename Elem<T>::type;
  const int tpr = 1 << log_tpr;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> log_tpr;
  const int sub = int(threadIdx.x) & (tpr - 1);
  if (row >= int64_t(p.batch) * p.tokens * p.heads) return;
  int64_t base = row * p.dim;  // (b * N + tok) * H + h rows of D
  if (!dense) {
    const RowPlace r = row_place(p, row);
    // dQ holds the query region only (`dense` is off with a region)
    if (!fused::in_query_region(p, r.x)) return;
    base = tok_offset(p.sdq, r.b, r.x, r.h);
  }
  E* out = static_cast<E*>(p.dq) + base;
  const float* acc = p.dq_accum + row * p.dq_row;  // dq_row % 8 == 0: 16-byte aligned
  for (int c = 4 * sub; c < p.dim; c += 4 * tpr) {
    const float4 a = *reinterpret_cast<const float4*>(acc + c);
    alignas(4 * sizeof(E)) E v[4] = {E(a.x * p.scale), E(a.y * p.scale), E(a.z * p.scale),
                                     E(a.w * p.scale)};
    if (vec) {
      if constexpr (sizeof(E) == 2)
        *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(v);
      else
        *reinterpret_cast<uint4*>(out + c) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int e = 0; e < 4 && c + e < p.dim; ++e) out[c + e] = v[e];
    }
  }
}

// Whether a tensor with strides `s` and rows of `row_len` elements is laid out densely, so that
// row (b * N + token) * H + h starts at element row * row_len (axes of length 1 and a batch of
// one ignore their strides).
inline bool dense_rows(const Params& p, const TokStrides& s, int64_t row_len) {
  int64_t expect = row_len;
  bool ok = s.h == expect || p.heads == 1;
  expect *= p.heads;
  for (int a = kAxes - 1; a >= 0; --a) {
    ok = ok && (s.x[a] == expect || p.geo.axis[a].length == 1);
    expect *= p.geo.axis[a].length;
  }
  return ok && (s.b == expect || p.batch == 1);
}

// Threads per row for rows of `chunks` pieces: the next power of two, at most a warp. Returns its
// log2.
inline int log_threads_per_row(int chunks) {
  int l = 0;
  while ((1 << l) < chunks && l < 5) ++l;
  return l;
}

template <typename T>
void launch_dq_convert(const Params& p, cudaStream_t stream) {
  using E = typename Elem<T>::type;
  const int log_tpr = log_threads_per_row((p.dim + 3) / 4);
  const bool dense = !p.region && dense_rows(p, p.sdq, p.dim);
  const bool vec = dense && p.dim % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(p.dq) % (4 * sizeof(E)) == 0;
  const int64_t threads = (int64_t(p.batch) * p.tokens * p.heads) << log_tpr;
  dq_convert_kernel<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p, log_tpr, dense,
                                                                             vec);
}

inline Status launch_error(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return {Code::runtime_error, std::string("launching ") + what + ": " + cudaGetErrorString(err)};
}

}  // namespace bwd
}  // namespace fna
