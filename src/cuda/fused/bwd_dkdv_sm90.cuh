// dK / dV (and atomic dQ) kernel of the fused backward on Hopper's warpgroup MMAs (wgmma,
// sm_90a): the algorithm of bwd_dkdv.cuh (one multi-dimensional key/value tile per CTA, the query
// tiles of its inverse neighborhood, everything transposed with keys as rows), with the five
// products issued per warpgroup:
//   S^T  = K Q^T     wgmma m64n64, A = this warpgroup's 64 keys, B = the 64-query tile (both
//   dP^T = V dO^T    K-major, from 128-byte-swizzled shared memory)
//   mask, P^T = exp2(S^T scale - LSE), dS^T = P^T (dP^T - rowsum(dO O))   (registers, per thread
//                    exactly as bwd_dkdv.cuh: the accumulator layout per warp is mma.sync's)
//   dV += P^T dO     wgmma m64nD, A = P^T from registers, B = dO read transposed (MN-major)
//   dK += dS^T Q     the same with dS^T and Q
//   dQ  = dS K       wgmma m64n64 per 64 head-dim columns, A = dS^T staged in shared memory and
//                    read transposed, B = K read transposed; added into the float32 dQ buffer
//                    with vector atomics (warpgroup w takes the column blocks w, w + 2, ...).
// CTA: 128 keys (two warpgroups, 8 warps) x query tiles of 64, the shapes the host tiling of the
// 16-bit backward already uses (bwd_launch.cuh), 16-bit elements, head dims padded to 64 or 128,
// atomic-dQ mode only (the deterministic mode keeps the mma.sync kernels). One CTA per SM (dK, dV,
// S^T and dP^T take the 255 registers). Measured on an H100 (2026-11-22): half tiles (one
// warpgroup, 64 keys, two CTAs per SM) ran forward+backward 15-17% slower, and dQ per warpgroup
// over its own keys (no barrier before dQ, twice the atomics) 4-10% slower.
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
// CTA: a data-movement warpgroup does the copies and the dQ reductions. The default at padded head
// dim 128 (launch: use_bwd_sm90_ws).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/wgmma.cuh"
#include "cuda/fused/bwd_dkdv.cuh"
#include "cuda/fused/bwd_ktile.cuh"
#include "cuda/fused/bwd_params.cuh"
#include "cuda/fused/bwd_qtiles.cuh"

