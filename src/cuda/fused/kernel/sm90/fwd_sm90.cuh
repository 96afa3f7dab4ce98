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
// Tiles arrive double buffered, one barrier per tile: by TMA where the plan's maps describe the
// problem (one thread issues a tile's boxes, an mbarrier per buffer counts their bytes), else by
// cp.async (gathered rows; fence.proxy.async hands the generic-proxy writes to the MMA's async
// proxy). Head dims are padded to 64 or 128 (zero-filled columns), 16-bit only.
// For 2-D and 3-D 128-query tiles a warp-specialized variant (fna_fwd_sm90_ws_kernel,
// fwd_sm90_ws.cuh, with the launchers) moves the loads to a loader warpgroup and overlaps each
// compute warpgroup's MMAs and softmax.
// The same body runs the backward's dQ kernel (fna_dq_sm90_kernel, Tuning::bwd_dq_sm90): the
// forward's tiles and walk, per key tile S = Q K^T and dP = dO V^T, dS from the saved statistics
// and dQ += dS K, dQ written once per row.
#pragma once

#include "cuda/fused/kernel/common/sm90_fwd_parts.cuh"

namespace fna {
namespace fused {

// The dQ role's layout (fna_dq_sm90_kernel): the forward's, then dO's tile (Q's layout) on the
// next 1024-byte boundary; as many CTAs per SM as shared memory holds, at most 4, with at least
// 168 registers per thread (S, dP and dQ take 96 of them at 64-key tiles and head dim 64).
template <class Tr>
struct Sm90DqLayout {
  static constexpr uint32_t kOffO =
      (uint32_t(Tr::kWinOffset + Tr::kQ * sizeof(RowWindow)) + 1023u) / 1024u * 1024u;
  static constexpr size_t kSmemBytes = 1024 + size_t(kOffO) + size_t(Tr::kQBytes);
  static constexpr int kBySmem = int((228 * 1024) / (kSmemBytes + 1024));
  static constexpr int kByThreads = 65536 / (Tr::kThreads * 168);
  static constexpr int kMin0 = kBySmem < kByThreads ? kBySmem : kByThreads;
  static constexpr int kMinBlocks = kMin0 > 4 ? 4 : (kMin0 < 1 ? 1 : kMin0);
};

// One key tile of the dQ role for one warpgroup: S = Q K^T and dP = dO V^T (one wgmma group
// each), the mask, P = exp2(S scale log2(e) - LSE log2(e)) (0 where masked: S = -inf, or where
// the row holds no query: LSE = +inf), dS = P (dP - rowsum(dO O)), dQ += dS K with K read
// transposed as the forward reads V. stat[r]: the statistics of the thread's row r.
template <class Tr, class T, class KT, bool kMasked>
__device__ __forceinline__ void sm90_dq_step(FwdState<Tr>& st, uint32_t sQw, uint32_t sOw,
                                             uint32_t sK, uint32_t sV, const KvTile& tile,
                                             const RowWindow* sWin, const float2 (&stat)[2],
                                             const FwdParams& p) {
  constexpr int kN = Tr::kN;
  using MmaS = wgmma::Mma<T, kN>;
  float s[1][kN / 8][4], dp[1][kN / 8][4];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][j][e] = dp[0][j][e] = 0.f;
  // Both products in flight together (issue_s's trailing operand fence would make ptxas wait
  // for S before dP is issued).
  wgmma::fence_operands(s[0]);
  wgmma::fence_operands(dp[0]);
  wgmma::fence();
  const uint64_t dq = wgmma::desc_sw128(sQw, 16, 1024), dk = wgmma::desc_sw128(sK, 16, 1024);
  const uint64_t dO = wgmma::desc_sw128(sOw, 16, 1024), dv = wgmma::desc_sw128(sV, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < Tr::kD / 16; ++kk) {
    const uint32_t a = ((kk >> 2) * (Tr::kQ * 128) + (kk & 3) * 32) / 16;
    const uint32_t b = ((kk >> 2) * (kN * 128) + (kk & 3) * 32) / 16;
    MmaS::ss(s[0], dq + a, dk + b, 1);
    MmaS::ss(dp[0], dO + a, dv + b, 1);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(s[0]);
  wgmma::fence_operands(dp[0]);
  if constexpr (kMasked) apply_mask<Tr, KT>(s, tile, sWin, p.num_add, 0);
#pragma unroll
  for (int j = 0; j < Tr::kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 r = stat[e >> 1];
      s[0][j][e] = mma::fast_exp2(s[0][j][e] * p.scale_log2 - r.x) * (dp[0][j][e] - r.y);
    }
  pv_and_wait<Tr, T>(st, s, sK);  // dQ += dS K
}

// The plain Hopper kernel's body. kDq = false: the forward (p: Q, K, V, O, LSE). kDq = true: the
// backward's dQ kernel on the same tiles and walk (p as strip_params gives it: Q, K, V, and dQ
// in o; bw: dO in a2 and the statistics), after the plain Hopper dK / dV kernel without its dQ:
// per key tile S, dP, dS and dQ += dS K (sm90_dq_step), dQ = scale dS K written once per row,
// no atomics. kBias: the call has a relative positional bias (its own instantiation, as
// fwd_sm80.cuh's; the forward only). kTma: tiles by TMA (tm: Q, K, V maps; om: the dQ role's dO
// map), else by cp.async (kSpread: whole-row copies per warp instruction).
template <class T, int kD, int kRank, class QT, class KT, bool kSpread, bool kBias, bool kDq,
          bool kTma, bool kBiasTiles = false>
__device__ __forceinline__ void fwd_sm90_body(const FwdParams& p, const StripBwd& bw,
                                              const FwdTma& tm, const tma::TokenMap& om) {
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  using BS = BiasSlice<Tr, QT, KT, 1>;
  static_assert(!kBiasTiles || kBias, "slices of a bias");
  static_assert(kD <= 128, "head dim 256 runs the warp-specialized kernel only");
  static_assert(!(kDq && kBias), "the dQ role takes no bias");
  static_assert(!(kTma && kSpread), "spread concerns cp.async copies");
  using Elem = typename Tr::Elem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = mma::smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t sQ = raw + pad;
  const uint32_t sKV = sQ + Tr::kQBytes;
  const uint32_t sO = sQ + Sm90DqLayout<Tr>::kOffO;  // the dQ role's dO tile
  RowWindow* sWin = reinterpret_cast<RowWindow*>(smem_raw + pad + Tr::kWinOffset);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  FwdTile ft;
  if (!fwd_tile<QT>(p, blockIdx.x, ft)) return;
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int hkv = ft.h / p.heads_per_kv;
  const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
  const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];

