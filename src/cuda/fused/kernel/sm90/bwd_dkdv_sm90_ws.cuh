// Warp-specialized dK / dV (and atomic dQ) kernel of the fused backward on Hopper (sm_90a): the
// step of dkdv_sm90_kernel (bwd_dkdv_sm90.cuh, whose Sm90Step products it shares) in a CTA whose
// copies and dQ reductions run on a warpgroup of their own. The plan's default where key tiles
// visit many query tiles (plan/bwd_choice.cu).
#pragma once

#include <string>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/fused/plan/bwd_plan.h"
#include "cuda/fused/kernel/common/bwd_bias.cuh"
#include "cuda/fused/kernel/common/bwd_sm90_parts.cuh"

namespace fna {
namespace bwd {

// Three warpgroups: warpgroup 0 moves data, warpgroups 1 and 2 compute exactly as the kernel above
// (warpgroup 1 + c owns keys 64c .. 64c + 63). In warpgroup 0, warps 0-1 copy K / V once and then
// the query tiles (Q, dO, statistics, row indices) into a ring of two stages, published on the
// stage's "full" mbarrier (each copying thread's cp.async arrive, plus a plain arrive that
// releases its other shared-memory writes) and refilled after the compute threads' arrives on
// "empty"; warps 2 and 3 add each step's dQ into the float32 dQ buffer: the compute warpgroups stage
// their dQ block in shared memory (rows padded by 8 floats: conflict-free float2 stores) with the
// rows' flat indices, arrive on "dq full", and warps 2 / 3 add every row by one bulk reduction
// (cp.reduce.async.bulk .add.f32, the TMA unit) and hand the staging area back on "dq empty"
// once the reductions have read it (two staging areas, used in turn). The compute warpgroups
// thus issue no copies and no global atomics; they meet twice per step at a named barrier: before
// dS^T is rewritten (the other warpgroup's dQ of the last step has read it) and before
// dQ = dS K reads every dS^T row.
// kSteps = 2 (head dim 64): two query tiles per step as in dkdv_sm90_kernel (bwd_dkdv_sm90.cuh),
// each compute warpgroup staging the dQ rows of one of them.
template <typename T, int kD, int kStg_ = 2, int kSteps = 1>
struct DkdvSm90WsTraits {
  // dQ staging buffers and dS^T buffers: shared memory holds two of one. Two staging buffers
  // (the reducers have a whole step to read one) with one dS^T buffer (and a second barrier per
  // step) measured 1.016-1.018x forward+backward against the reverse (H100, docs/benchmarks.md).
  static constexpr int kStg = kStg_;
  static constexpr int kDsBufs = kStg == 2 ? 1 : 2;
  using Base = DkdvSm90Traits<T, kD, 128, kSteps>;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384, kKV = 128, kTileQ = 64, kQ = kTileQ * kSteps;
  static constexpr int kLoaderThreads = 64;
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static constexpr int kKVBytes = Base::kKVBytes, kQBytes = Base::kQBytes, kDsBytes = Base::kDsBytes;
  static constexpr int kTileBytes = Base::kTileBytes;
  static constexpr int kDqStride = (kD + 8) * 4;  // bytes per staged dQ row
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffO = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffO + kStages * kQBytes;        // dS^T, two buffers
  static constexpr int kOffDq = kOffDs + kDsBufs * kDsBytes;             // staged dQ [kQ][kD + 8] floats
  static constexpr int kOffStat = kOffDq + kStg * kQ * kDqStride;         // float2 [kStages][kQ]
  static constexpr int kOffQoff = kOffStat + kStages * kQ * 8;     // uint32 [kTileQ]
  static constexpr int kOffKinv = kOffQoff + kTileQ * 4;           // int2 [kKV][kAxes]
  static constexpr int kOffTok = kOffKinv + kKV * kAxes * 8;       // int64 [kStages][kQ]
  static constexpr int kOffDqTok = kOffTok + kStages * kQ * 8;     // int64 [kQ]: staged rows
  static constexpr int kOffFull = kOffDqTok + kStg * kQ * 8;  // int [kStages][kSteps]: no mask
  static constexpr int kOffBar = (kOffFull + kStages * kSteps * 4 + 7) / 8 * 8;  // mbarriers
  static constexpr int kBars = 2 * kStages + 1 + 2 * kStg;  // full[s], empty[s], kv full, dq full, dq empty
  static constexpr int kOffCm = kOffBar + kBars * 8;               // uint64 [3][65]
  static constexpr size_t kSmem = 1024 + size_t(kOffCm) + kAxes * kColMaskStride * 8;
  static_assert(kLoaderThreads == 64, "two loader warps");
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "registers");
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// Bulk reduction (TMA unit): dst[0 .. bytes / 4) += the floats at shared address src.
__device__ __forceinline__ void bulk_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk operations have read their shared memory (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk operations are complete.
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// The compute warpgroups' barrier (named barrier 1, their 256 threads).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

// The mbarriers of a warp-specialized dK / dV kernel's loader ring, from Tr::kOffBar: full[s]
// (each loader thread's cp.async arrive and plain arrive), empty[s] (the 256 compute threads),
// "kv full" (K / V copied); a kernel's own barriers follow (next()).
template <typename Tr>
struct WsRing {
  uint32_t bar0;
  __device__ __forceinline__ uint32_t full(int st) const { return bar0 + 8u * uint32_t(st); }
  __device__ __forceinline__ uint32_t empty(int st) const {
    return bar0 + 8u * uint32_t(Tr::kStages + st);
  }
  __device__ __forceinline__ uint32_t kv_full() const {
    return bar0 + 8u * uint32_t(2 * Tr::kStages);
  }
  __device__ __forceinline__ uint32_t next() const { return kv_full() + 8u; }
  __device__ __forceinline__ void init() const {  // one thread
    for (int i = 0; i < Tr::kStages; ++i) {
      mbar::init(full(i), 2 * Tr::kLoaderThreads);
      mbar::init(empty(i), 256);
    }
    mbar::init(kv_full(), 2 * Tr::kLoaderThreads);
    mbar::fence_init_for_tma();
  }
};

// Warps 0 and 1 of a warp-specialized dK / dV kernel (dkdv_sm90_ws_kernel below,
// dkdv_sm90_d256_kernel): K / V once (published on "kv full"), then each step's kSteps query tiles
// into the Tr::kStages-deep ring of Tr's layout (mbarriers: WsRing; full[s], empty[s],
// kv full): Q and dO by TMA when kTma (one thread; their bytes complete "full" with the loader
// threads' arrives) or by cp.async, the statistics, row indices and mask flags by the threads.
// A walk of odd length ends with an empty second tile (zero rows) in a paired step.
template <typename E, typename Tr, int kD, int kSteps, bool kTma>
__device__ __forceinline__ void ws_load(const Params& p, const Group& G, bool additional, int b,
                                        int hkv, const int* kv0, int64_t n0, const BwdTma& tm,
                                        unsigned char* smem, uint32_t base,
                                        const nbr::Range (&qr)[kAxes], const int (&nq)[kAxes],
                                        int64_t n_tiles, const uint32_t* s_qoff, float2* s_stat,
                                        int64_t* s_tok, int* s_full, int tid) {
  constexpr int kKV = Tr::kKV, kTileQ = Tr::kTileQ, kStages = Tr::kStages, kChunks = kD / 8;
  const WsRing<Tr> ring{base + Tr::kOffBar};
  auto full = [&](int st) { return ring.full(st); };
  const int64_t n_iter = (n_tiles + kSteps - 1) / kSteps;
  load_kv_rows<E, kKV, Tr::kLoaderThreads, kChunks>(
      p, G, additional, b, hkv, kv0, n0, smem + Tr::kOffK, smem + Tr::kOffV, true,
      [](int row, int c) { return sw128<kKV>(row, c); });
  mbar::arrive_cp_async(ring.kv_full());
  mbar::arrive(ring.kv_full());
  QWalk w;
  w.start(p, additional, hkv, qr);
  for (int64_t it = 0; it < n_iter; ++it) {
    const int st = int(it % kStages);
    if (it >= kStages) mbar::wait(ring.empty(st), uint32_t((it / kStages) - 1) & 1u);
    auto sw = [](int row, int c) { return sw128<kTileQ>(row, c); };
    // The step's tiles that exist (a walk of odd length ends with an empty second tile).
    const int64_t left = n_tiles - it * kSteps;
    const int real = kSteps == 1 || left >= kSteps ? kSteps : int(left);
    if constexpr (kTma) {
      // Q and dO by TMA: their bytes complete the stage's "full" phase along with the
      // loader threads' arrives (below).
      if (tid == 0) {
        tma::expect_tx(full(st), uint32_t(real) * 2u * Tr::kTileBytes);
        QWalk wt = w;
        for (int h = 0; h < real; ++h) {
          const uint32_t slot = uint32_t(st * kSteps + h) * Tr::kTileBytes;
          const uint32_t dq = base + Tr::kOffQ + slot, dO = base + Tr::kOffO + slot;
          int cq[4], co[4], og[kAxes];
#pragma unroll
          // (the maps of Q and dO span the query region: coordinates from its first row)
          for (int a = 0; a < kAxes; ++a) og[a] = G.global(p.geo, a, wt.q0[a]) - p.qlo[a];
          tma::box_coords(tm.q, b, og, wt.h, cq);
          tma::box_coords(tm.o, b, og, wt.h, co);
#pragma unroll
          for (int c = 0; c < kD / 64; ++c) {
            tma::load_box(dq + c * kTileQ * 128, tm.q, 64 * c, cq, full(st));
            tma::load_box(dO + c * kTileQ * 128, tm.o, 64 * c, co, full(st));
          }
          if (kSteps > 1) wt.next(p, additional, qr, nq);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kSteps; ++h) {
      const int slot = st * kSteps + h;
      if (h < real) {
        load_q_rows<E, kTileQ, Tr::kLoaderThreads, kChunks, decltype(sw), true, !kTma>(
            p, G, additional, b, kv0, w, s_qoff, smem + Tr::kOffQ + slot * Tr::kTileBytes,
            smem + Tr::kOffO + slot * Tr::kTileBytes, s_stat + slot * kTileQ,
            s_tok + slot * kTileQ, s_full + slot, sw);
        w.next(p, additional, qr, nq);
      } else {
        clear_q_rows<kTileQ, Tr::kLoaderThreads, Tr::kTileBytes>(
            smem + Tr::kOffQ + slot * Tr::kTileBytes, smem + Tr::kOffO + slot * Tr::kTileBytes,
            s_stat + slot * kTileQ, s_tok + slot * kTileQ, s_full + slot, tid);
      }
    }
    mbar::arrive_cp_async(full(st));
    mbar::arrive(full(st));
  }
}

// kBias: the call has a relative positional bias (its own instantiation; one query tile per step):
// the compute warpgroups recompute the biased P^T and sum d rpb as the plain kernel does
// (bwd_bias.cuh, its table copies one per compute warp, in shared memory after Tr::kSmem).
template <typename T, int kD, int kStgT = 2, bool kTma = false, int kSteps = 1, bool kBias = false>
__global__ void __launch_bounds__(384, 1) dkdv_sm90_ws_kernel(const Params p, const bool additional,
                                                              const __grid_constant__ BwdTma tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!kBias || kSteps == 1, "a bias: one query tile per step");
  using Tr = DkdvSm90WsTraits<T, kD, kStgT, kSteps>;
  constexpr int kStg = Tr::kStg;
  constexpr int kStages = Tr::kStages;
  using E = T;
  constexpr int kKV = Tr::kKV, kQ = Tr::kQ, kTileQ = Tr::kTileQ;
  constexpr int kNB = kQ / 8;
  constexpr int kDB = kD / 8;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  uint32_t base;
  unsigned char* smem = smem_1024(smem_raw, base);
  float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kOffStat);
  uint32_t* s_qoff = reinterpret_cast<uint32_t*>(smem + Tr::kOffQoff);
  int2* s_kinv = reinterpret_cast<int2*>(smem + Tr::kOffKinv);
  int64_t* s_tok = reinterpret_cast<int64_t*>(smem + Tr::kOffTok);
  int64_t* s_dqtok = reinterpret_cast<int64_t*>(smem + Tr::kOffDqTok);
  int* s_full = reinterpret_cast<int*>(smem + Tr::kOffFull);
  const WsRing<Tr> ring{base + Tr::kOffBar};
  auto dq_full = [&](int sb) { return ring.next() + 8u * uint32_t(sb); };
  auto dq_empty = [&](int sb) { return ring.next() + 8u * uint32_t(kStg + sb); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  int b, hkv, kv0[kAxes] = {0, 0, 0};
  Group G;
  int64_t n0 = 0;
  if (!dkdv_tile_of(p, additional, kKV, b, hkv, kv0, G, n0)) return;

  // ---- prologue, every thread: the query tiles, the key rows' inverse windows, the mask sets --
  if (tid == 0) {
    ring.init();
    for (int i = 0; i < kStg; ++i) {
      mbar::init(dq_full(i), 256);
      mbar::init(dq_empty(i), 2);  // lane 0 of warps 2 and 3
    }
  }
  nbr::Range qr[kAxes];
  int nq[kAxes];
  uint64_t* s_cm = reinterpret_cast<uint64_t*>(smem + Tr::kOffCm);
  const int64_t n_tiles =
      sm90_query_setup<kKV, kTileQ, true>(p, G, additional, kv0, n0, s_kinv, s_qoff, s_cm, qr, nq);
  const int64_t n_iter = (n_tiles + kSteps - 1) / kSteps;  // steps

  if (wg == 0) {
    // ---- data movement ---------------------------------------------------------------------
    mbar::regs_dec<Tr::kProducerRegs>();
    if (warp < 2) {
      ws_load<E, Tr, kD, kSteps, kTma>(p, G, additional, b, hkv, kv0, n0, tm, smem, base, qr, nq,
                                       n_tiles, s_qoff, s_stat, s_tok, s_full, tid);
    } else {
      // dQ, warps 2 and 3 (32 rows each: one reducer warp measured 1.01-1.04x slower): each
      // staged row added into dq_accum by one bulk reduction (dq_row <= kD columns; the padding
      // columns of K are zero, so the staged ones past D are zero).
      const uint32_t bytes = uint32_t(p.dq_row) * 4u;
      for (int64_t it = 0; it < n_iter; ++it) {
        const int sb = kStg == 2 ? int(it & 1) : 0;
        mbar::wait(dq_full(sb), uint32_t(it / kStg) & 1u);
#pragma unroll
        for (int row = lane + 32 * (warp - 2); row < kQ; row += 64) {
          const int64_t t = s_dqtok[sb * kQ + row];
          if (t >= 0)
            bulk_add_f32(p.dq_accum + t * p.dq_row,
                         base + Tr::kOffDq + (sb * kQ + row) * Tr::kDqStride, bytes);
        }
        bulk_commit();
        bulk_wait_read();
        __syncwarp();
        if (lane == 0) mbar::arrive(dq_empty(sb));
      }
      bulk_wait();
    }
    return;
  }

  // ---- compute warpgroups ---------------------------------------------------------------------
  mbar::regs_inc<Tr::kConsumerRegs>();
  const int c = wg - 1;           // keys 64c .. 64c + 63
  const int cwarp = warp - 4;     // 0 .. 7
  const int wrow = cwarp * 16;

  using Step = Sm90Step<T, kD, 128, kD, kQ>;
  float acc_dk[kDB][4], acc_dv[kDB][4];
  Step::zero_acc(acc_dk, acc_dv);
  const uint32_t aK = base + Tr::kOffK + c * 64 * 128;
  const uint32_t aV = base + Tr::kOffV + c * 64 * 128;
  QWalk cur;
  cur.start(p, additional, hkv, qr);
  const int ctid = tid - 128;  // 0 .. 255 over the compute warpgroups
  BwdBias bias{};
  if constexpr (kBias) {
    bias = bias_setup<256, kQ>(p, additional, true, kv0, wrow, lane, cur.h, s_qoff,
                               smem_raw + bias_region_offset(Tr::kSmem), ctid);
    consumer_sync();  // qrel and the zeroed tables
  }
  mbar::wait(ring.kv_full(), 0);

  for (int64_t it = 0; it < n_iter; ++it) {
    const int st = int(it % kStages);
    // A new head flushes the last one's d rpb sums: every add of theirs preceded the last step's
    // barrier before dQ.
    if constexpr (kBias) bias_next_head<256>(p, bias, cur.h, ctid, [] { consumer_sync(); });
    mbar::wait(ring.full(st), uint32_t(it / kStages) & 1u);
    wgmma::fence_proxy_async();
    const int* q0 = cur.q0;
    QWalk second;  // a paired step's second tile
    if constexpr (kSteps == 2) second = cur.after(p, additional, qr, nq);
    const uint32_t aQ = base + Tr::kOffQ + st * Tr::kQBytes;
    const uint32_t aO = base + Tr::kOffO + st * Tr::kQBytes;
    const float2* stat = s_stat + st * kQ;
    const int dsb = Tr::kDsBufs == 2 ? int(it & 1) : 0;
    const int sb = kStg == 2 ? int(it & 1) : 0;
    const uint32_t aDs = base + Tr::kOffDs + dsb * Tr::kDsBytes;
    unsigned char* ds = smem + Tr::kOffDs + dsb * Tr::kDsBytes;

    // S^T, dP^T, P^T, dV += P^T dO issued, dS^T (Sm90Step::step_products). One dS^T buffer:
    // both warpgroups' dQ of the last step have read it before it is rewritten.
    float s[kNB][4], dp[kNB][4];
    uint32_t ap[kNB / 2][4], ad[kNB / 2][4];
    auto mask = [&](float (&sm)[kNB][4]) {
      mask_step<kSteps>(sm, s_full + st * kSteps, s_kinv, s_cm, p, q0, second.q0, wrow, lane);
    };
    auto before_ds = [&] {
      if (Tr::kDsBufs == 1) consumer_sync();
    };
    if constexpr (kBias) {
      // (as the plain kernel's bias instances: P^T and dS^T in turn)
      Step::sdp(s, dp, aK, aV, aQ, aO);
      mask(s);
      before_ds();
      if (bias.on) {
        bias_softmax<kNB, true>(p, bias, cur.h, s, dp, stat, bias.qrel, q0, lane);
        Step::pack(s, dp, ap, ad, ds, wrow, lane);
      } else {
        Step::softmax_pack(s, dp, stat, p.scale_log2, ap, ad, ds, wrow, lane);
      }
      Step::issue_acc(acc_dv, ap, aO);
    } else {
      Step::step_products(s, dp, acc_dv, aK, aV, aQ, aO, stat, p.scale_log2, ap, ad, ds, wrow,
                          lane, mask, before_ds);
    }

    // Every dS^T row in shared memory (both compute warpgroups), then dQ = dS K.
    wgmma::fence_proxy_async();
    consumer_sync();
    // The rows' flat indices travel with the staged dQ. Warpgroup c takes column block c of the
    // step's rows, or with paired tiles (head dim 64) every column of tile c's rows.
    const int row0 = (cwarp & 3) * 16 + (lane >> 2) + (kSteps == 2 ? c * kTileQ : 0);
    if (kSteps == 2 || c < kD / 64) {
      float dqa[8][4];
      if constexpr (kSteps == 2)
        Step::issue_dq(dqa, aDs + c * (kKV * 128), base + Tr::kOffK);
      else
        Step::issue_dq(dqa, aDs, base + Tr::kOffK + c * kKV * 128);
      Step::issue_acc(acc_dk, ad, aQ);  // dK += dS^T Q, runs on
      const int64_t tok0 = s_tok[st * kQ + row0], tok1 = s_tok[st * kQ + row0 + 8];
      wgmma::wait<1>();  // dV and dQ done; dK runs on
      wgmma::fence_operands(dqa);
      // The staging area is free once the bulk reductions of its last use have read it.
      mbar::wait(dq_empty(sb), (uint32_t(it / kStg) & 1u) ^ 1u);
      float* stg = reinterpret_cast<float*>(smem + Tr::kOffDq + sb * kQ * Tr::kDqStride) +
                   (kSteps == 2 ? 0 : c * 64) + 2 * (lane & 3);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* row = stg + (row0 + 8 * half) * (Tr::kDqStride / 4);
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<float2*>(row + n * 8) =
              make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]);
      }
      if ((kSteps == 2 || c == 0) && (lane & 3) == 0) {
        s_dqtok[sb * kQ + row0] = tok0;
        s_dqtok[sb * kQ + row0 + 8] = tok1;
      }
      wgmma::fence_proxy_async();  // the staged rows, for the bulk reductions' async proxy
    } else {
      Step::issue_acc(acc_dk, ad, aQ);  // dK += dS^T Q, runs on
    }
    mbar::arrive(dq_full(sb));
    // dV / dK complete before the stage is handed back (Q and dO are their B operands).
    Step::wait_all(acc_dv, acc_dk, ap, ad);
    mbar::arrive(ring.empty(st));
    if constexpr (kSteps == 2)
      cur = second.after(p, additional, qr, nq);
    else
      cur.next(p, additional, qr, nq);
  }

  if constexpr (kBias) {
    if (bias.acc != nullptr) {
      consumer_sync();  // every compute thread's adds to the last head's table
      bias_flush<256>(p, bias, ctid);
    }
  }

  store_dkdv<true, true, kDB, E>(p, G, additional, b, hkv, kv0, n0, wrow, lane, acc_dk, acc_dv);
#endif
}

}  // namespace bwd
}  // namespace fna
