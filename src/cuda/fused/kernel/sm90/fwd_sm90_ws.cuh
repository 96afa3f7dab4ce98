// The warp-specialized Hopper forward (sm_90a): the kernel of fwd_sm90.cuh's algorithm with a
// loader warpgroup, its TMA maps, and the launchers of both kernels (instantiated by
// fwd_sm90_inst.cu.in).
#pragma once

#include <cstdlib>
#include <string>

#include "cuda/common/tma.cuh"
#include "cuda/fused/kernel/common/sm90_fwd_parts.cuh"

namespace fna {
namespace fused {


// The warp-specialized variant (128-query tiles): warpgroups 0 and 1 compute (64 query rows
// each), warpgroup 2 loads. The loader loads Q, then each key/value tile into a ring of kStages
// buffers: by TMA where fwd_tma_maps describes the problem (one thread issues a tile's boxes after
// an arrive.expect_tx on the buffer's "full" mbarrier; docs/design.md "TMA loads"), else by
// cp.async, each loader thread's cp.async.mbarrier.arrive counting on "full" once its copies have
// landed (the compute threads fence the async proxy after waiting); the loader waits for the
// compute warpgroups' arrives on the buffer's "empty" mbarrier before refilling it. With the loads and the per-tile barrier off the compute warps and the
// registers moved to them (setmaxnreg, Sm90WsTraits: e.g. 224 each and 56 for the loader), each compute warpgroup
// overlaps its MMAs with its softmax: for tile j it issues S_j = Q K_j^T and then
// O += P_{j-1} V_{j-1}, computes the softmax of S_j while P V runs, and only then rescales O and
// hands buffer j - 1 back. (Making the two compute warpgroups take turns issuing their MMAs,
// FlashAttention-3's ping-pong, measured no faster here: 0.99 / 0.98 / 1.00x on 1d-long /
// 2d-large / 3d-video, H100, 2026-11-22.) The compute threads compute their own rows' windows, so
// all shared memory but the barriers holds tiles: at head dim 128 with 64-key tiles, Q and six
// K/V stages take 224 KiB. Each compute warpgroup multiplies only the run of key tiles its own 64
// rows need (rows_span / rows_walk: with 3x8x8 query tiles and 18-frame windows, one frame per
// warpgroup, the first and last warpgroups skip one of the union's ten frame tiles, and on a
// causal axis more at its start) and skips the mask on tiles inside all of its rows' windows.
// The fna_fwd_sm90ws_* configurations run it (the plan's cost model takes them where they win:
// long runs of key tiles, one CTA per SM; head dim 256 has no other), one CTA per query tile, or persistent (Tuning::persistent): one CTA
// per SM walks query tiles, so the next tile's Q and first key tiles load while the current one
// finishes.
// Head dim 256: Q (64 KiB) and two K / V stages fill shared memory, so a stage's K and V have
// barriers of their own (kSplit): K's buffer goes back as soon as S has read it and V's once P V
// has, so the loader refills K one tile and V two tiles ahead of their MMAs. O takes 128 of a
// compute thread's registers; P V runs as two n128 halves.
// kBiasBytes: with a bias, the compute warpgroups' slice buffers (BiasSlice) after the stages,
// which then number as many as fit beside them.
template <class Tr, size_t kBiasBytes = 0>
struct Sm90WsTraits {
  static constexpr int kConsumers = Tr::kQ / 64;  // compute warpgroups
  static constexpr int kThreads = Tr::kThreads + 128;
  static constexpr int kFit =
      int((226 * 1024 - Tr::kQBytes - kBiasBytes) / (2 * Tr::kTileBytes));
  static constexpr int kStages = kFit < 6 ? kFit : 6;
  // Fewer than three stages (head dim 256): K and V full / empty barriers apart.
  static constexpr bool kSplit = kStages < 3;
  static constexpr size_t kBiasOffset = size_t(Tr::kQBytes) + size_t(kStages) * 2 * Tr::kTileBytes;
  static constexpr size_t kSmemBytes = 1024 + kBiasOffset + kBiasBytes;
  // Registers after setmaxnreg: the CTA's 64K split between the loader and the compute
  // warpgroups (multiples of 8).
  static constexpr int kLoaderRegs = kConsumers == 2 ? 56 : 32;
  static constexpr int kComputeRegs = kConsumers == 2 ? 224 : 160;
  // Head dim 256, where O alone takes 128 of a compute thread's registers: 24 / 240 with TMA
  // loads (one loader thread issues them; no spills), 56 / 224 with cp.async (the fallback;
  // ptxas spills 256 / 548 bytes there).
  template <bool kTma>
  static constexpr int loader_regs() { return Tr::kD == 256 ? (kTma ? 24 : 56) : kLoaderRegs; }
  template <bool kTma>
  static constexpr int compute_regs() { return Tr::kD == 256 ? (kTma ? 240 : 224) : kComputeRegs; }
  // setmaxnreg moves registers within what the launch gave the CTA (the launch bound's
  // per-thread count, 65536 / kThreads rounded down to 8, times kThreads): asking for more makes
  // the compute warpgroups' increase wait forever.
  static constexpr int kPool = kThreads * (65536 / kThreads / 8 * 8);
  template <bool kTma>
  static constexpr bool regs_fit() {
    return 128 * loader_regs<kTma>() + kConsumers * 128 * compute_regs<kTma>() <= kPool;
  }
  static_assert(regs_fit<true>() && regs_fit<false>(), "registers beyond the CTA's pool");
  static_assert(kStages >= 3 || (kSplit && kStages == 2),
                "a stage ahead of the two the compute warpgroups hold, or K and V apart");
  static_assert(kConsumers == 2 || kConsumers == 3,
                "the warp-specialized forward takes 128- or 192-query tiles");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// kBias: the call has a relative positional bias (its own instantiation, as fwd_sm80.cuh's).
template <class T, int kD, int kRank, class QT, class KT, bool kTma = false, bool kBias = false>
__global__ void __launch_bounds__(Sm90WsTraits<Sm90Traits<T, kD, kRank, QT, KT>>::kThreads, 1)
    fna_fwd_sm90_ws_kernel(const FwdParams p, const int num_ctas, int* tile_counter,
                           const __grid_constant__ FwdTma tm, const int wg_rows) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  using BS = BiasSlice<Tr, QT, KT, Tr::kQ / 64>;
  using Ws = Sm90WsTraits<Tr, kBias ? BS::kBytes : 0>;
  using Elem = typename Tr::Elem;
  constexpr int kStages = Ws::kStages;
  constexpr bool kSplit = Ws::kSplit;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = mma::smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t sQ = raw + pad;
  const uint32_t sKV = sQ + Tr::kQBytes;
  // full[s], empty[s], Q full, Q empty, tile id published [2]; kSplit: then V's full[s], empty[s]
  // (full / empty then count K's buffer alone); kBias: then each compute warpgroup's slice
  // buffers' full[2], then their empty[2].
  constexpr int kC = Ws::kConsumers;
  constexpr int kBars = (kSplit ? 4 : 2) * kStages + 4;
  __shared__ __align__(8) uint64_t bars[kBars + (kBias ? 4 * kC : 0)];
  __shared__ int s_tile[2];
  const uint32_t bar0 = mma::smem_u32(bars);
  auto full = [&](int stage) { return bar0 + 8u * uint32_t(stage); };
  auto empty = [&](int stage) { return bar0 + 8u * uint32_t(kStages + stage); };
  const uint32_t q_full = bar0 + 8u * uint32_t(2 * kStages);
  const uint32_t q_empty = q_full + 8u;
  auto tile_full = [&](int slot) { return q_full + 16u + 8u * uint32_t(slot); };
  auto full_v = [&](int stage) {
    return kSplit ? bar0 + 8u * uint32_t(2 * kStages + 4 + stage) : full(stage);
  };
  auto empty_v = [&](int stage) {
    return kSplit ? bar0 + 8u * uint32_t(3 * kStages + 4 + stage) : empty(stage);
  };
  auto bias_full = [&](int wg, int slot) { return bar0 + 8u * uint32_t(kBars + 2 * wg + slot); };
  auto bias_empty = [&](int wg, int slot) {
    return bar0 + 8u * uint32_t(kBars + 2 * kC + 2 * wg + slot);
  };
  // With a bias the loader warpgroup copies the compute warpgroups' key-tile slices (BiasSlice)
  // into their buffers (sBias0: the first warpgroup's first), up to two slices ahead: with TMA
  // its warp 1 + w fills warpgroup w's alone (warp 0 issues the copies; the warps' fills run
  // side by side, each a warp's loads in flight at once), else its 128 threads fill every
  // warpgroup's after each tile's cp.async copies. With TMA warps 1-3 read the tile numbers
  // too, so they also arrive on Q empty once they have.
  static_assert(kC <= 3, "a loader warp per compute warpgroup");
  constexpr int kFillers = kTma ? 32 : 128;  // threads per slice
  const uint32_t sBias0 = sQ + uint32_t(Ws::kBiasOffset);