  // TMA: barrier 0 counts the query tile's bytes (Q, and dO in the dQ role), 1 and 2 the K / V
  // buffers'; thread 0 initializes them and issues every copy.
  __shared__ __align__(8) uint64_t bars[3];
  const uint32_t bar_q = mma::smem_u32(bars);
  auto bar_kv = [&](int buf) { return bar_q + 8u * uint32_t(1 + buf); };
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      mbar::init(bar_q, 1);
      mbar::init(bar_kv(0), 1);
      mbar::init(bar_kv(1), 1);
      mbar::fence_init_for_tma();
      tma::arrive_expect_tx(bar_q, (kDq ? 2 : 1) * Tr::kQBytes);
      tma_query_tile<Tr, QT, Tr::kQ / 64>(tm.q, p, ft, sQ, bar_q);
      if constexpr (kDq) tma_query_tile<Tr, QT, Tr::kQ / 64>(om, p, ft, sO, bar_q);
    }
  } else {
    copy_q_tile<Tr, QT, Tr::kThreads, kSpread>(threadIdx.x, p, ft, sQ);
  }
  float2 stat[2];
  if constexpr (kDq) {
    // dO's tile as Q's (its D_v columns), and the statistics of this thread's two rows.
    const Elem* gO = static_cast<const Elem*>(bw.a2) + ft.b * bw.a2_stride[0] +
                     ft.h * bw.a2_stride[4];
    auto src = [&](int row, const Elem*& a, const Elem*&) {
      int c[kAxes];
      const bool ok = query_row<QT>(ft, row, c);
      a = gO + token_offset<Tr::kFirstAxis>(geo, gr, c, bw.a2_stride);
      return ok;
    };
    if constexpr (!kTma)
      copy_rows_sw<Tr, Tr::kQ, false, Tr::kThreads, decltype(src), kSpread>(
          threadIdx.x, sO, p.dim_v, bw.a2, 0, 0, nullptr, src);
    // Token strides of the statistics' [batch, token, head] rows, lifted like the tensors'.
    const int64_t ts[5] = {0, int64_t(geo.axis[1].length) * geo.axis[2].length,
                           geo.axis[2].length, 1, 0};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int c[kAxes];
      const bool ok = query_row<QT>(ft, warp * Tr::kWarpRows + (lane >> 2) + 8 * r, c);
      const int64_t tok = token_offset<Tr::kFirstAxis>(geo, gr, c, ts);
      stat[r] = ok ? __ldg(bw.stats + (int64_t(ft.b) * p.tokens + tok) * p.heads + ft.h)
                   : make_float2(INFINITY, 0.f);
    }
  }
  mma::cp_async_commit();

  // The span (one axis per warp) and the rows' windows are computed side by side while Q loads.
  __shared__ KvSpan sSpan;
  kv_span_by_warps<QT, KT, Tr::kWarps>(geo, ft, sSpan, warp, lane);
  init_windows<Tr, QT>(geo, gr, ft.qo, sWin);
  BiasRows<Tr> br;
  if constexpr (kBias && !kBiasTiles)
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
    if constexpr (kTma) {
      if (threadIdx.x == 0) tma_kv_tile<Tr>(tm, p, ft, hkv, t, sK, sK + Tr::kTileBytes, bar_kv(buf));
    } else {
      copy_kv_tile<Tr, KT, Tr::kThreads, kSpread>(threadIdx.x, p, ft, hkv, t, gK, gV, sK,
                                                  sK + Tr::kTileBytes);
      mma::cp_async_commit();
    }
  };
  load_kv(cur, 0);

  FwdState<Tr> st;
  init_state(st);
  // kBiasTiles: a key tile's slice of the table is copied into one of two buffers after the
  // kernel's own shared memory the iteration before the tile's (the first before the loop), and
  // published by the loop's barrier.
  BiasTiles<Tr, BS> bt;
  const uint32_t sBias = raw + uint32_t(bias_stage_offset(Tr::kSmemBytes));
  if constexpr (kBias && !kBiasTiles) bias_rows<Tr, QT>(p, ft, warp * Tr::kWarpRows, br);
  if constexpr (kBiasTiles) {
    bt.n = 0;
    bias_tiles_rows<Tr, QT, BS>(p, ft, 0, warp * Tr::kWarpRows, sBias, bt);
    bias_fill<Tr, BS>(p, cur, bt, sBias);
  }
  const uint32_t sQw = sQ + (warp >> 2) * 64 * 128;  // this warpgroup's 64 rows
  const uint32_t sOw = sO + (warp >> 2) * 64 * 128;
  for (int it = 0; it < n_tiles; ++it) {
    if constexpr (kTma) {
      if (it == 0) mbar::wait(bar_q, 0);
      mbar::wait(bar_kv(it & 1), uint32_t(it >> 1) & 1u);
    } else {
      mma::cp_async_wait<0>();
      wgmma::fence_proxy_async();
    }
    // Every warp is done with the other buffer (the previous tile) before it is refilled.
    __syncthreads();
    if (it + 1 < n_tiles) load_kv(kv_tile_next<Tr, KT>(span, n_nbr, cur, it), (it + 1) & 1);
    const KvTile t = cur;
    const uint32_t sK = sKV + (2 * (it & 1)) * Tr::kTileBytes;
    const uint32_t sV = sK + Tr::kTileBytes;
    if constexpr (kDq) {
      if (t.inside)
        sm90_dq_step<Tr, T, KT, false>(st, sQw, sOw, sK, sV, t, sWin, stat, p);
      else
        sm90_dq_step<Tr, T, KT, true>(st, sQw, sOw, sK, sV, t, sWin, stat, p);
    } else {
      if constexpr (kBiasTiles) {
        if (t.inside)
          sm90_step_tiles<Tr, T, KT, false>(st, sQw, sK, sV, t, sWin, bt, p);
        else
          sm90_step_tiles<Tr, T, KT, true>(st, sQw, sK, sV, t, sWin, bt, p);
      } else if (t.inside) {
        sm90_step<Tr, T, KT, false, kBias>(st, sQw, sK, sV, t, sWin, br, p);
      } else {
        sm90_step<Tr, T, KT, true, kBias>(st, sQw, sK, sV, t, sWin, br, p);
      }
    }
    cur = kv_tile_next<Tr, KT>(span, n_nbr, cur, it);
    if constexpr (kBiasTiles)
      if (it + 1 < n_tiles) bias_fill<Tr, BS>(p, cur, bt, sBias);
  }
  if constexpr (kDq) {
    // dQ = scale dS K, columns below D, rows of the call's queries.
    Elem* gdQ = static_cast<Elem*>(p.o) + ft.b * p.o_stride[0] + ft.h * p.o_stride[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int c[kAxes];
      if (!query_row<QT>(ft, warp * Tr::kWarpRows + (lane >> 2) + 8 * r, c)) continue;
      Elem* row = gdQ + token_offset<Tr::kFirstAxis>(geo, gr, c, p.o_stride);
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = j * 8 + 2 * (lane & 3);
        if (col < p.dim)
          *reinterpret_cast<uint32_t*>(row + col) =
              mma::pack2<T>(st.o[0][j][2 * r] * p.scale, st.o[0][j][2 * r + 1] * p.scale);
      }
    }
  } else {
    store_output<Tr, T, QT>(st, p, ft, warp * Tr::kWarpRows, lane);
  }
}

