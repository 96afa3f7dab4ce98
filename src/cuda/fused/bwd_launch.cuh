// Launchers of the fused backward kernels for one (dtype, padded head dim). The kernel shapes are
// fixed per head dim here; tile *shapes* (how a tile's rows spread over the axes) are runtime
// values in Params, chosen by the host heuristic, so ranks 1-3 share one instantiation.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/backends.h"
#include "cuda/fused/bwd_dkdv.cuh"
#include "cuda/fused/bwd_dq.cuh"
#include "cuda/fused/bwd_params.cuh"
#include "cuda/fused/bwd_sm90.h"

namespace fna {
namespace bwd {

// Query / key tile sizes of both kernels (the host tiles the grid with these row counts).
constexpr int kDkdvWarps = 8;                  // 128 keys per CTA
constexpr int kDkdvKeys = 16 * kDkdvWarps;
constexpr int kDkdvQueries = 64;
constexpr int kDqWarps = 4;                    // 64 queries per CTA
constexpr int kDqQueries = 16 * kDqWarps;
constexpr int kDqKeys = 64;

// Sub-tile of queries per mainloop step of the dK/dV kernel: at head dim 128 the dK and dV
// accumulators already take 128 registers per thread, so S^T / dP^T are computed 32 queries at a
// time to stay under 255 without spills.
template <int kD>
constexpr int dkdv_qsub() { return kD > 64 ? 32 : 64; }

// Kernel shapes per padded head dim. Up to 128 one dK/dV pass holds both accumulators. Above
// (padded 256) dK and dV take 128 registers each, so the dK/dV kernel runs twice (kPassDv, then
// kPassDk), and shared memory (K and V tiles of 128 keys, double-buffered Q and dO) only fits
// with 32-query tiles: 2 * 64 KB + 4 * 16 KB + the dS staging, ~216 KB. The deterministic dQ
// kernel steps over 32 keys so that S and dP (32 registers) fit next to its 128-register dQ.
//
// float32 (T = mma::F32 / mma::TF32) rows take twice the bytes: from head dim 128 the dK/dV kernel
// owns 64 keys (4 warps) instead of 128 and steps over 16 queries at a time (no spills); at 256 its query tiles shrink to 16 rows (one sub-tile)
// and the dQ kernel steps over 16 keys. Every float32 shape stays under ~218 KB.
template <typename T, int kD>
struct BwdShape {
  static constexpr bool kF32 = Elem<T>::kF32;
  static constexpr bool kSplit = kD > 128;
  static constexpr int kDkdvWarps = kF32 && kD >= 128 ? 4 : bwd::kDkdvWarps;
  static constexpr int kDkdvKeys = 16 * kDkdvWarps;
  static constexpr int kDkdvQueries = kSplit ? (kF32 ? 16 : 32) : bwd::kDkdvQueries;
  static constexpr int kQSub = kF32 && kD >= 128 ? 16 : dkdv_qsub<kD>();
  static constexpr int kDqWarps = bwd::kDqWarps;
  static constexpr int kDqQueries = 16 * kDqWarps;
  static constexpr int kDqKeys = kSplit ? (kF32 ? 16 : 32) : bwd::kDqKeys;
};

// The same, for the host (padded head dim and dtype known at run time).
struct TileRows {
  int dkdv_queries, dkdv_keys, dq_queries, dq_keys;
};
template <typename T, int kD>
constexpr TileRows tile_rows_of() {
  using S = BwdShape<T, kD>;
  return {S::kDkdvQueries, S::kDkdvKeys, S::kDqQueries, S::kDqKeys};
}
inline TileRows tile_rows(int dpad, bool f32) {
  if (f32) {
    if (dpad > 128) return tile_rows_of<mma::F32, 256>();
    return dpad > 64 ? tile_rows_of<mma::F32, 128>() : tile_rows_of<mma::F32, 64>();
  }
  if (dpad > 128) return tile_rows_of<__half, 256>();
  return dpad > 64 ? tile_rows_of<__half, 128>() : tile_rows_of<__half, 64>();
}

// Sets the dynamic shared memory of `kernel`, or reports that the device cannot hold it.
template <typename Kernel>
Status set_smem(Kernel kernel, size_t bytes, const char* name) {
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (bytes > size_t(optin))
    return {Code::unsupported, std::string("backend=cuda-fused: ") + name + " needs " +
                                   std::to_string(bytes) + " bytes of shared memory, device has " +
                                   std::to_string(optin)};
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
  const bool dense = dense_rows(p, p.sdq, p.dim);
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

// Sets the shared memory of one dK/dV kernel variant and launches it over the neighborhood tiles
// and (when there are any) the additional keys.
template <typename T, int kD, bool kAtomicDq, int kPass>
struct DkdvLaunch {
  using S = BwdShape<T, kD>;
  using Tr = DkdvTraits<T, kD, S::kDkdvWarps, S::kDkdvQueries, S::kQSub, kAtomicDq>;
  static constexpr auto kernel = dkdv_kernel<T, kD, S::kDkdvWarps, S::kDkdvQueries, S::kQSub,
                                             kAtomicDq, kPass>;
  static Status prepare(const char* name) { return set_smem(kernel, Tr::kSmem, name); }
  static Status launch(const Params& p, dim3 grid, dim3 grid_add, cudaStream_t stream,
                       const char* name) {
    kernel<<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p, false);
    Status st = launch_error(name);
    if (!st.ok() || grid_add.x == 0) return st;
    kernel<<<grid_add, Tr::kThreads, Tr::kSmem, stream>>>(p, true);
    return launch_error(name);
  }
};

// p_dkdv / p_dq carry their own tile shapes and tile counts. With p_dkdv.dq_accum set (zeroed),
// dQ is accumulated with atomics in the dK/dV kernel; otherwise the deterministic dQ kernel runs.
// Shared memory is set for every kernel before any is queued, so that `unsupported` (a device
// with too little) leaves nothing half done.
template <typename T, int kD>
Status launch_backward(const Params& p_dkdv, const Params& p_dq, dim3 grid_dkdv, dim3 grid_add,
                       dim3 grid_dq, cudaStream_t stream) {
  using S = BwdShape<T, kD>;
  if constexpr (S::kSplit) {
    using Dv = DkdvLaunch<T, kD, false, kPassDv>;
    using DkAtomic = DkdvLaunch<T, kD, true, kPassDk>;
    using Dk = DkdvLaunch<T, kD, false, kPassDk>;
    using DqT = DqTraits<T, kD, S::kDqWarps, S::kDqKeys>;
    auto dq = dq_kernel<T, kD, S::kDqWarps, S::kDqKeys>;
    const bool atomic = p_dkdv.dq_accum != nullptr;
    Status st = Dv::prepare("dkdv kernel (dV pass)");
    if (st.ok()) st = atomic ? DkAtomic::prepare("dkdv kernel (dK pass, atomic dq)")
                             : Dk::prepare("dkdv kernel (dK pass)");
    if (st.ok() && !atomic) st = set_smem(dq, DqT::kSmem, "dq kernel");
    if (!st.ok()) return st;
    st = Dv::launch(p_dkdv, grid_dkdv, grid_add, stream, "dkdv (dV pass)");
    if (!st.ok()) return st;
    if (atomic) {
      st = DkAtomic::launch(p_dkdv, grid_dkdv, grid_add, stream, "dkdv (dK pass, atomic dq)");
      if (!st.ok()) return st;
      launch_dq_convert<T>(p_dkdv, stream);
      return launch_error("dq convert");
    }
    st = Dk::launch(p_dkdv, grid_dkdv, grid_add, stream, "dkdv (dK pass)");
    if (!st.ok()) return st;
    dq<<<grid_dq, DqT::kThreads, DqT::kSmem, stream>>>(p_dq);
    return launch_error("dq");
  } else {
  constexpr int kQSub = S::kQSub, kDkdvWarps = S::kDkdvWarps, kDkdvQueries = S::kDkdvQueries;
  constexpr int kDqWarps = S::kDqWarps, kDqKeys = S::kDqKeys;
  if (p_dkdv.dq_accum != nullptr) {
#if defined(FNA_WITH_SM90)
    // Hopper: the dK / dV / atomic-dQ kernel on wgmma (bwd_dkdv_sm90.cuh), same tiles.
    if constexpr (!Elem<T>::kF32 && (kD == 64 || kD == 128) && kDkdvWarps == 8 &&
                  kDkdvQueries == 64) {
      if (use_bwd_sm90()) return launch_dkdv_sm90<T, kD>(p_dkdv, grid_dkdv, grid_add, stream);
    }
#endif
    using Tr = DkdvTraits<T, kD, kDkdvWarps, kDkdvQueries, kQSub, true>;
    auto dkdv = dkdv_kernel<T, kD, kDkdvWarps, kDkdvQueries, kQSub, true>;
    Status st = set_smem(dkdv, Tr::kSmem, "dkdv kernel (atomic dq)");
    if (!st.ok()) return st;
    dkdv<<<grid_dkdv, Tr::kThreads, Tr::kSmem, stream>>>(p_dkdv, false);
    st = launch_error("dkdv (atomic dq)");
    if (!st.ok()) return st;
    if (grid_add.x > 0) {
      dkdv<<<grid_add, Tr::kThreads, Tr::kSmem, stream>>>(p_dkdv, true);
      st = launch_error("dkdv (additional, atomic dq)");
      if (!st.ok()) return st;
    }
    launch_dq_convert<T>(p_dkdv, stream);
    return launch_error("dq convert");
  }
  using DkdvT = DkdvTraits<T, kD, kDkdvWarps, kDkdvQueries, kQSub, false>;
  using DqT = DqTraits<T, kD, kDqWarps, kDqKeys>;
  auto dkdv = dkdv_kernel<T, kD, kDkdvWarps, kDkdvQueries, kQSub, false>;
  auto dq = dq_kernel<T, kD, kDqWarps, kDqKeys>;
  Status st = set_smem(dkdv, DkdvT::kSmem, "dkdv kernel");
  if (!st.ok()) return st;
  st = set_smem(dq, DqT::kSmem, "dq kernel");
  if (!st.ok()) return st;

  dkdv<<<grid_dkdv, DkdvT::kThreads, DkdvT::kSmem, stream>>>(p_dkdv, false);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return {Code::runtime_error, std::string("launching dkdv: ") + cudaGetErrorString(err)};
  if (grid_add.x > 0) {
    dkdv<<<grid_add, DkdvT::kThreads, DkdvT::kSmem, stream>>>(p_dkdv, true);
    err = cudaGetLastError();
    if (err != cudaSuccess)
      return {Code::runtime_error, std::string("launching dkdv (additional): ") + cudaGetErrorString(err)};
  }
  dq<<<grid_dq, DqT::kThreads, DqT::kSmem, stream>>>(p_dq);
  err = cudaGetLastError();
  if (err != cudaSuccess) return {Code::runtime_error, std::string("launching dq: ") + cudaGetErrorString(err)};
  return Status::Ok();
  }  // head dims <= 128
}

// Explicit instantiations live in backward_<dtype>.cu.
#define FNA_BWD_DECLARE(T, D)                                                                   \
  extern template Status launch_backward<T, D>(const Params&, const Params&, dim3, dim3, dim3, \
                                               cudaStream_t);

}  // namespace bwd
}  // namespace fna
