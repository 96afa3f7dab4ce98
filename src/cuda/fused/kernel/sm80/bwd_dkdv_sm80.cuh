// dK / dV kernel of the fused backward (FlashAttention-2 style, recomputing attention from Q, K
// and LSE). A CTA owns one multi-dimensional key/value tile of one (batch, kv head, dilation
// group) and visits the query tiles of its inverse neighborhood for every query head of its GQA
// group, so it writes dK / dV once, without atomics. Everything is computed transposed (keys as
// rows): S^T = K Q^T, so P^T and dS^T come out of the tensor cores already in the A-operand layout
// of dV += P^T dO and dK += dS^T Q and never leave registers.
//
// Each warp owns 16 keys. The additional (global) keys run through the same mainloop with
// `additional` set: their tile is a run of additional tokens and the queries are all tokens in
// flat order, with no neighborhood mask.
//
// With kAtomicDq (the default, non-deterministic mode) the kernel also produces dQ: dS^T goes
// through shared memory once per query sub-tile, the warps compute dS K for that sub-tile over
// the CTA's keys and add it into a float32 buffer with (vector) atomics; a conversion kernel
// applies the scale. Without it, bwd_dq_sm80.cuh computes dQ in a second, deterministic pass.
//
// kPass splits the work for head dims above 128, where dK and dV together would not fit in
// registers: kPassDv accumulates dV only (recomputing P), kPassDk dK only (and dQ with atomics);
// each pass holds one accumulator set, as head dim 128 does with both. kPassBoth does all of it.
#pragma once

#include "cuda/fused/kernel/common/bwd_bias.cuh"
#include "cuda/fused/kernel/common/bwd_dkdv_parts.cuh"