  // With TMA loads (kTma: tm holds the maps) one loader thread arrives on "full" / "Q full" with
  // the tiles' bytes.
  constexpr bool use_tma = kTma;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar::init(full(i), use_tma ? 1 : 128);  // the loader's threads
      mbar::init(empty(i), Tr::kThreads);      // the compute threads
      if constexpr (kSplit) {
        mbar::init(full_v(i), use_tma ? 1 : 128);
        mbar::init(empty_v(i), Tr::kThreads);
      }
    }
    mbar::init(q_full, use_tma ? 1 : 128);
    mbar::init(q_empty, Tr::kThreads + (kBias && use_tma ? 96 : 0));
    if constexpr (kBias) {
      for (int i = 0; i < 2 * kC; ++i) {
        mbar::init(bias_full(i / 2, i % 2), kFillers);
        mbar::init(bias_empty(i / 2, i % 2), 128);  // the warpgroup's threads
      }
    }
    mbar::init(tile_full(0), 1);
    mbar::init(tile_full(1), 1);
    if constexpr (use_tma) mbar::fence_init_for_tma();
  }
  __syncthreads();
  const Geometry& geo = p.geo;
  // Persistent: the loader takes query tiles from `tile_counter` (one atomic add each, so tiles go
  // out in order to whichever CTA is free: the running ones stay neighbors sharing K/V in L2, and
  // uneven tiles balance) and publishes each number in s_tile[j % 2] on tile_full(j % 2); without
  // a counter the CTA takes tile blockIdx.x alone. Both roles count key tiles `g` over all query
  // tiles, so the stage ring and its phases carry on from one query tile to the next: the loader
  // fetches the next tile's Q (once the compute warps' last S of the current tile is done: Q
  // empty) and key tiles while the compute warps finish the current one. Slot j % 2 is rewritten
  // only after Q empty of tile j - 1, by which time the compute warps have read tile j - 2's
  // number. Every tile number, valid or not, passes Q full and Q empty once.

