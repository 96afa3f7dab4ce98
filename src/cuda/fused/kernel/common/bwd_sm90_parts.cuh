// The pieces of the Hopper (wgmma, sm_90a) dK / dV kernels shared by the plain kernel
// (bwd_dkdv_sm90.cuh) and the warp-specialized one (bwd_dkdv_sm90_ws.cuh): traits, the swizzled
// layout, the query-tile setup and the products of one step (Sm90Step). bwd_dkdv_sm90.cuh
// describes the algorithm.
#pragma once


#include <cuda_runtime.h>

#include "cuda/common/wgmma.cuh"
#include "cuda/fused/kernel/common/bwd_dkdv_parts.cuh"
#include "cuda/fused/kernel/common/bwd_ktile.cuh"
#include "cuda/fused/kernel/common/bwd_params.cuh"
#include "cuda/fused/kernel/common/bwd_qtiles.cuh"

namespace fna {
namespace bwd {

// kKVRows: the CTA's keys, 64 per warpgroup (128: two warpgroups; 64: one, for small windows,
// where a 64-key tile's inverse neighborhood spans fewer query tiles per key). kSteps: query tiles
// per step (2: two consecutive 64-query tiles of the walk as one 128-query step, at head dim 64
// with 128 keys; bwd_dkdv_sm90.cuh).
template <typename T, int kD, int kKVRows = 128, int kSteps = 1>
struct DkdvSm90Traits {
  using E = T;
  // Steps in flight: Q, dO, statistics and row indices of steps it .. it + kBufs - 1 (three
  // buffers measured 0.5-2.5% faster forward+backward than two on the standard problems, within
  // the noise of the runs: docs/benchmarks.md).
  // The 64-key tile at head dim 64 keeps two, so that three CTAs fit an SM (with the register
  // cap of bwd_dkdv_sm90.cuh's __launch_bounds__).
  static constexpr int kBufs = kKVRows == 64 && kD == 64 ? 2 : 3;
  using Tag = typename MmaTag<T>::type;
  static constexpr int kKV = kKVRows, kTileQ = 64, kQ = kTileQ * kSteps, kWarps = kKV / 16,
                       kThreads = 32 * kWarps;
  static_assert(kKV == 64 || kKV == 128, "64 or 128 keys");
  // A step's two tiles lie one after the other, as one 128-row tile: only in the one 64-column
  // region of head dim 64.
  static_assert(kSteps == 1 || (kSteps == 2 && kD == 64 && kKV == 128), "paired tiles: D 64, 128 keys");
  static constexpr int kKVBytes = kKV * kD * 2;
  static constexpr int kTileBytes = kTileQ * kD * 2;  // one query tile's Q (or dO)
  static constexpr int kQBytes = kQ * kD * 2;         // one step's
  static constexpr int kDsBytes = kKV * kQ * 2;  // dS^T [key][query]: 128-byte-row regions
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffO = kOffQ + kBufs * kQBytes;  // Q and dO: kBufs buffers each
  static constexpr int kOffDs = kOffO + kBufs * kQBytes;
  static constexpr int kOffStat = kOffDs + kDsBytes;              // float2 [kBufs][kQ]
  static constexpr int kOffQoff = kOffStat + kBufs * kQ * 8;      // uint32 [kTileQ]
  static constexpr int kOffKinv = kOffQoff + kTileQ * 4;          // int2 [kKV][kAxes]
  static constexpr int kOffTok = kOffKinv + kKV * kAxes * 8;     // int64 [kBufs][kQ]
  static constexpr int kOffFull = kOffTok + kBufs * kQ * 8;       // int [kBufs][kSteps]: no mask
  static constexpr int kOffCm = (kOffFull + kBufs * kSteps * 4 + 7) / 8 * 8;  // uint64 [3][65]
  static constexpr size_t kSmem = 1024 + size_t(kOffCm) + kAxes * kColMaskStride * 8;
  static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// Byte offset of row `row`, 16-byte chunk `c` in a tile of kRows rows stored as 64-column regions
// of 128-byte rows with the 128-byte swizzle (wgmma.cuh).
template <int kRows>
__device__ __forceinline__ uint32_t sw128(int row, int c) {
  return uint32_t(c >> 3) * (kRows * 128) + uint32_t(row) * 128 + uint32_t(((c & 7) ^ (row & 7)) << 4);
}

// The dynamic shared memory from its first 1024-byte boundary (the swizzle pattern repeats every
// 1024 bytes; the kernels' sizes include 1024 bytes of slack): pointer and shared address.
__device__ __forceinline__ unsigned char* smem_1024(unsigned char* raw_ptr, uint32_t& base) {
  const uint32_t raw = smem_u32(raw_ptr);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  base = raw + pad;
  return raw_ptr + pad;
}

// Every thread of either dK / dV kernel: the query tiles of the CTA's key tile (qr, nq, and the
// key rows' inverse windows in s_kinv), the query tile shape's row offsets (s_qoff) and the
// column-mask sets (s_cm), all in shared memory after the two CTA barriers. Returns the steps:
// query tiles x query heads per kv head.
// kSearch: the query ranges by their own searches before the barriers instead of from s_kinv
// after them: the warp-specialized kernel and the bias instances, where ptxas otherwise spills
// more (the warp-specialized kernel's consumers 300 bytes of loads instead of 0-48).
template <int kKV, int kQ, bool kSearch = false>
__device__ __forceinline__ int64_t sm90_query_setup(const Params& p, const Group& G,
                                                    bool additional, const int* kv0,
                                                    int64_t n0, int2* s_kinv,
                                                    uint32_t* s_qoff, uint64_t* s_cm,
                                                    nbr::Range (&qr)[kAxes], int (&nq)[kAxes]) {
  key_tile_windows<kKV>(p, G, additional, kv0, n0, s_kinv);
  int64_t n_tiles = 0;
  if constexpr (kSearch)
    n_tiles = key_tile_ranges<kQ, true>(p, G, additional, kv0, s_kinv, qr, nq);
  const int tid = threadIdx.x;
  if (tid < kQ) s_qoff[tid] = pack_offsets(p.tq, tid);
  __syncthreads();
  build_col_masks(p, s_qoff, s_cm);
  __syncthreads();
  if constexpr (!kSearch) n_tiles = key_tile_ranges<kQ>(p, G, additional, kv0, s_kinv, qr, nq);
  return n_tiles * p.heads_per_kv;
}

// Border pairs only (bwd_ktile.cuh): a key row keeps the queries of its inverse window, for each
// of the step's kSteps tiles not marked full (tile 0 at q0, tile 1 at q0b, 64 columns each).
template <int kSteps, int kNB>
__device__ __forceinline__ void mask_step(float (&s)[kNB][4], const int* full, const int2* s_kinv,
                                          const uint64_t* cm, const Params& p, const int* q0,
                                          const int* q0b, int wrow, int lane) {
  if (!full[0]) mask_key_rows_bits<kNB, 0>(s, s_kinv, cm, p, q0, wrow, lane);
  if constexpr (kSteps == 2)
    if (!full[1]) mask_key_rows_bits<kNB, 8>(s, s_kinv, cm, p, q0b, wrow, lane);
}

// Every committed wgmma complete, with the register operands `regs` (accumulators, register A
// operands of the products in flight) fenced on both sides of the wait.
template <class... R>
__device__ __forceinline__ void wgmma_wait_all(R&... regs) {
  (wgmma::fence_operands(regs), ...);
  wgmma::wait<0>();
  (wgmma::fence_operands(regs), ...);
}

// One step's products for one warpgroup, shared by dkdv_sm90_kernel and dkdv_sm90_ws_kernel
// (bwd_dkdv_sm90_ws.cuh): the warpgroup's 64 keys at aK / aV, the 64-query tile's Q / dO at
// aQ / aO, all 128-byte swizzled. kDn: the head-dim columns the products cover, kD or, for head
// dims up to 32 in the 64-column layout, 32 (the k-steps of S^T / dP^T past them and the zero
// columns of dV, dK and dQ are skipped; wgmma reads the first half of each 128-byte row).
// kQ: the step's queries (64, or 128 for two paired tiles: S^T and dP^T are m64n128 products).
template <typename T, int kD, int kKVRows = 128, int kDn = kD, int kQ_ = 64>
struct Sm90Step {
  using Tag = typename MmaTag<T>::type;
  static constexpr int kDq = kDn < 64 ? kDn : 64;  // dQ columns per block
  using MmaS = wgmma::Mma<Tag, kQ_>;  // S^T, dP^T (kQ queries)
  using MmaQ = wgmma::Mma<Tag, kDq>;  // dQ (one block of head-dim columns)
  using MmaD = wgmma::Mma<Tag, kDn>;  // dV, dK
  static constexpr int kKV = kKVRows, kQ = kQ_, kNB = kQ / 8, kDB = kDn / 8;
  static_assert(kDn == kD || (kD == 64 && kDn == 32), "32 columns of the 64-column layout");