namespace fna {
namespace bwd {

// kAtomicDq: also accumulate dQ (unscaled, float32) into p.dq_accum with atomics, so no separate
// dQ pass is needed; the order of the atomic sums makes dQ non-deterministic.
// kBias: the call has a relative positional bias (its own instantiation, so that calls without
// one run the kernel without the bias code).
template <typename T, int kD, int kWarps, int kQ, int kQSub, bool kAtomicDq, int kPass = kPassBoth,
          bool kBias = false>
__global__ void __launch_bounds__(32 * kWarps, 1)
    dkdv_kernel(const Params p, const bool additional) {
  using Tr = DkdvTraits<T, kD, kWarps, kQ, kQSub, kAtomicDq>;
  using E = typename Tr::E;
  constexpr bool kF32 = Tr::kF32;
  constexpr int kDh = Tr::kDh;
  constexpr bool kDoDv = kPass != kPassDk;  // accumulate dV (needs P)
  constexpr bool kDoDk = kPass != kPassDv;  // accumulate dK (needs dP, hence V)
  static_assert(kDoDk || !kAtomicDq, "dQ needs dS: not in the dV-only pass");
  constexpr int kKV = Tr::kKV, kThreads = Tr::kThreads, kChunks = Tr::kChunks;
  constexpr int kNB = kQSub / 8;  // n8 blocks of queries per sub-tile
  constexpr int kDB = kD / 8;     // n8 blocks of the head dim

  extern __shared__ __align__(128) unsigned char smem[];
  E* sK = reinterpret_cast<E*>(smem);
  E* sV = sK + kKV * kD;
  E* sQ = sV + kKV * kD;       // [2][kQ][kD]
  E* sdO = sQ + 2 * kQ * kD;   // [2][kQ][kD]
  E* sdS = sdO + 2 * kQ * kD;  // [2][kKV][kDsStride] (atomic-dQ mode only)
  float2* s_stat = reinterpret_cast<float2*>(reinterpret_cast<unsigned char*>(sdS) + Tr::kSmemDs);
  uint32_t* s_qoff = reinterpret_cast<uint32_t*>(s_stat + 2 * kQ);
  int2* s_kinv = reinterpret_cast<int2*>(s_qoff + kQ);  // [kKV][kAxes]
  int64_t* s_tok = reinterpret_cast<int64_t*>(s_kinv + kKV * kAxes);  // [2][kQ]
  int* s_full = reinterpret_cast<int*>(s_tok + 2 * kQ);                // [2]: no mask needed

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // ---- which tile this CTA owns ------------------------------------------------------------
  int b, hkv, kv0[kAxes] = {0, 0, 0};
  Group G;
  int64_t n0 = 0;  // additional mode: first additional token
  if (!dkdv_tile_of(p, additional, kKV, b, hkv, kv0, G, n0)) return;

  // ---- the key/value tile, once; the query tiles it visits (bwd_ktile.cuh) --------------------
  load_kv_rows<E, kKV, kThreads, kChunks>(
      p, G, additional, b, hkv, kv0, n0, reinterpret_cast<unsigned char*>(sK),
      reinterpret_cast<unsigned char*>(sV), kDoDk,
      [](int row, int c) { return uint32_t(Swizzled<kDh>::offset(row, c)) * 2; });
  // Inverse windows of this tile's keys: the mask of border tiles reads them.
  nbr::Range qr[kAxes];  // queries to visit per axis (neighborhood mode)
  int nq[kAxes];
  key_tile_windows<kKV>(p, G, additional, kv0, n0, s_kinv);
  if (tid < kQ) s_qoff[tid] = pack_offsets(p.tq, tid);
  __syncthreads();  // s_qoff is read by the first query-tile load, s_kinv by key_tile_ranges
  const int64_t n_tiles = key_tile_ranges<kQ>(p, G, additional, kv0, s_kinv, qr, nq);

  const int64_t n_iter = n_tiles * p.heads_per_kv;
  // The query tiles (bwd_qtiles.cuh): Q, dO, statistics and row indices into buffer `buf`.
  QWalk cur;
  cur.start(p, additional, hkv, qr);
  auto load_q_tile = [&](const QWalk& w, int buf) {
    load_q_rows<E, kQ, kThreads, kChunks>(
        p, G, additional, b, kv0, w, s_qoff, reinterpret_cast<unsigned char*>(sQ + buf * kQ * kD),
        reinterpret_cast<unsigned char*>(sdO + buf * kQ * kD), s_stat + buf * kQ,
        s_tok + buf * kQ, s_full + buf,
        [](int row, int c) { return uint32_t(Swizzled<kDh>::offset(row, c)) * 2; });
  };

  float acc_dk[kDB][4], acc_dv[kDB][4];
#pragma unroll
  for (int n = 0; n < kDB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[n][e] = 0.f, acc_dv[n][e] = 0.f;

  const uint32_t baseK = smem_u32(sK), baseV = smem_u32(sV);
  const int wrow = warp * 16;
  int ds_slot = 0;
  // Relative positional bias: d rpb sums per head in shared memory after the kernel's own
  // (BwdLaunch::bias_smem), in the passes that compute dS (bwd_bias.cuh).
  BwdBias bias{};
  if constexpr (kBias)
    bias = bias_setup<kThreads, kQ>(p, additional, kDoDk, kv0, wrow, lane, cur.h, s_qoff,
                                    smem + bias_region_offset(Tr::kSmem), tid);

  if (n_iter > 0) load_q_tile(cur, 0);
  for (int64_t it = 0; it < n_iter; ++it) {
    const int buf = int(it & 1);
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < n_iter) load_q_tile(cur.after(p, additional, qr, nq), buf ^ 1);
    if constexpr (kBias) bias_next_head<kThreads>(p, bias, cur.h, tid);
    const bool masked = !s_full[buf];
    const int* q0 = cur.q0;
    const uint32_t baseQ = smem_u32(sQ + buf * kQ * kD), baseO = smem_u32(sdO + buf * kQ * kD);
    const float2* stat = s_stat + buf * kQ;

#pragma unroll 1
    for (int qs = 0; qs < kQ; qs += kQSub) {
      float s[kNB][4], dp[kNB][4];
#pragma unroll
      for (int n = 0; n < kNB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f, dp[n][e] = 0.f;

      // S^T = K Q^T and dP^T = V dO^T over the head dim.
      // k0 counts 16-bit units: a k16 step of 16-bit data, a k8 step of float32 (TF32 mma).
#pragma unroll
      for (int k0 = 0; k0 < kDh; k0 += 16) {
        uint32_t a[4], bb[4];
        if constexpr (kF32) {
          uint32_t ab[4], as[4], b[4], bs[4];
          load_a<kDh>(a, baseK, wrow, k0, lane);
          tf32_frag<T>(a, ab, as);
#pragma unroll
          for (int n = 0; n < kNB; n += 2) {
            load_b_nk<kDh>(bb, baseQ, qs + n * 8, k0, lane);
            tf32_frag<T>(bb, b, bs);
            mma_tf32<T, (kD >= 128)>(s[n], ab, as, b[0], b[1], bs[0], bs[1]);
            mma_tf32<T, (kD >= 128)>(s[n + 1], ab, as, b[2], b[3], bs[2], bs[3]);
          }
          if (kDoDk) {
            load_a<kDh>(a, baseV, wrow, k0, lane);
            tf32_frag<T>(a, ab, as);
#pragma unroll
            for (int n = 0; n < kNB; n += 2) {
              load_b_nk<kDh>(bb, baseO, qs + n * 8, k0, lane);
              tf32_frag<T>(bb, b, bs);
              mma_tf32<T, (kD >= 128)>(dp[n], ab, as, b[0], b[1], bs[0], bs[1]);
              mma_tf32<T, (kD >= 128)>(dp[n + 1], ab, as, b[2], b[3], bs[2], bs[3]);
            }
          }
        } else {
        load_a<kD>(a, baseK, wrow, k0, lane);
#pragma unroll
        for (int n = 0; n < kNB; n += 2) {
          load_b_nk<kD>(bb, baseQ, qs + n * 8, k0, lane);
          mma16816<T>(s[n], a, bb[0], bb[1]);
          mma16816<T>(s[n + 1], a, bb[2], bb[3]);
        }
        if (kDoDk) {
          load_a<kD>(a, baseV, wrow, k0, lane);
#pragma unroll
          for (int n = 0; n < kNB; n += 2) {
            load_b_nk<kD>(bb, baseO, qs + n * 8, k0, lane);
            mma16816<T>(dp[n], a, bb[0], bb[1]);
            mma16816<T>(dp[n + 1], a, bb[2], bb[3]);
          }
        }
        }  // 16-bit
      }

      // Border pairs only (bwd_ktile.cuh).
      if (masked) mask_key_rows<kNB>(s, s_kinv, s_qoff + qs, q0, wrow, lane);

      // P^T = exp(scale S^T + bias - LSE), dS^T = P^T (dP^T - Dsum); queries are columns.
      if (kBias && bias.on) {
        bias_softmax<kNB, kDoDk>(p, bias, cur.h, s, dp, stat + qs, bias.qrel + qs, q0, lane);
      } else {
#pragma unroll
      for (int n = 0; n < kNB; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 st = stat[qs + n * 8 + 2 * (lane & 3) + (e & 1)];
          const float pe = mma::fast_exp2(s[n][e] * p.scale_log2 - st.x);
          s[n][e] = pe;
          if (kDoDk) dp[n][e] = pe * (dp[n][e] - st.y);
        }
      }
      }

      // dV += P^T dO, dK += dS^T Q: the accumulators' C layout is the A layout of the next mma.
      if constexpr (kF32) {
        // One k8 step per n8 block of queries, queries permuted inside it (bwd_mma.cuh); dO and
        // Q are read [query][d] with 32-bit loads.
        const float* fQ = sQ + buf * kQ * kD;
        const float* fO = sdO + buf * kQ * kD;
#pragma unroll
        for (int kk = 0; kk < kNB; ++kk) {
          uint32_t ap[4], aps[4], ad[4], ads[4];
          if (kDoDv) c_to_a<T>(s[kk], ap, aps);
          if (kDoDk) c_to_a<T>(dp[kk], ad, ads);
          if (kAtomicDq) {
            float* ds = sdS + ds_slot * kKV * Tr::kDsStride;
            const int r = wrow + (lane >> 2), c = kk * 8 + 2 * (lane & 3);
            *reinterpret_cast<float2*>(ds + r * Tr::kDsStride + c) =
                make_float2(dp[kk][0], dp[kk][1]);
            *reinterpret_cast<float2*>(ds + (r + 8) * Tr::kDsStride + c) =
                make_float2(dp[kk][2], dp[kk][3]);
          }
#pragma unroll
          for (int n = 0; n < kDB; ++n) {
            uint32_t b0, b1, bs0, bs1;
            if (kDoDv) {
              load_b_kn_f32<T, kD>(b0, b1, bs0, bs1, fO, qs + kk * 8, n * 8, lane);
              mma_tf32<T, true>(acc_dv[n], ap, aps, b0, b1, bs0, bs1);
            }
            if (kDoDk) {
              load_b_kn_f32<T, kD>(b0, b1, bs0, bs1, fQ, qs + kk * 8, n * 8, lane);
              mma_tf32<T, true>(acc_dk[n], ad, ads, b0, b1, bs0, bs1);
            }
          }
        }
      } else {
#pragma unroll
      for (int kk = 0; kk < kNB / 2; ++kk) {
        uint32_t ap[4], ad[4], bb[4];
        ap[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        ap[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        ap[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        ap[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        ad[0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
        ad[1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
        ad[2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
        ad[3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
        if (kAtomicDq) {
          E* ds = sdS + ds_slot * kKV * Tr::kDsStride;
          const int r = wrow + (lane >> 2), c = kk * 16 + 2 * (lane & 3);
          *reinterpret_cast<uint32_t*>(ds + r * Tr::kDsStride + c) = ad[0];
          *reinterpret_cast<uint32_t*>(ds + (r + 8) * Tr::kDsStride + c) = ad[1];
          *reinterpret_cast<uint32_t*>(ds + r * Tr::kDsStride + c + 8) = ad[2];
          *reinterpret_cast<uint32_t*>(ds + (r + 8) * Tr::kDsStride + c + 8) = ad[3];
        }
#pragma unroll
        for (int n = 0; n < kDB; n += 2) {
          if (kDoDv) {
            load_b_kn<kD>(bb, baseO, qs + kk * 16, n * 8, lane);
            mma16816<T>(acc_dv[n], ap, bb[0], bb[1]);
            mma16816<T>(acc_dv[n + 1], ap, bb[2], bb[3]);
          }
          if (kDoDk) {
            load_b_kn<kD>(bb, baseQ, qs + kk * 16, n * 8, lane);
            mma16816<T>(acc_dk[n], ad, bb[0], bb[1]);
            mma16816<T>(acc_dk[n + 1], ad, bb[2], bb[3]);
          }
        }
      }
      }  // 16-bit
      if (kAtomicDq) {
        __syncthreads();  // dS^T of every warp is in sdS[ds_slot]
        atomic_dq_block<T, kD, kWarps, kKV, kQSub, Tr::kDsStride>(
            p, sdS + ds_slot * kKV * Tr::kDsStride, baseK, qs, s_tok + buf * kQ, lane, warp);
        ds_slot ^= 1;  // the other slot is free: every warp passed the barrier above after reading it
      }
    }
    cur.next(p, additional, qr, nq);
  }

  if constexpr (kBias) {
    if (bias.acc != nullptr) {
      __syncthreads();  // every thread's adds to the last head's table
      bias_flush<kThreads>(p, bias, tid);
    }
  }

  // ---- epilogue: rows are keys; dK carries the softmax scale -----------------------------------
  store_dkdv<kDoDk, kDoDv, kDB, E>(p, G, additional, b, hkv, kv0, n0, wrow, lane, acc_dk, acc_dv);
}

}  // namespace bwd
}  // namespace fna
