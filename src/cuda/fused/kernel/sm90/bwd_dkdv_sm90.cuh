// dK / dV (and atomic dQ) kernel of the fused backward on Hopper's warpgroup MMAs (wgmma,
// sm_90a): the algorithm of bwd_dkdv_sm80.cuh (one multi-dimensional key/value tile per CTA, the query
// tiles of its inverse neighborhood, everything transposed with keys as rows), with the five
// products issued per warpgroup:
//   S^T  = K Q^T     wgmma m64n64, A = this warpgroup's 64 keys, B = the 64-query tile (both
//   dP^T = V dO^T    K-major, from 128-byte-swizzled shared memory)
//   mask, P^T = exp2(S^T scale - LSE), dS^T = P^T (dP^T - rowsum(dO O))   (registers, per thread
//                    exactly as bwd_dkdv_sm80.cuh: the accumulator layout per warp is mma.sync's)
//   dV += P^T dO     wgmma m64nD, A = P^T from registers, B = dO read transposed (MN-major)
//   dK += dS^T Q     the same with dS^T and Q
//   dQ  = dS K       wgmma m64n64 per 64 head-dim columns, A = dS^T staged in shared memory and
//                    read transposed, B = K read transposed; added into the float32 dQ buffer
//                    with vector atomics (warpgroup w takes the column blocks w, w + 2, ...).
// CTA: 128 keys (two warpgroups, 8 warps) x query tiles of 64, the shapes the host tiling of the
// 16-bit backward already uses (bwd_launch.cuh), 16-bit elements, head dims padded to 64 or 128,
// atomic-dQ mode only (the deterministic mode keeps the mma.sync kernels). One CTA per SM (dK, dV,
// S^T and dP^T take the 255 registers). Measured on an H100 (2026-11-22): half tiles (one
// warpgroup, 64 keys, two CTAs per SM) ran the standard problems' forward+backward 15-17% slower,
// and dQ per warpgroup over its own keys (no barrier before dQ, twice the atomics) 4-10% slower.
// The 64-key instance (kKVRows = 64, one warpgroup taking every dQ column block) serves small
// windows, where a 64-key tile's inverse neighborhood spans fewer query tiles per key (the plan
// weighs the steps: plan/bwd_choice.cu). At head dim 64 it runs three CTAs per SM: at most 168
// registers (__launch_bounds__; about 80 bytes spill) and two query-tile buffers (65 KB of shared
// memory; DkdvSm90Traits::kBufs). Against two CTAs with three buffers (214 registers) that ran
// forward+backward 0.88x on dinat-t, 0.94x on nat-t and 0.91x on 1d-small (H200, same-run A/B,
// 2026-11-26); the bias instance over 64 columns keeps its registers (it spills more at 168).
// Over 32 columns (kDn, head dims up to 32) the products halve and nothing spills at 168 (the
// bias instance 16 bytes).
//
// The step is latency-bound (Nsight Compute, 2d-large: two warps per scheduler, 0.4 eligible, the
// tensor pipe ~33% busy), so instructions on its path count: the border mask is one bit test per
// element from per-CTA bit sets (mask_key_rows_bits), whole query rows take load_q_rows' unrolled
// copy loop, and the dQ rows' indices are read before the wait for dQ. Together 1.06-1.12x
// forward+backward on 2d-large and 1.04-1.07x on 3d-video (same-process A/B, H100,
// docs/benchmarks.md). Measured and dropped there: dQ staged in shared memory and added by bulk
// reductions (cp.reduce.async.bulk, no faster than the atomics), query tiles published on
// mbarriers without the step's first barrier (1-2% alone, slower with the lean loads), the next
// tile's load issued during S^T / dP^T (spills, 2-4% slower), per-CTA row offsets for the loads
// and accumulators started by scale-d = 0 (both within 1%).
//
// dkdv_sm90_ws_kernel (bwd_dkdv_sm90_ws.cuh) is the same step (Sm90Step) in a warp-specialized
// CTA: a data-movement warpgroup does the copies and the dQ reductions. The plan's default where
// key tiles visit many query tiles (plan/bwd_choice.cu).
#pragma once

#include "cuda/fused/kernel/common/bwd_bias.cuh"
#include "cuda/fused/kernel/common/bwd_sm90_parts.cuh"

