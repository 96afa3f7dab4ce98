// dK / dV (and atomic dQ) kernel of the fused backward on Hopper's warpgroup MMAs at padded head
// dim 256 (sm_90a): the plan's Hopper backward for head dims 129-256 (plan/bwd_choice.cu).
//
// At head dim 256 a warpgroup cannot hold dK and dV of 64 keys (128 + 128 float registers per
// thread), so the two compute warpgroups of a CTA share one 64-key tile and split the head dim:
// warpgroup c accumulates dK and dV columns 128c .. 128c + 127. The two full-width products of a
// step are split between them, so that each warpgroup's tensor work is the same (2.5 units of
// 64 x 64 x 256 multiply-adds per 64-query tile):
//   warpgroup 0: S^T = K Q^T (16 k-steps); S^T as it leaves the MMA (float32) to the exchange
//                buffer for warpgroup 1; mask, P^T = exp2(S^T scale - LSE);
//   warpgroup 1: dP^T = V dO^T (16 k-steps); S^T from the exchange buffer, mask and P^T on its
//                own copy (handing S^T rather than P^T over starts warpgroup 1 one exponential
//                pass earlier: 1.10x forward+backward, H200); dS^T = P^T (dP^T - Dsum); dS^T to
//                shared memory twice: as its register fragments (the exchange buffer, where S^T
//                was) for warpgroup 0's dK, and 128-byte swizzled for dQ;
//   both:        dV_c += P^T dO[:, c half] and dK_c += dS^T Q[:, c half] (register A operands),
//                dQ[:, c half] = dS K[:, c half] in two 64-column blocks (A = dS^T read
//                transposed), added into the float32 dQ buffer with vector atomics.
// Warpgroup 0 moves data as in dkdv_sm90_ws_kernel (bwd_dkdv_sm90_ws.cuh): two warps copy K / V
// once and then each query tile's statistics and row indices into a two-stage ring, Q and dO by
// TMA (or cp.async); there is no room for dQ staging (K, V and two stages of Q and dO take 192 KB).
// Two mbarriers between the compute warpgroups, one phase per step: "P ready" (warpgroup 0 arrives
// after writing S^T, warpgroup 1 waits) and "dS ready" (warpgroup 1 arrives after writing dS^T,
// warpgroup 0 waits); an arrive releases the thread's shared-memory accesses before it, a wait
// acquires them; warpgroup 1 also waits for "dS ready" itself, since its dQ product reads the
// rows of all its warps, and its warps meet at a named barrier (bar 2, 128 threads) before
// rewriting them. Warpgroup 0 writes the next step's S^T only after its own products of this step
// (which read dS^T) are complete, and warpgroup 1 rewrites dS^T only after "P ready", so the
// buffers between the warpgroups need no third barrier.
#pragma once

#include <string>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/fused/plan/bwd_plan.h"
#include "cuda/fused/kernel/common/bwd_sm90_parts.cuh"
#include "cuda/fused/kernel/sm90/bwd_dkdv_sm90_ws.cuh"