// The plain Hopper forward (kBias: the call has a relative positional bias; kTma: tiles by TMA
// with tm's maps, else cp.async, kSpread: whole-row copies).
template <class T, int kD, int kRank, class QT, class KT, bool kSpread = false, bool kBias = false,
          bool kTma = false, bool kBiasTiles = false>
__global__ void __launch_bounds__(Sm90Traits<T, kD, kRank, QT, KT>::kThreads,
                                  Sm90Traits<T, kD, kRank, QT, KT>::kMinBlocks)
    fna_fwd_sm90_kernel(const FwdParams p, const __grid_constant__ FwdTma tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<T, kD, kRank, QT, KT, kSpread, kBias, false, kTma, kBiasTiles>(p, StripBwd{}, tm,
                                                                             tm.q);
#endif
}

// The backward's dQ kernel on the plain forward's tiles (fwd_sm90_body's dQ role).
template <class T, int kD, int kRank, class QT, class KT, bool kSpread, bool kTma>
__global__ void __launch_bounds__(Sm90Traits<T, kD, kRank, QT, KT>::kThreads,
                                  Sm90DqLayout<Sm90Traits<T, kD, kRank, QT, KT>>::kMinBlocks)
    fna_dq_sm90_kernel(const FwdParams p, const StripBwd bw, const __grid_constant__ DqTma tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  fwd_sm90_body<T, kD, kRank, QT, KT, kSpread, false, true, kTma>(p, bw, tm.fwd, tm.dout);
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
  auto kernel =
      l.tma.on ? (bias ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, true, true>
                       : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, false, true>)
      : l.spread ? (bias ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, true, true>
                         : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, true, false>)
                 : (bias ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, true>
                         : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, false>);
  // Rank 3 (the plan sets rpb_tiles nowhere else): the bias by key-tile slices.
  if constexpr (kRank == 3)
    if (bias && p.rpb_tiles)
      kernel = l.tma.on ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, true, true, true>
               : l.spread ? fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, true, true, false, true>
                          : fna_fwd_sm90_kernel<T, kD, kRank, QT, KT, false, true, false, true>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p, l.tma);
  return cudaGetLastError();
}

template <class T, int kD, int kRank, class QT, class KT>
size_t dq_sm90_smem_bytes() {
  return Sm90DqLayout<Sm90Traits<T, kD, kRank, QT, KT>>::kSmemBytes;
}

template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_dq_sm90(const FwdParams& p, const FwdLaunch& l, const StripBwd& bw,
                           const DqTma& tm, cudaStream_t stream) {
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  auto kernel = tm.fwd.on  ? fna_dq_sm90_kernel<T, kD, kRank, QT, KT, false, true>
                : l.spread ? fna_dq_sm90_kernel<T, kD, kRank, QT, KT, true, false>
                           : fna_dq_sm90_kernel<T, kD, kRank, QT, KT, false, false>;
  constexpr size_t smem = Sm90DqLayout<Tr>::kSmemBytes;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, smem, stream>>>(p, bw, tm);
  return cudaGetLastError();
}

}  // namespace fused
}  // namespace fna
