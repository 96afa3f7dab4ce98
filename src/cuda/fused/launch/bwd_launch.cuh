// Launchers of the fused backward kernels for one (dtype, padded head dim). The kernel shapes are
// fixed per head dim here; tile *shapes* (how a tile's rows spread over the axes) are runtime
// values in Params, chosen by the host heuristic, so ranks 1-3 share one instantiation.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/backends.h"
#include "cuda/fused/configs/backward.h"
#include "cuda/fused/kernel/common/bwd_common.cuh"
#include "cuda/fused/kernel/sm80/bwd_dkdv_sm80.cuh"
#include "cuda/fused/kernel/sm80/bwd_dq_sm80.cuh"
#include "cuda/fused/kernel/common/bwd_params.cuh"
#include "cuda/fused/launch/bwd_sm90.h"

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
// A family's tiles: the warp-specialized Hopper kernel at padded head dim 256
// (bwd_dkdv_sm90_d256.cuh) runs 64 keys x 64 queries, every other the tiles above.
inline TileRows family_tile_rows(fused::BwdFamily family, int dpad, bool f32) {
  TileRows tr = tile_rows(dpad, f32);
  if (family == fused::BwdFamily::sm90ws && dpad == 256) tr.dkdv_keys = tr.dkdv_queries = 64;
  return tr;
}

// Sets the shared memory of one dK/dV kernel variant and launches it over the neighborhood tiles
// and (when there are any) the additional keys.
template <typename T, int kD, bool kAtomicDq, int kPass>
struct DkdvLaunch {
  using S = BwdShape<T, kD>;
  using Tr = DkdvTraits<T, kD, S::kDkdvWarps, S::kDkdvQueries, S::kQSub, kAtomicDq>;
  // The kernel without and with a relative positional bias (p.rpb).
  static constexpr auto kPlain = dkdv_kernel<T, kD, S::kDkdvWarps, S::kDkdvQueries, S::kQSub,
                                             kAtomicDq, kPass, false>;
  static constexpr auto kBiased = dkdv_kernel<T, kD, S::kDkdvWarps, S::kDkdvQueries, S::kQSub,
                                              kAtomicDq, kPass, true>;
  // extra: shared memory after the kernel's own (BwdLaunch::bias_smem: the d rpb sums, zero
  // without a bias or with Params::d_rpb_global); biased: the call has a bias (p.rpb).
  static Status prepare(const char* name, size_t extra, bool biased) {
    return set_smem(biased ? kBiased : kPlain, Tr::kSmem + extra, name);
  }
  static Status launch(const Params& p, dim3 grid, dim3 grid_add, size_t extra,
                       cudaStream_t stream, const char* name) {
    const auto kernel = p.rpb != nullptr ? kBiased : kPlain;
    kernel<<<grid, Tr::kThreads, Tr::kSmem + extra, stream>>>(p, false);
    Status st = launch_error(name);
    if (!st.ok() || grid_add.x == 0) return st;
    kernel<<<grid_add, Tr::kThreads, Tr::kSmem + extra, stream>>>(p, true);
    return launch_error(name);
  }
};

// The most dynamic shared memory one of the kernels launch_backward runs for `l` takes (bytes):
// the plan checks it against the device before anything is queued.
template <typename T, int kD>
size_t backward_smem(const BwdLaunch& l) {
#if defined(FNA_WITH_SM90)
  if constexpr (!Elem<T>::kF32) {
    if (l.family != fused::BwdFamily::sm80) return dkdv_sm90_smem<T, kD>(l.family, l.kv_rows, l.q_steps);
  }
#endif
  using S = BwdShape<T, kD>;
  size_t m = 0;
  if constexpr (S::kSplit) {
    m = std::max(DkdvLaunch<T, kD, false, kPassDv>::Tr::kSmem,
                 l.deterministic ? DkdvLaunch<T, kD, false, kPassDk>::Tr::kSmem
                                 : DkdvLaunch<T, kD, true, kPassDk>::Tr::kSmem);
  } else {
    m = l.deterministic ? DkdvLaunch<T, kD, false, kPassBoth>::Tr::kSmem
                        : DkdvLaunch<T, kD, true, kPassBoth>::Tr::kSmem;
  }
  if (l.deterministic) m = std::max(m, size_t(DqTraits<T, kD, S::kDqWarps, S::kDqKeys>::kSmem));
  return m;
}