  __device__ __forceinline__ static void zero_acc(float (&acc_dk)[kDB][4], float (&acc_dv)[kDB][4]) {
#pragma unroll
    for (int n = 0; n < kDB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[n][e] = 0.f, acc_dv[n][e] = 0.f;
  }

  // The end of a step: dV and dK (and every other product) complete, with their register
  // operands (P^T, dS^T) fenced around the wait.
  __device__ __forceinline__ static void wait_all(float (&acc_dv)[kDB][4], float (&acc_dk)[kDB][4],
                                                  uint32_t (&ap)[kNB / 2][4],
                                                  uint32_t (&ad)[kNB / 2][4]) {
    wgmma_wait_all(acc_dv, acc_dk, ap, ad);
  }

  // S^T = K Q^T, then dP^T = V dO^T, over the head dim: two groups, committed, not waited for.
  __device__ __forceinline__ static void sdp_issue(float (&s)[kNB][4], float (&dp)[kNB][4],
                                                   uint32_t aK, uint32_t aV, uint32_t aQ,
                                                   uint32_t aO) {
#pragma unroll
    for (int n = 0; n < kNB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f, dp[n][e] = 0.f;
    wgmma::fence_operands(s);
    wgmma::fence_operands(dp);
    wgmma::fence();
    const uint64_t dk = wgmma::desc_sw128(aK, 16, 1024), dq = wgmma::desc_sw128(aQ, 16, 1024);
    const uint64_t dv = wgmma::desc_sw128(aV, 16, 1024), dob = wgmma::desc_sw128(aO, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kDn / 16; ++kk)
      MmaS::ss(s, dk + ((kk >> 2) * (kKV * 128) + (kk & 3) * 32) / 16,
               dq + ((kk >> 2) * (kQ * 128) + (kk & 3) * 32) / 16, 1);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < kDn / 16; ++kk)
      MmaS::ss(dp, dv + ((kk >> 2) * (kKV * 128) + (kk & 3) * 32) / 16,
               dob + ((kk >> 2) * (kQ * 128) + (kk & 3) * 32) / 16, 1);
    wgmma::commit();
  }

  // Waits until at most kPending of this thread's wgmma groups are pending, `acc` fenced around
  // the wait (its product is among those complete).
  template <int kPending, int kN>
  __device__ __forceinline__ static void wait_for(float (&acc)[kN][4]) {
    wgmma::fence_operands(acc);
    wgmma::wait<kPending>();
    wgmma::fence_operands(acc);
  }

  // S^T and dP^T (sdp_issue), waited for.
  __device__ __forceinline__ static void sdp(float (&s)[kNB][4], float (&dp)[kNB][4], uint32_t aK,
                                             uint32_t aV, uint32_t aQ, uint32_t aO) {
    sdp_issue(s, dp, aK, aV, aQ, aO);
    wgmma::fence_operands(s);
    wait_for<0>(dp);
    wgmma::fence_operands(s);
  }

  // The step without a bias, its vector work beside the tensor cores: S^T and dP^T issued;
  // once S^T is done (`mask` applied to it), P^T = exp2(scale S^T - LSE) (in s) as register A
  // operands `ap` while dP^T runs; dV += P^T dO issued; once dP^T is done, dS^T = P^T (dP^T -
  // Dsum) (in dp) as `ad` and into shared memory at `ds` (softmax_pack's layout) while dV runs.
  // `before_ds` runs before dS^T is written (the warp-specialized kernel's barrier). dV is
  // committed, not waited for.
  template <class Mask, class BeforeDs>
  __device__ __forceinline__ static void step_products(
      float (&s)[kNB][4], float (&dp)[kNB][4], float (&acc_dv)[kDB][4], uint32_t aK,
      uint32_t aV, uint32_t aQ, uint32_t aO, const float2* stat, float scale_log2,
      uint32_t (&ap)[kNB / 2][4], uint32_t (&ad)[kNB / 2][4], unsigned char* ds, int wrow,
      int lane, Mask mask, BeforeDs before_ds) {
    sdp_issue(s, dp, aK, aV, aQ, aO);
    wait_for<1>(s);
    mask(s);
#pragma unroll
    for (int n = 0; n < kNB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 st = stat[n * 8 + 2 * (lane & 3) + (e & 1)];
        s[n][e] = mma::fast_exp2(s[n][e] * scale_log2 - st.x);
      }
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) pack_p_k(s, ap, kk);
    issue_acc(acc_dv, ap, aO);
    before_ds();
    wait_for<1>(dp);  // dP^T done, dV runs on
#pragma unroll
    for (int n = 0; n < kNB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 st = stat[n * 8 + 2 * (lane & 3) + (e & 1)];
        dp[n][e] = s[n][e] * (dp[n][e] - st.y);
      }
    pack_ds(dp, ad, ds, wrow, lane);
  }