namespace fna {
namespace bwd {

// kBias: the call has a relative positional bias (its own instantiation, as bwd_dkdv_sm80.cuh's).
// kDn: the head-dim columns the products cover and the copies fill (Sm90Step; 32 for head dims
// up to 32 with 64-key tiles, in the head-dim-64 layout).
// kSteps = 2 (head dim 64, 128 keys, no bias): each step takes two consecutive query tiles of the
// walk, stored one after the other as one 128-row tile: S^T and dP^T are m64n128 products, dV
// and dK run 8 k-steps, and each warpgroup computes dQ for one of the two tiles (with one tile
// per step at head dim 64, dQ's single column block falls to warpgroup 0 alone). The steps, the
// barriers and the waits per query halve. A walk of odd length ends with an empty second tile
// (zero rows, statistics that make P = 0, no dQ rows). Only where tuning bwd_q_pairs asks: on
// whole-grid windows it ran forward+backward 1.02-1.05x faster than one tile per step, but the
// warp-specialized kernel (unpaired), which the plan runs there, 1.40-1.44x (H200).
// kDqOut = false: no dQ (no dQ products, atomics or barrier before them); the strip dQ kernel
// (fwd_strip.cuh kDq) computes dQ after it (BwdLaunch::dq_strip).
template <typename T, int kD, int kKVRows = 128, bool kBias = false, int kDn = kD, int kSteps = 1,
          bool kDqOut = true>
__global__ void __launch_bounds__(2 * kKVRows,
                                  kKVRows == 64 && kD == 64 && (!kBias || kDn == 32) ? 3 : 1)
    dkdv_sm90_kernel(const Params p, const bool additional) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkdvSm90Traits<T, kD, kKVRows, kSteps>;
  static_assert(kSteps == 1 || (!kBias && kDn == kD), "paired tiles: no bias, every column");
  static_assert(kDqOut || (kSteps == 1 && !kBias), "without dQ: one tile per step, no bias");
  constexpr int kBufs = Tr::kBufs;
  using E = T;
  constexpr int kKV = Tr::kKV, kQ = Tr::kQ, kThreads = Tr::kThreads, kChunks = kDn / 8;
  constexpr int kTileQ = Tr::kTileQ;  // queries per tile (kQ per step)
  constexpr int kNB = kQ / 8;   // n8 blocks of the step's queries
  constexpr int kDB = kDn / 8;  // n8 blocks of the head dim the products cover

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  uint32_t base;
  unsigned char* smem = smem_1024(smem_raw, base);
  float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kOffStat);
  uint32_t* s_qoff = reinterpret_cast<uint32_t*>(smem + Tr::kOffQoff);
  int2* s_kinv = reinterpret_cast<int2*>(smem + Tr::kOffKinv);
  int64_t* s_tok = reinterpret_cast<int64_t*>(smem + Tr::kOffTok);
  int* s_full = reinterpret_cast<int*>(smem + Tr::kOffFull);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  // ---- which tile this CTA owns (as bwd_dkdv_sm80.cuh) ----------------------------------------------
  int b, hkv, kv0[kAxes] = {0, 0, 0};
  Group G;
  int64_t n0 = 0;
  if (!dkdv_tile_of(p, additional, kKV, b, hkv, kv0, G, n0)) return;

  // ---- the key/value tile, once; the query tiles it visits (bwd_ktile.cuh) --------------------
  load_kv_rows<E, kKV, kThreads, kChunks>(p, G, additional, b, hkv, kv0, n0, smem + Tr::kOffK,
                                          smem + Tr::kOffV, true,
                                          [](int row, int c) { return sw128<kKV>(row, c); });
  nbr::Range qr[kAxes];
  int nq[kAxes];
  uint64_t* s_cm = reinterpret_cast<uint64_t*>(smem + Tr::kOffCm);
  const int64_t n_tiles =
      sm90_query_setup<kKV, kTileQ, kBias>(p, G, additional, kv0, n0, s_kinv, s_qoff, s_cm, qr, nq);
  const int64_t n_iter = (n_tiles + kSteps - 1) / kSteps;  // steps

  // The query tiles (bwd_qtiles.cuh): Q, dO, statistics and row indices into tile slot `slot`
  // (tile slot % kSteps of step buffer slot / kSteps), one cp.async group per tile.
  QWalk cur;
  cur.start(p, additional, hkv, qr);
  auto load_q_tile = [&](const QWalk& w, int slot) {
    auto sw = [](int row, int c) { return sw128<kTileQ>(row, c); };
    load_q_rows<E, kTileQ, kThreads, kChunks, decltype(sw), true>(
        p, G, additional, b, kv0, w, s_qoff, smem + Tr::kOffQ + slot * Tr::kTileBytes,
        smem + Tr::kOffO + slot * Tr::kTileBytes, s_stat + slot * kTileQ,
        s_tok + slot * kTileQ, s_full + slot, sw);
  };
  // The empty second tile of a walk of odd length: zero rows (finite products), statistics
  // with P = exp2(-inf) = 0, no dQ rows; an (empty) cp.async group like a loaded tile's.
  auto clear_q_tile = [&](int slot) {
    clear_q_rows<kTileQ, kThreads, Tr::kTileBytes>(
        smem + Tr::kOffQ + slot * Tr::kTileBytes, smem + Tr::kOffO + slot * Tr::kTileBytes,
        s_stat + slot * kTileQ, s_tok + slot * kTileQ, s_full + slot, tid);
    cp_async_commit();
  };