  if (threadIdx.x >= Tr::kThreads) {
    // Loader warpgroup.
    mbar::regs_dec<Ws::template loader_regs<kTma>()>();
    const int tid = threadIdx.x - Tr::kThreads;
    // Warpgroup w's run of key tiles over the walk of a query tile (as it finds it below).
    auto wg_run = [&](const FwdTile& ft, const KvSpan& span, int n_nbr, int n_tiles, int w) {
      const RowsSpan rs = wg_rows ? rows_span(geo, ft.gr, ft.qo, ft.qhi, ext_of<QT>(), w * 64, 64)
                                  : rows_span(geo, ft.gr, ft.qo, ft.qhi, ext_of<QT>(), 0, Tr::kQ);
      return rows_walk(span, rs, ext_of<KT>(), n_nbr, n_tiles);
    };
    // Slice number n (of warpgroup w's, counted over the CTA's walk) for key tile t into buffer
    // n % 2, once the warpgroup has preloaded slice n - 2 from it (additional-key tiles copy
    // nothing: bias_preload gives them zeros).
    auto bias_slice = [&](const KvTile& t, const BiasSrc& src, int w, int n, int ftid) {
      const int slot = n & 1;
      if (n >= 2) mbar::wait(bias_empty(w, slot), uint32_t((n >> 1) - 1) & 1u);
      if (t.add_begin < 0)
        bias_copy<Tr, BS, kFillers>(p, t, src, sBias0 + uint32_t(2 * w + slot) * BS::kPitch * 4u,
                                    ftid);
      mbar::arrive(bias_full(w, slot));
    };
    // TMA: the loader's first warp alone walks the tiles (its lane 0 issues the copies); with a
    // bias warp 1 + w walks warpgroup w's run, filling its slices.
    if (use_tma && tid >= 32) {
      if constexpr (kBias) {
        const int w = (tid >> 5) - 1;
        int n = 0;
        for (int j = 0;; ++j) {
          mbar::wait(tile_full(j & 1), uint32_t(j >> 1) & 1u);
          const int blk = s_tile[j & 1];
          if (blk >= num_ctas) break;
          FwdTile ft;
          const bool valid = fwd_tile<QT>(p, blk, ft);
          mbar::arrive(q_empty);  // s_tile[j % 2] read
          if (!valid || w >= kC) continue;
          const KvSpan span = kv_span<QT, KT>(geo, ft.gr, ft.qo, ft.qhi);
          const int n_nbr = span.total();
          const int n_tiles = n_nbr + (p.num_add + Tr::kN - 1) / Tr::kN;
          const WalkRun run = wg_run(ft, span, n_nbr, n_tiles, w);
          const BiasSrc src = bias_src<Tr, BS>(p, ft, w);
          KvTile cur = kv_tile<Tr, KT>(span, n_nbr, run.first);
          for (int it = run.first; it < run.last; ++it, ++n) {
            bias_slice(cur, src, w, n, tid & 31);
            cur = kv_tile_next<Tr, KT>(span, n_nbr, cur, it);
          }
        }
      }
      return;
    }
    // cp.async: every loader thread, for each warpgroup whose run holds the tile.
    int nb[kC], run_first[kC], run_last[kC];
    BiasSrc bsrc[kC];
#pragma unroll
    for (int w = 0; w < kC; ++w) nb[w] = 0;
    auto bias_runs = [&](const FwdTile& ft, const KvSpan& span, int n_nbr, int n_tiles) {
#pragma unroll
      for (int w = 0; w < kC; ++w) {
        const WalkRun run = wg_run(ft, span, n_nbr, n_tiles, w);
        run_first[w] = run.first;
        run_last[w] = run.last;
        bsrc[w] = bias_src<Tr, BS>(p, ft, w);
      }
    };
    auto bias_tile = [&](const KvTile& t, int it) {
#pragma unroll
      for (int w = 0; w < kC; ++w)
        if (it >= run_first[w] && it < run_last[w]) bias_slice(t, bsrc[w], w, nb[w]++, tid);
    };
    if (use_tma && tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm.q.map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm.k.map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm.v.map)) : "memory");
    }
    int g = 0;  // key tiles so far
    for (int j = 0;; ++j) {
      if (j > 0) mbar::wait(q_empty, uint32_t(j - 1) & 1u);
      if (tid == 0) {
        s_tile[j & 1] = tile_counter != nullptr ? atomicAdd(tile_counter, 1)
                                                : (j == 0 ? int(blockIdx.x) : num_ctas);
        mbar::arrive(tile_full(j & 1));
      }
      if constexpr (use_tma)
        __syncwarp();
      else
        asm volatile("bar.sync 1, 128;" ::: "memory");  // the loader's warps: s_tile written
      const int blk = s_tile[j & 1];
      if (blk >= num_ctas) break;
      FwdTile ft;
      const bool valid = fwd_tile<QT>(p, blk, ft);
      if constexpr (use_tma) {
        if (tid == 0) {
          if (valid) {
            // One box per compute warpgroup's 64 rows (Q's map holds a part: a box of the whole
            // tile would pass TMA's 256 rows per dim at 192 rows with dilation 2).
            tma::arrive_expect_tx(q_full, Tr::kQBytes);
            tma_query_tile<Tr, QT, Ws::kConsumers>(tm.q, p, ft, sQ, q_full);
          } else {
            mbar::arrive(q_full);
          }
        }
      } else {
        if (valid) copy_q_tile<Tr, QT, 128>(tid, p, ft, sQ);
        mbar::arrive_cp_async(q_full);
      }
      if (!valid) continue;
      const int hkv = ft.h / p.heads_per_kv;
      const KvSpan span = kv_span<QT, KT>(geo, ft.gr, ft.qo, ft.qhi);
      const int n_nbr = span.total();
      const int n_tiles = n_nbr + (p.num_add + Tr::kN - 1) / Tr::kN;
      const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
      const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];
      if constexpr (kBias && !use_tma) bias_runs(ft, span, n_nbr, n_tiles);
      KvTile cur = kv_tile<Tr, KT>(span, n_nbr, 0);
      for (int it = 0; it < n_tiles; ++it, ++g) {
        const int stage = g % kStages;
        const uint32_t used = uint32_t((g / kStages) - 1) & 1u;  // the buffers' last round
        if (g >= kStages) mbar::wait(empty(stage), used);
        const uint32_t sK = sKV + (2 * stage) * Tr::kTileBytes;
        if constexpr (kSplit) {
          // K, then V once its buffer is back (V of tile g - kStages is read one step after K).
          const uint32_t sV = sK + Tr::kTileBytes;
          if constexpr (use_tma) {
            int og[kAxes];
            if (tid == 0) {
              kv_tile_origin(p, ft, cur, og);
              tma::arrive_expect_tx(full(stage), Tr::kTileBytes);
              tma_box<Tr, Tr::kN>(tm.k, ft.b, og, hkv, sK, full(stage));
            }
            if (g >= kStages) mbar::wait(empty_v(stage), used);
            if (tid == 0) {
              tma::arrive_expect_tx(full_v(stage), Tr::kTileBytes);
              tma_box<Tr, Tr::kN>(tm.v, ft.b, og, hkv, sV, full_v(stage));
            }
          } else {
            copy_kv_half<Tr, KT, 128, 0>(tid, p, ft, hkv, cur, gK, gV, sK);
            mbar::arrive_cp_async(full(stage));
            if (g >= kStages) mbar::wait(empty_v(stage), used);
            copy_kv_half<Tr, KT, 128, 1>(tid, p, ft, hkv, cur, gK, gV, sV);
            mbar::arrive_cp_async(full_v(stage));
          }
        } else if constexpr (use_tma) {
          // Neighborhood tiles only (tm.on needs num_add == 0).
          if (tid == 0)
            tma_kv_tile<Tr>(tm, p, ft, hkv, cur, sK, sK + Tr::kTileBytes, full(stage));
        } else {
          copy_kv_tile<Tr, KT, 128>(tid, p, ft, hkv, cur, gK, gV, sK, sK + Tr::kTileBytes);
          mbar::arrive_cp_async(full(stage));  // when this thread's copies of the tile land
        }
        if constexpr (kBias && !use_tma) bias_tile(cur, it);
        cur = kv_tile_next<Tr, KT>(span, n_nbr, cur, it);
      }
    }
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    return;
  }

  // Compute warpgroups.
  mbar::regs_inc<Ws::template compute_regs<kTma>()>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t sQw = sQ + (warp >> 2) * 64 * 128;  // this warpgroup's 64 rows
  // With a bias: the slices preloaded so far (the buffer of the next: nb % 2), and the address
  // of the thread's first row in the warpgroup's first buffer (per query tile).
  const int wg = warp >> 2;
  int nb = 0;
  uint32_t brow = 0;
  int g = 0;
  for (int j = 0;; ++j) {
    mbar::wait(tile_full(j & 1), uint32_t(j >> 1) & 1u);
    const int blk = s_tile[j & 1];
    if (blk >= num_ctas) break;
    FwdTile ft;
    if (!fwd_tile<QT>(p, blk, ft)) {
      mbar::wait(q_full, uint32_t(j) & 1u);
      mbar::arrive(q_empty);
      continue;
    }
    KvSpan span_r = kv_span<QT, KT>(geo, ft.gr, ft.qo, ft.qhi);
    const int n_nbr = span_r.total();
    const int n_tiles = n_nbr + (p.num_add + Tr::kN - 1) / Tr::kN;
    RowWindow rw[1][2];  // the thread's two rows' windows, for the mask
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rw[0][r] = row_window<QT>(geo, ft.gr, ft.qo, warp * Tr::kWarpRows + (lane >> 2) + 8 * r);
    FwdState<Tr> st;
    init_state(st);
    // With a bias, S starts from bias / scale (BiasSlice): the softmax's scale is unchanged.
    const float sl2 = p.scale_log2;
    if constexpr (kBias)
      brow = bias_row<Tr, QT, BS>(wg, warp * Tr::kWarpRows, sBias0 + uint32_t(wg) * 2u * BS::kPitch * 4u);
    // The loader's cp.async writes reach the MMAs (async proxy) through the barrier's completion
    // and this thread's proxy fence.
    mbar::wait(q_full, uint32_t(j) & 1u);
    wgmma::fence_proxy_async();
    // This warpgroup's 64 rows (the whole tile's with Tuning::fwd_wg_skip off) need the run of key
    // tiles [run.first, run.last) of the walk; those before and after it are waited for and
    // handed back unread (pass), and the mask is skipped on tiles inside all of the rows'
    // windows. (A run rather than a test per tile: ptxas serializes MMAs under a branch it cannot
    // prove warp-uniform, warning C7518, and such a version ran 3d-video 1.1-1.3x slower.)
    const RowsSpan rs = wg_rows ? rows_span(geo, ft.gr, ft.qo, ft.qhi, ext_of<QT>(), (warp >> 2) * 64, 64)
                                : rows_span(geo, ft.gr, ft.qo, ft.qhi, ext_of<QT>(), 0, Tr::kQ);
    WalkRun run = rows_walk(span_r, rs, ext_of<KT>(), n_nbr, n_tiles);
    // The same on every lane; broadcast so that ptxas sees it (the key-tile counter `g`, the
    // stage and the MMA descriptors built from it stay in uniform registers).
    run.first = __shfl_sync(0xffffffffu, run.first, 0);
    run.last = __shfl_sync(0xffffffffu, run.last, 0);
#pragma unroll
    for (int ax = 0; ax < kAxes; ++ax) {  // kv_tile's `inside`: within all of these rows' windows
      span_r.inner_begin[ax] = __shfl_sync(0xffffffffu, rs.inner_begin[ax], 0);
      span_r.inner_end[ax] = __shfl_sync(0xffffffffu, rs.inner_end[ax], 0);
    }
    auto pass = [&](int count) {
      for (int i = 0; i < count; ++i, ++g) {
        const int stage = g % kStages;
        mbar::wait(full(stage), uint32_t(g / kStages) & 1u);  // the arrival counts for this round
        mbar::arrive(empty(stage));
        if constexpr (kSplit) {
          mbar::wait(full_v(stage), uint32_t(g / kStages) & 1u);
          mbar::arrive(empty_v(stage));
        }
      }
    };
    pass(run.first);
    if (run.last > run.first) {
      float s[1][Tr::kN / 8][4];
      uint32_t a[Tr::kN / 16][4];
      // The run's first tile: S, softmax, P.
      KvTile cur = kv_tile<Tr, KT>(span_r, n_nbr, run.first);
      // With a bias: each tile's scores preloaded from its slice once the loader has filled it
      // (just before its S, where S's registers are free), and the buffer handed back once S
      // has been issued (the loads are in registers by then).
      auto preload = [&]() {
        if constexpr (kBias) {
          mbar::wait(bias_full(wg, nb & 1), uint32_t(nb >> 1) & 1u);
          bias_preload<Tr, KT, BS>(s, cur, brow, nb & 1);
        }
      };
      auto preloaded = [&]() {
        if constexpr (kBias) {
          mbar::arrive(bias_empty(wg, nb & 1));
          ++nb;
        }
      };
      preload();
      int stage = g % kStages;
      mbar::wait(full(stage), uint32_t(g / kStages) & 1u);
      wgmma::fence_proxy_async();
      issue_s<Tr, T, kBias>(s, sQw, sKV + (2 * stage) * Tr::kTileBytes);
      preloaded();
      wgmma::wait<0>();
      wgmma::fence_operands(s[0]);
      if constexpr (kSplit) mbar::arrive(empty(stage));  // K read
      if (cur.inside) {
        softmax_update<Tr, kBias>(st, s, sl2);  // a bias may make a row all -inf
      } else {
        apply_mask_rw<Tr, KT>(s, cur, rw, p.num_add, 0);
        softmax_update<Tr, true>(st, s, sl2);
      }
      pack_p<Tr, T>(s, a);
      for (int it = run.first + 1; it < run.last; ++it) {
        cur = kv_tile_next<Tr, KT>(span_r, n_nbr, cur, it - 1);
        preload();
        const int prev = stage;
        ++g;
        stage = g % kStages;
        mbar::wait(full(stage), uint32_t(g / kStages) & 1u);
        wgmma::fence_proxy_async();
        const uint32_t sK = sKV + (2 * stage) * Tr::kTileBytes;
        const uint32_t sVprev = sKV + (2 * prev + 1) * Tr::kTileBytes;
        issue_s<Tr, T, kBias>(s, sQw, sK);
        preloaded();
        if constexpr (kSplit) {
          mbar::wait(full_v(prev), uint32_t((g - 1) / kStages) & 1u);
          wgmma::fence_proxy_async();
        }
        issue_pv<Tr, T>(st, a, sVprev);
        wgmma::wait<1>();  // S_it done; P V of it - 1 may still run
        wgmma::fence_operands(s[0]);
        if constexpr (kSplit) mbar::arrive(empty(stage));  // K read
        float alpha[1][2];
        bool rescale;
        if (cur.inside) {
          rescale = softmax_scores<Tr, kBias>(st, s, sl2, alpha);
        } else {
          apply_mask_rw<Tr, KT>(s, cur, rw, p.num_add, 0);
          rescale = softmax_scores<Tr, true>(st, s, sl2, alpha);
        }
        wgmma::wait<0>();
        wgmma::fence_operands(st.o[0]);
        wgmma::fence_operands(a);
        mbar::arrive(empty_v(prev));  // (without kSplit: K's and V's buffer)
        rescale_o(st, rescale, alpha);
        pack_p<Tr, T>(s, a);
      }
      // Every S of this query tile is done: Q's buffer may take the next tile's.
      mbar::arrive(q_empty);
      if constexpr (kSplit) {
        mbar::wait(full_v(stage), uint32_t(g / kStages) & 1u);
        wgmma::fence_proxy_async();
      }
      issue_pv<Tr, T>(st, a, sKV + (2 * stage + 1) * Tr::kTileBytes);
      wgmma::wait<0>();
      wgmma::fence_operands(st.o[0]);
      wgmma::fence_operands(a);
      mbar::arrive(empty_v(stage));
      ++g;
    } else {
      mbar::arrive(q_empty);
    }
    store_output<Tr, T, QT>(st, p, ft, warp * Tr::kWarpRows, lane);
    pass(n_tiles - run.last);
  }