namespace fna {
namespace bwd {

template <typename T>
struct DkdvSm90D256Traits {
  static constexpr int kD = 256, kKV = 64, kQ = 64, kTileQ = kQ, kStages = 2;
  static constexpr int kThreads = 384, kLoaderThreads = 64;
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static constexpr int kKVBytes = kKV * kD * 2;  // four 64-column regions of 64 rows
  static constexpr int kQBytes = kQ * kD * 2, kTileBytes = kQBytes;
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffO = kOffQ + kStages * kQBytes;
  static constexpr int kOffX = kOffO + kStages * kQBytes;  // exchange: float [32][128] S^T, then
                                                           // uint32 [16][128] dS^T fragments
  static constexpr int kXBytes = 32 * 128 * 4;
  static constexpr int kOffDs = kOffX + kXBytes;           // dS^T [key][query], swizzled
  static constexpr int kDsBytes = kKV * kQ * 2;
  static constexpr int kOffStat = kOffDs + kDsBytes;               // float2 [kStages][kQ]
  static constexpr int kOffQoff = kOffStat + kStages * kQ * 8;     // uint32 [kQ]
  static constexpr int kOffKinv = kOffQoff + kQ * 4;               // int2 [kKV][kAxes]
  static constexpr int kOffTok = kOffKinv + kKV * kAxes * 8;       // int64 [kStages][kQ]
  static constexpr int kOffFull = kOffTok + kStages * kQ * 8;      // int [kStages]: no mask
  static constexpr int kOffBar = (kOffFull + kStages * 4 + 7) / 8 * 8;  // uint64 mbarriers
  static constexpr int kBars = 2 * kStages + 3;  // full[s], empty[s], kv full, P ready, dS ready
  static constexpr int kOffCm = kOffBar + kBars * 8;               // uint64 [3][65]
  static constexpr size_t kSmem = 1024 + size_t(kOffCm) + kAxes * kColMaskStride * 8;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "registers");
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

template <typename T, bool kTma = false>
__global__ void __launch_bounds__(384, 1) dkdv_sm90_d256_kernel(const Params p,
                                                                const bool additional,
                                                                const __grid_constant__ BwdTma tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkdvSm90D256Traits<T>;
  using E = T;
  constexpr int kKV = Tr::kKV, kQ = Tr::kQ, kD = Tr::kD, kStages = Tr::kStages;
  constexpr int kNB = kQ / 8;   // n8 blocks of the query tile
  constexpr int kHB = 128 / 8;  // n8 blocks of a warpgroup's half of the head dim
  using Tag = typename MmaTag<T>::type;
  using MmaS = wgmma::Mma<Tag, kQ>;    // S^T, dP^T
  using MmaH = wgmma::Mma<Tag, 128>;   // dV, dK halves
  using MmaQ = wgmma::Mma<Tag, 64>;    // dQ blocks

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  uint32_t base;
  unsigned char* smem = smem_1024(smem_raw, base);
  float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kOffStat);
  uint32_t* s_qoff = reinterpret_cast<uint32_t*>(smem + Tr::kOffQoff);
  int2* s_kinv = reinterpret_cast<int2*>(smem + Tr::kOffKinv);
  int64_t* s_tok = reinterpret_cast<int64_t*>(smem + Tr::kOffTok);
  int* s_full = reinterpret_cast<int*>(smem + Tr::kOffFull);
  const WsRing<Tr> ring{base + Tr::kOffBar};
  // Between the compute warpgroups, one phase per step: warpgroup 0's S^T, warpgroup 1's dS^T.
  const uint32_t p_ready = ring.next(), ds_ready = ring.next() + 8u;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  int b, hkv, kv0[kAxes] = {0, 0, 0};
  Group G;
  int64_t n0 = 0;
  if (!dkdv_tile_of(p, additional, kKV, b, hkv, kv0, G, n0)) return;

  if (tid == 0) {
    ring.init();
    mbar::init(p_ready, 128);
    mbar::init(ds_ready, 128);
  }
  nbr::Range qr[kAxes];
  int nq[kAxes];
  uint64_t* s_cm = reinterpret_cast<uint64_t*>(smem + Tr::kOffCm);
  const int64_t n_iter =
      sm90_query_setup<kKV, kQ, true>(p, G, additional, kv0, n0, s_kinv, s_qoff, s_cm, qr, nq);

  if (wg == 0) {
    // ---- data movement (dkdv_sm90_ws_kernel's loader warps) --------------------------------
    mbar::regs_dec<Tr::kProducerRegs>();
    if (warp < 2)
      ws_load<E, Tr, kD, 1, kTma>(p, G, additional, b, hkv, kv0, n0, tm, smem, base, qr, nq, n_iter,
                                  s_qoff, s_stat, s_tok, s_full, tid);
    return;
  }

  // ---- compute warpgroups -----------------------------------------------------------------------
  mbar::regs_inc<Tr::kConsumerRegs>();
  const int c = wg - 1;             // 0: S^T and P^T; 1: dP^T and dS^T; head-dim half c
  const int wt = tid & 127;         // thread within the warpgroup
  const int wrow = (warp & 3) * 16;  // this warp's key rows (both warpgroups: the same 64 keys)
  float* xf = reinterpret_cast<float*>(smem + Tr::kOffX);
  uint32_t* xu = reinterpret_cast<uint32_t*>(smem + Tr::kOffX);
  unsigned char* ds = smem + Tr::kOffDs;
  const uint32_t aDs = base + Tr::kOffDs;