namespace fna {
namespace bwd {

template <typename T, int kD>
struct DkdvSm90Traits {
  using E = T;
  // Query tiles in flight: Q, dO, statistics and row indices of tiles it .. it + kBufs - 1 (three
  // buffers measured 0.5-2.5% faster forward+backward than two on the standard problems, within
  // the noise of the runs: docs/benchmarks.md).
  static constexpr int kBufs = 3;
  using Tag = typename MmaTag<T>::type;
  static constexpr int kWarps = 8, kThreads = 256, kKV = 128, kQ = 64;
  static constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  static constexpr int kKVBytes = kKV * kD * 2;
  static constexpr int kQBytes = kQ * kD * 2;
  static constexpr int kDsBytes = kKV * kQ * 2;  // dS^T [key][query]: one 128-byte-row region
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffO = kOffQ + kBufs * kQBytes;  // Q and dO: kBufs buffers each
  static constexpr int kOffDs = kOffO + kBufs * kQBytes;
  static constexpr int kOffStat = kOffDs + kDsBytes;              // float2 [kBufs][kQ]
  static constexpr int kOffQoff = kOffStat + kBufs * kQ * 8;      // uint32 [kQ]
  static constexpr int kOffKinv = kOffQoff + kQ * 4;              // int2 [kKV][kAxes]
  static constexpr int kOffTok = kOffKinv + kKV * kAxes * 8;     // int64 [kBufs][kQ]
  static constexpr int kOffFull = kOffTok + kBufs * kQ * 8;       // int [kBufs]: no mask needed
  static constexpr int kOffCm = (kOffFull + kBufs * 4 + 7) / 8 * 8;  // uint64 [3][65]
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
template <int kKV, int kQ>
__device__ __forceinline__ int64_t sm90_query_setup(const Params& p, const Group& G,
                                                    bool additional, const int* kv0, int2* s_kinv,
                                                    uint32_t* s_qoff, uint64_t* s_cm,
                                                    nbr::Range (&qr)[kAxes], int (&nq)[kAxes]) {
  const int64_t n_tiles = key_tile_queries<kKV, kQ>(p, G, additional, kv0, s_kinv, qr, nq);
  const int tid = threadIdx.x;
  if (tid < kQ) s_qoff[tid] = pack_offsets(p.tq, tid);
  __syncthreads();
  build_col_masks(p, s_qoff, s_cm);
  __syncthreads();
  return n_tiles * p.heads_per_kv;
}

// One step's products for one warpgroup, shared by dkdv_sm90_kernel and dkdv_sm90_ws_kernel
// (bwd_dkdv_sm90_ws.cuh): the warpgroup's 64 keys at aK / aV, the 64-query tile's Q / dO at
// aQ / aO, all 128-byte swizzled.
template <typename T, int kD>
struct Sm90Step {
  using Tag = typename MmaTag<T>::type;
  using MmaS = wgmma::Mma<Tag, 64>;  // S^T, dP^T (64 queries) and dQ (64 head-dim columns)
  using MmaD = wgmma::Mma<Tag, kD>;  // dV, dK
  static constexpr int kKV = 128, kQ = 64, kNB = kQ / 8, kDB = kD / 8;

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
    wgmma::fence_operands(acc_dv);
    wgmma::fence_operands(acc_dk);
    wgmma::fence_operands(ap);
    wgmma::fence_operands(ad);
    wgmma::wait<0>();
    wgmma::fence_operands(acc_dv);
    wgmma::fence_operands(acc_dk);
    wgmma::fence_operands(ap);
    wgmma::fence_operands(ad);
  }

  // S^T = K Q^T and dP^T = V dO^T over the head dim, waited for.
  __device__ __forceinline__ static void sdp(float (&s)[kNB][4], float (&dp)[kNB][4], uint32_t aK,
                                             uint32_t aV, uint32_t aQ, uint32_t aO) {
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
    for (int kk = 0; kk < kD / 16; ++kk)
      MmaS::ss(s, dk + ((kk >> 2) * (kKV * 128) + (kk & 3) * 32) / 16,
               dq + ((kk >> 2) * (kQ * 128) + (kk & 3) * 32) / 16, 1);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      MmaS::ss(dp, dv + ((kk >> 2) * (kKV * 128) + (kk & 3) * 32) / 16,
               dob + ((kk >> 2) * (kQ * 128) + (kk & 3) * 32) / 16, 1);
    wgmma::commit();
    wgmma::fence_operands(s);
    wgmma::fence_operands(dp);
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    wgmma::fence_operands(dp);
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
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) {
      ap[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      ap[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      ap[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      ap[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      ad[kk][0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
      ad[kk][1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
      ad[kk][2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      ad[kk][3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      const int r = wrow + (lane >> 2), c = kk * 16 + 2 * (lane & 3);
      const int cb = (c & 7) * 2;
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r, c >> 3) + cb) = ad[kk][0];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r + 8, c >> 3) + cb) = ad[kk][1];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r, (c >> 3) + 1) + cb) = ad[kk][2];
      *reinterpret_cast<uint32_t*>(ds + sw128<kKV>(r + 8, (c >> 3) + 1) + cb) = ad[kk][3];
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

  // dQ block = dS K over the CTA's 128 keys for 64 head-dim columns: A = dS^T at aDs and B = the
  // column block of K at aKblk, both read transposed; committed, not waited for.
  __device__ __forceinline__ static void issue_dq(float (&dqa)[8][4], uint32_t aDs,
                                                  uint32_t aKblk) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[n][e] = 0.f;
    wgmma::fence_operands(dqa);
    wgmma::fence();
    const uint64_t dds = wgmma::desc_sw128(aDs, kKV * 128, 1024);
    const uint64_t dkb = wgmma::desc_sw128(aKblk, kKV * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kKV / 16; ++kk)
      MmaS::sst(dqa, dds + (kk * 16 * 128) / 16, dkb + (kk * 16 * 128) / 16, 1);
    wgmma::commit();
    wgmma::fence_operands(dqa);
  }
};

template <typename T, int kD>
__global__ void __launch_bounds__(256, 1) dkdv_sm90_kernel(const Params p, const bool additional) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkdvSm90Traits<T, kD>;
  constexpr int kBufs = Tr::kBufs;
  using E = T;
  constexpr int kKV = Tr::kKV, kQ = Tr::kQ, kThreads = Tr::kThreads, kChunks = Tr::kChunks;
  constexpr int kNB = kQ / 8;  // n8 blocks of queries
  constexpr int kDB = kD / 8;  // n8 blocks of the head dim

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  uint32_t base;
  unsigned char* smem = smem_1024(smem_raw, base);
  float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kOffStat);
  uint32_t* s_qoff = reinterpret_cast<uint32_t*>(smem + Tr::kOffQoff);
  int2* s_kinv = reinterpret_cast<int2*>(smem + Tr::kOffKinv);
  int64_t* s_tok = reinterpret_cast<int64_t*>(smem + Tr::kOffTok);
  int* s_full = reinterpret_cast<int*>(smem + Tr::kOffFull);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  // ---- which tile this CTA owns (as bwd_dkdv.cuh) ----------------------------------------------
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
  const int64_t n_iter =
      sm90_query_setup<kKV, kQ>(p, G, additional, kv0, s_kinv, s_qoff, s_cm, qr, nq);

