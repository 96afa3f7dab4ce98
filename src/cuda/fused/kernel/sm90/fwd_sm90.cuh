// The fused forward on Hopper's warpgroup MMAs (wgmma, sm_90a): the algorithm of fwd_sm80.cuh
// (same tiles, same key-tile walk, mask, online softmax and epilogue: fwd_common.cuh), with the
// two GEMMs issued per warpgroup instead of per warp.
//
// A CTA owns one multi-dimensional query tile of kQ = 64 * warpgroups rows; warpgroup w owns rows
// 64w..64w+63 (warp 4w + i rows 16i.. of those, the mma.sync-compatible accumulator layout, so the
// mask and softmax code is the sm_80 kernel's with one m-tile per warp). Per key/value tile:
//   S = Q K^T   wgmma m64nN k16, A = Q and B = K both from 128-byte-swizzled shared memory;
//   mask (border tiles), online softmax in registers;
//   O += P V    wgmma m64nD k16, A = P straight from the S accumulators (registers), B = V read
//               transposed (MN-major) from the same swizzled layout K uses.
// Tiles arrive by cp.async (gathered rows: a multi-dimensional tile is not one box of global
// memory), double buffered, one barrier per tile; fence.proxy.async hands the generic-proxy writes
// to the MMA's async proxy. Head dims are padded to 64 or 128 (zero-filled columns), 16-bit only.
// For 2-D and 3-D 128-query tiles a warp-specialized variant (fna_fwd_sm90_ws_kernel,
// fwd_sm90_ws.cuh, with the launchers) moves the loads to a loader warpgroup and overlaps each
// compute warpgroup's MMAs and softmax.
#pragma once

#include "cuda/fused/kernel/common/sm90_fwd_parts.cuh"

namespace fna {
namespace fused {

// kBias: the call has a relative positional bias (its own instantiation, as fwd_sm80.cuh's).
template <class T, int kD, int kRank, class QT, class KT, bool kSpread = false, bool kBias = false>
__global__ void __launch_bounds__(Sm90Traits<T, kD, kRank, QT, KT>::kThreads,
                                  Sm90Traits<T, kD, kRank, QT, KT>::kMinBlocks)
    fna_fwd_sm90_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  static_assert(kD <= 128, "head dim 256 runs the warp-specialized kernel only");
  using Elem = typename Tr::Elem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = mma::smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t sQ = raw + pad;
  const uint32_t sKV = sQ + Tr::kQBytes;
  RowWindow* sWin = reinterpret_cast<RowWindow*>(smem_raw + pad + Tr::kWinOffset);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  FwdTile ft;
  if (!fwd_tile<QT>(p, blockIdx.x, ft)) return;
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int hkv = ft.h / p.heads_per_kv;
  const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
  const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];

  copy_q_tile<Tr, QT, Tr::kThreads, kSpread>(threadIdx.x, p, ft, sQ);
  mma::cp_async_commit();

  // The span (one axis per warp) and the rows' windows are computed side by side while Q loads.
  __shared__ KvSpan sSpan;
  kv_span_by_warps<QT, KT, Tr::kWarps>(geo, ft, sSpan, warp, lane);
  init_windows<Tr, QT>(geo, gr, ft.qo, sWin);
  BiasRows<Tr> br;
  if constexpr (kBias)
    stage_bias<Tr>(p, ft.h, reinterpret_cast<float*>(smem_raw + bias_stage_offset(Tr::kSmemBytes)),
                   br);
  __syncthreads();
  const KvSpan& span = sSpan;
  const int n_nbr = span.total();
  const int n_tiles = n_nbr + (p.num_add + Tr::kN - 1) / Tr::kN;

  // Tile `t` into buffer `buf`; the walk's current tile is `cur` (kv_tile_next: no division).
  KvTile cur = kv_tile<Tr, KT>(span, n_nbr, 0);
  auto load_kv = [&](const KvTile& t, int buf) {
    const uint32_t sK = sKV + (2 * buf) * Tr::kTileBytes;
    copy_kv_tile<Tr, KT, Tr::kThreads, kSpread>(threadIdx.x, p, ft, hkv, t, gK, gV, sK,
                                                sK + Tr::kTileBytes);
  };
  load_kv(cur, 0);
  mma::cp_async_commit();

  FwdState<Tr> st;
  init_state(st);
  if constexpr (kBias) bias_rows<Tr, QT>(p, ft, warp * Tr::kWarpRows, br);
  const uint32_t sQw = sQ + (warp >> 2) * 64 * 128;  // this warpgroup's 64 rows
  for (int it = 0; it < n_tiles; ++it) {
    mma::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    if (it + 1 < n_tiles) {
      load_kv(kv_tile_next<Tr, KT>(span, n_nbr, cur, it), (it + 1) & 1);
      mma::cp_async_commit();
    }
    const KvTile t = cur;
    const uint32_t sK = sKV + (2 * (it & 1)) * Tr::kTileBytes;
    const uint32_t sV = sK + Tr::kTileBytes;
    if (t.inside)
      sm90_step<Tr, T, KT, false, kBias>(st, sQw, sK, sV, t, sWin, br, p);
    else
      sm90_step<Tr, T, KT, true, kBias>(st, sQw, sK, sV, t, sWin, br, p);
    cur = kv_tile_next<Tr, KT>(span, n_nbr, cur, it);
  }
  store_output<Tr, T, QT>(st, p, ft, warp * Tr::kWarpRows, lane);
#endif
}

template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90_smem_bytes() {
  return Sm90Traits<T, kD, kRank, QT, KT>::kSmemBytes;
}

template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_fwd_sm90(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  const bool bias = p.rpb != nullptr;
  auto kernel = l.spread ? (bias ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, true, true>
                                 : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, true, false>)
                         : (bias ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, true>
                                 : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, false>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fused
}  // namespace fna