  using Step = Sm90Step<T, kD, kKVRows, kDn, kQ>;
  constexpr int kDq = Step::kDq, kDqBlocks = kDn / kDq;  // dQ columns per block, blocks
  constexpr int kWG = kKV / 64;  // warpgroups
  float acc_dk[kDB][4], acc_dv[kDB][4];
  Step::zero_acc(acc_dk, acc_dv);
  const uint32_t aK = base + Tr::kOffK + wg * 64 * 128;  // this warpgroup's 64 keys
  const uint32_t aV = base + Tr::kOffV + wg * 64 * 128;
  const int wrow = warp * 16;
  // Relative positional bias: d rpb sums per head in shared memory after the kernel's own
  // (BwdLaunch::bias_smem; bwd_bias.cuh).
  BwdBias bias{};
  if constexpr (kBias)
    bias = bias_setup<kThreads, kQ>(p, additional, true, kv0, wrow, lane, cur.h, s_qoff,
                                    smem_raw + bias_region_offset(Tr::kSmem), tid);

  // Steps are loaded kBufs - 1 iterations ahead: `ahead` walks the tile loaded next, `loaded`
  // counts the tiles loaded (or cleared).
  QWalk ahead = cur;
  int64_t loaded = 0;
  auto load_step = [&](int sbuf) {
#pragma unroll
    for (int h = 0; h < kSteps; ++h) {
      if (kSteps == 1 || loaded < n_tiles) {
        load_q_tile(ahead, sbuf * kSteps + h);
        ahead.next(p, additional, qr, nq);
      } else {
        clear_q_tile(sbuf * kSteps + h);
      }
      ++loaded;
    }
  };
  for (int i = 0; i < kBufs - 1; ++i)
    if (i < n_iter) load_step(i);
  int buf = 0;
  // Loads step it + kBufs - 1 into the buffer of step it - 1 (free: step it - 1 is complete in
  // every warpgroup once the step's first barrier is passed).
  auto prefetch = [&](int64_t it) {
    if (it + kBufs - 1 < n_iter) load_step(buf == 0 ? kBufs - 1 : buf - 1);
  };
  for (int64_t it = 0; it < n_iter; ++it) {
    // Step it landed (the later steps' groups may still be in flight).
    if (it + 1 < n_iter)
      mma::cp_async_wait<(kBufs - 2) * kSteps>();
    else
      cp_async_wait_all();
    wgmma::fence_proxy_async();
    __syncthreads();
    prefetch(it);
    if constexpr (kBias) bias_next_head<kThreads>(p, bias, cur.h, tid);
    const uint32_t aDs = base + Tr::kOffDs;
    const int* q0 = cur.q0;
    const uint32_t aQ = base + Tr::kOffQ + buf * Tr::kQBytes;
    const uint32_t aO = base + Tr::kOffO + buf * Tr::kQBytes;
    const float2* stat = s_stat + buf * kQ;

    // Border pairs only (bwd_ktile.cuh): a key row keeps the queries of its inverse window.
    QWalk second;  // a paired step's second tile
    if constexpr (kSteps == 2) second = cur.after(p, additional, qr, nq);
    auto mask = [&](float (&sm)[kNB][4]) {
      mask_step<kSteps>(sm, s_full + buf * kSteps, s_kinv, s_cm, p, q0, second.q0, wrow, lane);
    };

    // S^T = K Q^T and dP^T = V dO^T over the head dim; P^T, dS^T (dS^T also to shared memory
    // for dQ); dV += P^T dO issued (it runs while the warpgroups meet at the barrier below).
    // Without a bias, P^T is computed while dP^T runs and dS^T while dV does (step_products;
    // the bias instances keep both in turn: with it ptxas spilled 2-3x more there).
    float s[kNB][4], dp[kNB][4];
    uint32_t ap[kNB / 2][4], ad[kNB / 2][4];
    if constexpr (kBias) {
      Step::sdp(s, dp, aK, aV, aQ, aO);
      mask(s);
      if (bias.on) {
        bias_softmax<kNB, true>(p, bias, cur.h, s, dp, stat, bias.qrel, q0, lane);
        Step::pack(s, dp, ap, ad, smem + Tr::kOffDs, wrow, lane);
      } else {
        Step::softmax_pack(s, dp, stat, p.scale_log2, ap, ad, smem + Tr::kOffDs, wrow, lane);
      }
      Step::issue_acc(acc_dv, ap, aO);
    } else {
      Step::step_products(s, dp, acc_dv, aK, aV, aQ, aO, stat, p.scale_log2, ap, ad,
                          kDqOut ? smem + Tr::kOffDs : nullptr, wrow, lane, mask, [] {});
    }

    // dK += dS^T Q (B read transposed: [query][d] rows, 16 queries per k-step) is issued after
    // dQ, so that it runs while this warpgroup's dQ atomics are issued (measured 0-1.9% faster
    // forward+backward than issuing it before the barrier, within noise: docs/benchmarks.md).
    auto issue_dk = [&]() { Step::issue_acc(acc_dk, ad, aQ); };

    // dQ = dS K over the CTA's keys: every warpgroup's dS^T must be in shared memory. Column
    // block cblk of dQ goes to warpgroup cblk % kWG (one warpgroup takes both blocks at head dim
    // 128 with 64-key tiles); with paired tiles, warpgroup w takes tile w's rows. The dQ block's
    // atomics, after its MMAs are waited for; rows from `rbase` of the step.
    auto add_dq = [&](float (&dqa)[kDq / 8][4], int cblk, int rbase) {
      // This thread's two query rows (row0, row0 + 8) and their flat indices.
      const int row0 = rbase + (warp & 3) * 16 + (lane >> 2);
      const int64_t tok[2] = {s_tok[buf * kQ + row0], s_tok[buf * kQ + row0 + 8]};
      wgmma::fence_operands(dqa);
      // The block's columns all exist (no padding): one address per row, constant offsets.
      const bool whole = cblk * kDq + kDq <= p.dim;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t t = tok[half];
        if (t < 0) continue;
        const int col0 = cblk * kDq + 2 * (lane & 3);
        float* dst = p.dq_accum + t * p.dq_row + col0;
        if (whole) {
#pragma unroll
          for (int n = 0; n < kDq / 8; ++n)
            atomicAdd(reinterpret_cast<float2*>(dst + n * 8),
                      make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]));
        } else {
#pragma unroll
          for (int n = 0; n < kDq / 8; ++n)
            if (col0 + n * 8 < p.dim)
              atomicAdd(reinterpret_cast<float2*>(dst + n * 8),
                        make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]));
        }
      }
    };
    if constexpr (!kDqOut) {
      issue_dk();
    } else {
    wgmma::fence_proxy_async();
    __syncthreads();
    if constexpr (kSteps == 2) {
      // dQ rows of tile wg (A: its 64 query columns of dS^T, the region at wg * kKV rows).
      float dqa[kDq / 8][4];
      Step::issue_dq(dqa, aDs + wg * (kKV * 128), base + Tr::kOffK);
      issue_dk();
      wgmma::wait<1>();  // dV and dQ done; dK runs on
      add_dq(dqa, 0, wg * kTileQ);
    } else if constexpr (kWG == 2) {
      // wgmma issues and waits stay outside branches ptxas cannot prove warp-uniform (it
      // serializes those).
      static_assert(kDqBlocks <= 2, "at most one dQ column block per warpgroup");
      if (wg >= kDqBlocks) issue_dk();  // no dQ block for this warpgroup
#pragma unroll 1
      for (int cblk = wg; cblk < kDqBlocks; cblk += 2) {
        float dqa[kDq / 8][4];
        Step::issue_dq(dqa, aDs, base + Tr::kOffK + cblk * kKV * 128);
        issue_dk();
        wgmma::wait<1>();  // dV and dQ done; dK runs on
        add_dq(dqa, cblk, 0);
      }
    } else {
      // One warpgroup: every dQ column block in turn, dK issued after the first.
#pragma unroll
      for (int cblk = 0; cblk < kDqBlocks; ++cblk) {
        float dqa[kDq / 8][4];
        Step::issue_dq(dqa, aDs, base + Tr::kOffK + cblk * kKV * 128);
        if (cblk == 0) {
          issue_dk();
          wgmma::wait<1>();  // dV and this block's dQ done; dK runs on
        } else {
          wgmma::wait<0>();  // this block's dQ (issued after dK) done
        }
        add_dq(dqa, cblk, 0);
      }
    }
    }  // kDqOut
    // dV / dK (and, for a warpgroup without a dQ block, everything) complete before the buffers
    // and dS^T are overwritten after the next barrier.
    Step::wait_all(acc_dv, acc_dk, ap, ad);
    if constexpr (kSteps == 2)
      cur = second.after(p, additional, qr, nq);
    else
      cur.next(p, additional, qr, nq);
    buf = buf + 1 == kBufs ? 0 : buf + 1;
  }

  if constexpr (kBias) {
    if (bias.acc != nullptr) {
      __syncthreads();  // every thread's adds to the last head's table
      bias_flush<kThreads>(p, bias, tid);
    }
  }

  // ---- epilogue: rows are keys; dK carries the softmax scale -----------------------------------
  store_dkdv<true, true, kDB, E>(p, G, additional, b, hkv, kv0, n0, wrow, lane, acc_dk, acc_dv);
#endif
}

}  // namespace bwd
}  // namespace fna