// p_dkdv / p_dq carry their own tile shapes and tile counts; `l` is the plan's (family, mode,
// grids, maps). In the atomic mode (!l.deterministic; p_dkdv.dq_accum set and zeroed) dQ is
// accumulated with atomics in the dK / dV kernel, then converted; in the deterministic mode the dQ
// kernel runs. Shared memory is set for every kernel before any is queued, so that `unsupported`
// (a device with too little) leaves nothing half done.
template <typename T, int kD>
Status launch_backward(const Params& p_dkdv, const Params& p_dq, const BwdLaunch& l,
                       cudaStream_t stream) {
  using S = BwdShape<T, kD>;
  using DqT = DqTraits<T, kD, S::kDqWarps, S::kDqKeys>;
  const bool atomic = !l.deterministic;
  const bool biased = p_dkdv.rpb != nullptr;
  auto dq = biased ? dq_kernel<T, kD, S::kDqWarps, S::kDqKeys, true>
                   : dq_kernel<T, kD, S::kDqWarps, S::kDqKeys, false>;
#if defined(FNA_WITH_SM90)
  if constexpr (!Elem<T>::kF32) {
    if (l.family != fused::BwdFamily::sm80) return launch_dkdv_sm90<T, kD>(p_dkdv, l, stream);
  }
#endif
  if (l.family != fused::BwdFamily::sm80)
    return {Code::runtime_error, "backend=cuda-fused backward: the plan's Hopper kernel is not "
                                 "in this build"};  // the plan never picks it here
  if constexpr (S::kSplit) {
    // Above head dim 128: a dV pass, then a dK pass (with atomic dQ or followed by the dQ kernel).
    using Dv = DkdvLaunch<T, kD, false, kPassDv>;
    using DkAtomic = DkdvLaunch<T, kD, true, kPassDk>;
    using Dk = DkdvLaunch<T, kD, false, kPassDk>;
    Status st = Dv::prepare("dkdv kernel (dV pass)", l.bias_smem, biased);
    if (st.ok()) st = atomic ? DkAtomic::prepare("dkdv kernel (dK pass, atomic dq)", l.bias_smem, biased)
                             : Dk::prepare("dkdv kernel (dK pass)", l.bias_smem, biased);
    if (st.ok() && !atomic) st = set_smem(dq, DqT::kSmem, "dq kernel");
    if (!st.ok()) return st;
    st = Dv::launch(p_dkdv, l.grid_dkdv, l.grid_add, l.bias_smem, stream, "dkdv (dV pass)");
    if (!st.ok()) return st;
    if (atomic) {
      st = DkAtomic::launch(p_dkdv, l.grid_dkdv, l.grid_add, l.bias_smem, stream, "dkdv (dK pass, atomic dq)");
      if (!st.ok()) return st;
      launch_dq_convert<T>(p_dkdv, stream);
      return launch_error("dq convert");
    }
    st = Dk::launch(p_dkdv, l.grid_dkdv, l.grid_add, l.bias_smem, stream, "dkdv (dK pass)");
    if (!st.ok()) return st;
  } else {
    using Both = DkdvLaunch<T, kD, false, kPassBoth>;
    using BothAtomic = DkdvLaunch<T, kD, true, kPassBoth>;
    Status st = atomic ? BothAtomic::prepare("dkdv kernel (atomic dq)", l.bias_smem, biased)
                           : Both::prepare("dkdv kernel", l.bias_smem, biased);
    if (st.ok() && !atomic) st = set_smem(dq, DqT::kSmem, "dq kernel");
    if (!st.ok()) return st;
    if (atomic) {
      st = BothAtomic::launch(p_dkdv, l.grid_dkdv, l.grid_add, l.bias_smem, stream, "dkdv (atomic dq)");
      if (!st.ok()) return st;
      launch_dq_convert<T>(p_dkdv, stream);
      return launch_error("dq convert");
    }
    st = Both::launch(p_dkdv, l.grid_dkdv, l.grid_add, l.bias_smem, stream, "dkdv");
    if (!st.ok()) return st;
  }
  dq<<<l.grid_dq, DqT::kThreads, DqT::kSmem, stream>>>(p_dq);
  return launch_error("dq");
}

#define FNA_BWD_DECLARE(T, D)                                                                  \
  extern template Status launch_backward<T, D>(const Params&, const Params&, const BwdLaunch&,  \
                                               cudaStream_t);                                    \
  extern template size_t backward_smem<T, D>(const BwdLaunch&);
#define FNA_BWD_INSTANTIATE(T, D)                                                                \
  template Status launch_backward<T, D>(const Params&, const Params&, const BwdLaunch&, cudaStream_t); \
  template size_t backward_smem<T, D>(const BwdLaunch&);

}  // namespace bwd
}  // namespace fna