  float acc_dk[kHB][4], acc_dv[kHB][4];
#pragma unroll
  for (int n = 0; n < kHB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[n][e] = 0.f, acc_dv[n][e] = 0.f;
  // This warpgroup's full-width product: S^T = K Q^T (c = 0) or dP^T = V dO^T (c = 1).
  const uint32_t aA = base + (c == 0 ? Tr::kOffK : Tr::kOffV);
  const uint32_t off_b = c == 0 ? Tr::kOffQ : Tr::kOffO;
  QWalk cur;
  cur.start(p, additional, hkv, qr);
  mbar::wait(ring.kv_full(), 0);

  for (int64_t it = 0; it < n_iter; ++it) {
    const int st = int(it % kStages);
    mbar::wait(ring.full(st), uint32_t(it / kStages) & 1u);
    wgmma::fence_proxy_async();
    const uint32_t aQ = base + Tr::kOffQ + st * Tr::kQBytes;
    const uint32_t aO = base + Tr::kOffO + st * Tr::kQBytes;
    const float2* stat = s_stat + st * kQ;

    float sc[kNB][4];
#pragma unroll
    for (int n = 0; n < kNB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = 0.f;
    {
      wgmma::fence_operands(sc);
      wgmma::fence();
      const uint64_t da = wgmma::desc_sw128(aA, 16, 1024);
      const uint64_t db = wgmma::desc_sw128(base + off_b + st * Tr::kQBytes, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        MmaS::ss(sc, da + ((kk >> 2) * (kKV * 128) + (kk & 3) * 32) / 16,
                 db + ((kk >> 2) * (kQ * 128) + (kk & 3) * 32) / 16, 1);
      wgmma::commit();
      wgmma::fence_operands(sc);
      wgmma::wait<0>();
      wgmma::fence_operands(sc);
    }

    uint32_t ap[kNB / 2][4], ad[kNB / 2][4];
    if (c == 0) {
      // S^T as it leaves the MMA, to warpgroup 1 as float32 slots [element][thread]; each
      // warpgroup masks it and forms P^T (exp2(-inf) = 0) on its own copy.
#pragma unroll
      for (int n = 0; n < kNB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) xf[(n * 4 + e) * 128 + wt] = sc[n][e];
      mbar::arrive(p_ready);
      mask_step<1>(sc, s_full + st, s_kinv, s_cm, p, cur.q0, cur.q0, wrow, lane);
#pragma unroll
      for (int n = 0; n < kNB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 sv = stat[n * 8 + 2 * (lane & 3) + (e & 1)];
          sc[n][e] = mma::fast_exp2(sc[n][e] * p.scale_log2 - sv.x);
        }
#pragma unroll
      for (int kk = 0; kk < kNB / 2; ++kk) {
        ap[kk][0] = pack2<T>(sc[2 * kk][0], sc[2 * kk][1]);
        ap[kk][1] = pack2<T>(sc[2 * kk][2], sc[2 * kk][3]);
        ap[kk][2] = pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        ap[kk][3] = pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
      // dS^T from warpgroup 1, as its register fragments.
      mbar::wait(ds_ready, uint32_t(it) & 1u);
#pragma unroll
      for (int kk = 0; kk < kNB / 2; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) ad[kk][i] = xu[(kk * 4 + i) * 128 + wt];
    } else {
      // Warpgroup 1's dQ products of the last step read the dS^T rows of all its warps: each
      // warp has waited for its own (wgmma_wait_all) before this barrier, and rewrites its rows
      // only after it (warpgroup 0's products are ordered by "P ready").
      asm volatile("bar.sync 2, 128;\n" ::: "memory");
      mbar::wait(p_ready, uint32_t(it) & 1u);
      // Each slot [element][thread] is read and rewritten by the same thread: no barrier here.
      float sw[kNB][4];
#pragma unroll
      for (int n = 0; n < kNB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sw[n][e] = xf[(n * 4 + e) * 128 + wt];
      mask_step<1>(sw, s_full + st, s_kinv, s_cm, p, cur.q0, cur.q0, wrow, lane);
#pragma unroll
      for (int kk = 0; kk < kNB / 2; ++kk) {
        float pv[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int n = 2 * kk + h;
            const float2 sv = stat[n * 8 + 2 * (lane & 3) + (e & 1)];
            pv[h][e] = mma::fast_exp2(sw[n][e] * p.scale_log2 - sv.x);
            sc[n][e] = pv[h][e] * (sc[n][e] - sv.y);
          }
        ap[kk][0] = pack2<T>(pv[0][0], pv[0][1]);
        ap[kk][1] = pack2<T>(pv[0][2], pv[0][3]);
        ap[kk][2] = pack2<T>(pv[1][0], pv[1][1]);
        ap[kk][3] = pack2<T>(pv[1][2], pv[1][3]);
      }
      using Step = Sm90Step<T, 64, kKV, 64, kQ>;  // the 64-key dS^T layout of pack_ds
      Step::pack_ds(sc, ad, ds, wrow, lane);
#pragma unroll
      for (int kk = 0; kk < kNB / 2; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) xu[(kk * 4 + i) * 128 + wt] = ad[kk][i];
      wgmma::fence_proxy_async();  // dS^T, for the dQ products' async proxy
      mbar::arrive(ds_ready);
      // This warpgroup's own dQ product reads the dS^T rows its other warps wrote: wait for the
      // phase (every thread of warpgroup 1 has arrived) before issuing it.
      mbar::wait(ds_ready, uint32_t(it) & 1u);
    }

    // dV_c += P^T dO[:, half c], dK_c += dS^T Q[:, half c] (B read transposed: regions 2c, 2c + 1
    // of the [query][d] tile).
    const uint64_t dbo = wgmma::desc_sw128(aO + 2 * c * (kQ * 128), kQ * 128, 1024);
    const uint64_t dbq = wgmma::desc_sw128(aQ + 2 * c * (kQ * 128), kQ * 128, 1024);
    wgmma::fence_operands(acc_dv);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) MmaH::rs(acc_dv, ap[kk], dbo + (kk * 16 * 128) / 16, 1);
    wgmma::commit();

    // dQ[:, 128c + 64j ..] = dS K[:, same], j = 0, 1 (A = dS^T, B = K region 2c + j, both read
    // transposed), and dK between them so that it runs during the first block's atomics.
    const int row0 = (warp & 3) * 16 + (lane >> 2);
    const int64_t tok[2] = {s_tok[st * kQ + row0], s_tok[st * kQ + row0 + 8]};
    auto add_dq = [&](float (&dqa)[8][4], int cblk) {
      wgmma::fence_operands(dqa);
      const bool whole = cblk * 64 + 64 <= p.dim;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t t = tok[half];
        if (t < 0) continue;
        const int col0 = cblk * 64 + 2 * (lane & 3);
        float* dst = p.dq_accum + t * p.dq_row + col0;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          if (whole || col0 + n * 8 < p.dim)
            atomicAdd(reinterpret_cast<float2*>(dst + n * 8),
                      make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]));
      }
    };
    auto issue_dq = [&](float (&dqa)[8][4], int cblk) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dqa[n][e] = 0.f;
      wgmma::fence_operands(dqa);
      wgmma::fence();
      const uint64_t dds = wgmma::desc_sw128(aDs, kKV * 128, 1024);
      const uint64_t dkb = wgmma::desc_sw128(base + Tr::kOffK + cblk * (kKV * 128), kKV * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < kKV / 16; ++kk)
        MmaQ::sst(dqa, dds + (kk * 16 * 128) / 16, dkb + (kk * 16 * 128) / 16, 1);
      wgmma::commit();
      wgmma::fence_operands(dqa);
    };
    float dqa[8][4];
    issue_dq(dqa, 2 * c);
    wgmma::fence_operands(acc_dk);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) MmaH::rs(acc_dk, ad[kk], dbq + (kk * 16 * 128) / 16, 1);
    wgmma::commit();
    wgmma::wait<1>();  // dV and the first dQ block done; dK runs on
    add_dq(dqa, 2 * c);
    issue_dq(dqa, 2 * c + 1);
    wgmma_wait_all(acc_dv, acc_dk, ap, ad);
    add_dq(dqa, 2 * c + 1);
    mbar::arrive(ring.empty(st));
    cur.next(p, additional, qr, nq);
  }

  // ---- epilogue: rows are keys; this warpgroup's columns 128c ..; dK carries the softmax scale --
  store_dkdv<true, true, kHB, E>(p, G, additional, b, hkv, kv0, n0, wrow, lane, acc_dk, acc_dv,
                                 128 * c);
#endif
}

}  // namespace bwd
}  // namespace fna