  // P^T = exp(scale S^T - LSE), dS^T = P^T (dP^T - Dsum), in place (queries are columns), then
  // both as register A operands (16 queries per k-step) and dS^T also into shared memory at `ds`
  // for dQ, in the swizzled [key][query] layout (this thread's key rows wrow + lane / 4, + 8).
  __device__ __forceinline__ static void softmax_pack(float (&s)[kNB][4], float (&dp)[kNB][4],
                                                      const float2* stat, float scale_log2,
                                                      uint32_t (&ap)[kNB / 2][4],
                                                      uint32_t (&ad)[kNB / 2][4],
                                                      unsigned char* ds, int wrow, int lane) {
#pragma unroll
    for (int n = 0; n < kNB; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 st = stat[n * 8 + 2 * (lane & 3) + (e & 1)];
        const float pe = mma::fast_exp2(s[n][e] * scale_log2 - st.x);
        s[n][e] = pe;
        dp[n][e] = pe * (dp[n][e] - st.y);
      }
    }
    pack(s, dp, ap, ad, ds, wrow, lane);
  }

  // P^T as register A operands, k-step kk (16 queries).
  __device__ __forceinline__ static void pack_p_k(const float (&s)[kNB][4],
                                                  uint32_t (&ap)[kNB / 2][4], int kk) {
    ap[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    ap[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    ap[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    ap[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }

  // dS^T as register A operands and into shared memory at `ds` (pack's second half; null: not
  // staged), k-step kk.
  __device__ __forceinline__ static void pack_ds_k(const float (&dp)[kNB][4],
                                                   uint32_t (&ad)[kNB / 2][4], unsigned char* ds,
                                                   int wrow, int lane, int kk) {
    {
      ad[kk][0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
      ad[kk][1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
      ad[kk][2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      ad[kk][3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      if (ds == nullptr) return;  // no dQ to stage for (a constant where it is: inlined)
      const int r = wrow + (lane >> 2), c = kk * 16 + 2 * (lane & 3);
      const int cb = (c & 7) * 2;
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r, c >> 3) + cb) = ad[kk][0];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r + 8, c >> 3) + cb) = ad[kk][1];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r, (c >> 3) + 1) + cb) = ad[kk][2];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r + 8, (c >> 3) + 1) + cb) = ad[kk][3];
    }
  }
  __device__ __forceinline__ static void pack_ds(const float (&dp)[kNB][4],
                                                 uint32_t (&ad)[kNB / 2][4], unsigned char* ds,
                                                 int wrow, int lane) {
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) pack_ds_k(dp, ad, ds, wrow, lane, kk);
  }