  // The query tiles (bwd_qtiles.cuh): Q, dO, statistics and row indices into buffer `buf`.
  QWalk cur;
  cur.start(p, additional, hkv, qr);
  auto load_q_tile = [&](const QWalk& w, int buf) {
    auto sw = [](int row, int c) { return sw128<kQ>(row, c); };
    load_q_rows<E, kQ, kThreads, kChunks, decltype(sw), true>(
        p, G, additional, b, kv0, w, s_qoff, smem + Tr::kOffQ + buf * Tr::kQBytes,
        smem + Tr::kOffO + buf * Tr::kQBytes, s_stat + buf * kQ, s_tok + buf * kQ, s_full + buf,
        sw);
  };

  using Step = Sm90Step<T, kD>;
  float acc_dk[kDB][4], acc_dv[kDB][4];
  Step::zero_acc(acc_dk, acc_dv);
  const uint32_t aK = base + Tr::kOffK + wg * 64 * 128;  // this warpgroup's 64 keys
  const uint32_t aV = base + Tr::kOffV + wg * 64 * 128;
  const int wrow = warp * 16;

  // Tiles are loaded kBufs - 1 iterations ahead: `ahead` walks the tile loaded next.
  QWalk ahead = cur;
  for (int i = 0; i < kBufs - 1; ++i)
    if (i < n_iter) {
      load_q_tile(ahead, i);
      ahead.next(p, additional, qr, nq);
    }
  int buf = 0;
  // Loads tile it + kBufs - 1 into the buffer of tile it - 1 (free: step it - 1 is complete in
  // every warpgroup once the step's first barrier is passed).
  auto prefetch = [&](int64_t it) {
    if (it + kBufs - 1 < n_iter) {
      const int next_buf = buf == 0 ? kBufs - 1 : buf - 1;  // (it + kBufs - 1) % kBufs
      load_q_tile(ahead, next_buf);
      ahead.next(p, additional, qr, nq);
    }
  };
  for (int64_t it = 0; it < n_iter; ++it) {
    // Tile it landed (the later tiles' groups may still be in flight).
    if (it + 1 < n_iter)
      mma::cp_async_wait<kBufs - 2>();
    else
      cp_async_wait_all();
    wgmma::fence_proxy_async();
    __syncthreads();
    prefetch(it);
    const uint32_t aDs = base + Tr::kOffDs;
    const bool masked = !s_full[buf];
    const int* q0 = cur.q0;
    const uint32_t aQ = base + Tr::kOffQ + buf * Tr::kQBytes;
    const uint32_t aO = base + Tr::kOffO + buf * Tr::kQBytes;
    const float2* stat = s_stat + buf * kQ;

    // S^T = K Q^T and dP^T = V dO^T over the head dim.
    float s[kNB][4], dp[kNB][4];
    Step::sdp(s, dp, aK, aV, aQ, aO);

    // Border pairs only (bwd_ktile.cuh): a key row keeps the queries of its inverse window.
    if (masked) mask_key_rows_bits<kNB>(s, s_kinv, s_cm, p, q0, wrow, lane);

    // P^T, dS^T; dS^T also to shared memory for dQ.
    uint32_t ap[kNB / 2][4], ad[kNB / 2][4];
    Step::softmax_pack(s, dp, stat, p.scale_log2, ap, ad, smem + Tr::kOffDs, wrow, lane);

    // dV += P^T dO, dK += dS^T Q (B read transposed: [query][d] rows, 16 queries per k-step).
    // dV is issued before the barrier (it runs while the warpgroups meet there), dK after dQ, so
    // that it runs while this warpgroup's dQ atomics are issued (measured 0-1.9% faster
    // forward+backward than issuing both before the barrier, within noise: docs/benchmarks.md).
    auto issue_dk = [&]() { Step::issue_acc(acc_dk, ad, aQ); };
    Step::issue_acc(acc_dv, ap, aO);

    // dQ = dS K over the CTA's 128 keys: every warpgroup's dS^T must be in shared memory.
    wgmma::fence_proxy_async();
    __syncthreads();
    static_assert(kD / 64 <= 2, "at most one dQ column block per warpgroup");
    if (wg >= kD / 64) issue_dk();  // no dQ block for this warpgroup
#pragma unroll 1
    for (int cblk = wg; cblk < kD / 64; cblk += 2) {
      float dqa[8][4];
      Step::issue_dq(dqa, aDs, base + Tr::kOffK + cblk * kKV * 128);
      issue_dk();
      // This thread's two query rows (row0, row0 + 8) and their flat indices.
      const int row0 = (warp & 3) * 16 + (lane >> 2);
      const int64_t tok[2] = {s_tok[buf * kQ + row0], s_tok[buf * kQ + row0 + 8]};
      wgmma::wait<1>();  // dV and dQ done; dK runs on
      wgmma::fence_operands(dqa);
      // The block's columns all exist (no padding): one address per row, constant offsets.
      const bool whole = cblk * 64 + 64 <= p.dim;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t t = tok[half];
        if (t < 0) continue;
        const int col0 = cblk * 64 + 2 * (lane & 3);
        float* dst = p.dq_accum + t * p.dq_row + col0;
        if (whole) {
#pragma unroll
          for (int n = 0; n < 8; ++n)
            atomicAdd(reinterpret_cast<float2*>(dst + n * 8),
                      make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]));
        } else {
#pragma unroll
          for (int n = 0; n < 8; ++n)
            if (col0 + n * 8 < p.dim)
              atomicAdd(reinterpret_cast<float2*>(dst + n * 8),
                        make_float2(dqa[n][2 * half], dqa[n][2 * half + 1]));
        }
      }
    }
    // dV / dK (and, for a warpgroup without a dQ block, everything) complete before the buffers
    // and dS^T are overwritten after the next barrier.
    Step::wait_all(acc_dv, acc_dk, ap, ad);
    cur.next(p, additional, qr, nq);
    buf = buf + 1 == kBufs ? 0 : buf + 1;
  }

  // ---- epilogue: rows are keys; dK carries the softmax scale -----------------------------------
  store_dkdv<true, true, kDB, E>(p, G, additional, b, hkv, kv0, n0, wrow, lane, acc_dk, acc_dv);
#endif
}

}  // namespace bwd
}  // namespace fna