#endif
}

template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90ws_smem_bytes() {
  return Sm90WsTraits<Sm90Traits<T, kD, kRank, QT, KT>>::kSmemBytes;
}
// With a bias (the slice buffers; fewer stages where they do not fit beside six).
template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90ws_bias_smem_bytes() {
  using Tr = Sm90Traits<T, kD, kRank, QT, KT>;
  return Sm90WsTraits<Tr, BiasSlice<Tr, QT, KT, Tr::kQ / 64>::kBytes>::kSmemBytes;
}

// One CTA per work item, or persistent (l.persistent: l.grid CTAs take work items from a
// counter, so the next tile's Q and first key tiles load while the current one finishes).
template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_fwd_sm90ws(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  using Ws = Sm90WsTraits<Sm90Traits<T, kD, kRank, QT, KT>>;
  const bool bias = p.rpb != nullptr;
  auto kernel = l.tma.on ? (bias ? fna_fwd_sm90_ws_kernel<T, kD, kRank, QT, KT, true, true>
                                 : fna_fwd_sm90_ws_kernel<T, kD, kRank, QT, KT, true, false>)
                         : (bias ? fna_fwd_sm90_ws_kernel<T, kD, kRank, QT, KT, false, true>
                                 : fna_fwd_sm90_ws_kernel<T, kD, kRank, QT, KT, false, false>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  detail::Workspace ws(stream);  // the persistent CTAs' work counter, freed in stream order
  int* counter = nullptr;
  if (l.persistent) {
    if (!ws.allocate(sizeof(int), "forward tile counter").ok()) return cudaErrorMemoryAllocation;
    counter = ws.as<int>();
    err = cudaMemsetAsync(counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  kernel<<<l.grid, Ws::kThreads, l.smem, stream>>>(p, static_cast<int>(l.ctas), counter, l.tma,
                                                   l.wg_skip ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace fused
}  // namespace fna