  // P^T and dS^T (computed in place) as register A operands, dS^T also into shared memory at
  // `ds` (softmax_pack's second half; with a bias, bwd_bias.cuh computes them).
  __device__ __forceinline__ static void pack(const float (&s)[kNB][4], const float (&dp)[kNB][4],
                                              uint32_t (&ap)[kNB / 2][4],
                                              uint32_t (&ad)[kNB / 2][4], unsigned char* ds,
                                              int wrow, int lane) {
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) {
      pack_p_k(s, ap, kk);
      pack_ds_k(dp, ad, ds, wrow, lane, kk);
    }
  }

  // acc += A^T B with A^T from registers (P^T or dS^T) and B = the [query][d] tile at aB read
  // transposed (dO for dV, Q for dK), 16 queries per k-step; committed, not waited for.
  __device__ __forceinline__ static void issue_acc(float (&acc)[kDB][4],
                                                   const uint32_t (&a)[kNB / 2][4], uint32_t aB) {
    wgmma::fence_operands(acc);
    wgmma::fence();
    const uint64_t db = wgmma::desc_sw128(aB, kQ * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) MmaD::rs(acc, a[kk], db + (kk * 16 * 128) / 16, 1);
    wgmma::commit();
  }

  // dQ block = dS K over the CTA's kKV keys for kDq head-dim columns: A = dS^T at aDs and B = the
  // column block of K at aKblk, both read transposed; committed, not waited for.
  __device__ __forceinline__ static void issue_dq(float (&dqa)[kDq / 8][4], uint32_t aDs,
                                                  uint32_t aKblk) {
#pragma unroll
    for (int n = 0; n < kDq / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[n][e] = 0.f;
    wgmma::fence_operands(dqa);
    wgmma::fence();
    const uint64_t dds = wgmma::desc_sw128(aDs, kKV * 128, 1024);
    const uint64_t dkb = wgmma::desc_sw128(aKblk, kKV * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kKV / 16; ++kk)
      MmaQ::sst(dqa, dds + (kk * 16 * 128) / 16, dkb + (kk * 16 * 128) / 16, 1);
    wgmma::commit();
    wgmma::fence_operands(dqa);
  }
};

}  // namespace bwd
}  // namespace fna
