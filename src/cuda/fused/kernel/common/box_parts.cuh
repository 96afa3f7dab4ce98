// The pieces of the box forward shared by the box kernel (fwd_box.cuh) and the strip kernel
// (fwd_strip.cuh): the CTA traits, the swizzled box layout and border bits, and one 64-key chunk
// of a warp's 4x4 query box (scores, mask, online softmax, P V). fwd_box.cuh describes the
// algorithm.
#pragma once


#include <cmath>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/fwd_bias.cuh"
#include "cuda/fused/kernel/common/fwd_common.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"

namespace fna {
namespace fused {

template <class T, int kD_, class QT>
struct BoxTraits {
  using Elem = typename T::type;
  using Tag = T;  // the MMA's element type (mma::BF16, mma::F16)
  // The names softmax_scores / FwdState read.
  static constexpr bool kF32 = false;
  static constexpr int kD = kD_;
  static constexpr int kFirstAxis = 1;
  static constexpr int kMT = 1;
  static constexpr int kStepN = 64;
  static constexpr bool kQInRegs = false;
  static constexpr int kQ = QT::kSize;
  static constexpr int kWarps = kQ / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBoxes2 = QT::kExt[2] / kBoxExt;  // boxes along the fast axis
  static constexpr int kChunks = kD / 8;                  // 16-byte chunks per row
  static constexpr int kRowBytes = kD * 2;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  // Up to three 4-warp CTAs per SM (small halos); larger CTAs take the registers they need.
  static constexpr int kMinBlocks = kThreads <= 128 ? 3 : 1;
  static_assert(QT::kExt[0] == 1 && QT::kExt[1] % kBoxExt == 0 && QT::kExt[2] % kBoxExt == 0 &&
                    QT::kExt[1] <= 32 && kD == 64,
                "box forward tiles");
};

// Byte offset of chunk `c` of shared-memory row `r`.
__device__ __forceinline__ uint32_t box_sw(int r, int c) {
  return uint32_t(r) * 128u + uint32_t(((c ^ r) & 7) << 4);
}

// The shared-memory address of 16-column step kk of a key row chunk at `off` (box_sw) in the
// planes starting at `base`, `plane` bytes apart (64 columns a plane).
__device__ __forceinline__ uint32_t box_step(uint32_t base, uint32_t off, int kk, uint32_t plane) {
  return base + (kk >= 4 ? plane : 0u) + (off ^ uint32_t((kk & 3) << 5));
}

// Bits [lo, hi) of a 32-bit word (0 <= lo, hi <= 32).
__device__ __forceinline__ unsigned box_bits(int lo, int hi) {
  const unsigned below_hi = hi >= 32 ? ~0u : ((1u << (hi > 0 ? hi : 0)) - 1u);
  const unsigned below_lo = lo >= 32 ? ~0u : ((1u << (lo > 0 ? lo : 0)) - 1u);
  return below_hi & ~below_lo;
}

// An m16n8k16 A fragment from a pair of n8 accumulator blocks (lo: k 0-7, hi: k 8-15): P, dS or
// their transposes as the left operand of the next product.
template <class T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = mma::pack2<T>(lo[0], lo[1]);
  a[1] = mma::pack2<T>(lo[2], lo[3]);
  a[2] = mma::pack2<T>(hi[0], hi[1]);
  a[3] = mma::pack2<T>(hi[2], hi[3]);
}

// One 64-key chunk of a warp's box (the box and strip forwards): S = Q K^T over union rows
// 4 ch .. 4 ch + 3, whose 16 columns start at shared-memory row `row[a]` (K and V at sK / sV,
// the lane's ldmatrix columns kcol / vcol and halves ksel / vsel), the mask from the thread's two
// query rows' bit sets (rowbits over union rows, pat over its four columns), the online softmax
// and O += P V. The ldmatrix addresses step by one XOR: box_sw(r, 2 kk + s) ==
// box_sw(r, s) ^ (kk << 5) (the XOR touches the 16-byte chunk bits only).
// box_scores is its first half (S and the mask), box_update the second (softmax and P V), so a
// caller can add a bias (box_bias) or reuse Q's registers in between. Head dim 128 (the strip
// forward) reads columns 64-127 from a second plane `plane` bytes after the first, laid out alike
// (box_step).
// The products alone: s = A B^T over the chunk's 64 keys, A the box's fragments (Q, or dO for the
// strip dQ kernel's dP = dO V^T), B the ring rows at sK.
template <class Tr>
__device__ __forceinline__ void box_products(float (&s)[1][8][4],
                                             const uint32_t (&qf)[Tr::kD / 16][4],
                                             const int (&row)[kBoxChunkRows], uint32_t sK,
                                             int kcol, int ksel, uint32_t plane = 0) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
#pragma unroll
  for (int j = 0; j < 8; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
  // S: n8 blocks 2a, 2a + 1 are columns 0-7 and 8-15 of union row 4 ch + a.
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a) {
    const uint32_t off = box_sw(row[a] + kcol, ksel);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t b[4];
      mma::ldsm_x4(b, box_step(sK, off, kk, plane));
      mma::mma_16816<T>(s[0][2 * a], qf[kk], b[0], b[1]);
      mma::mma_16816<T>(s[0][2 * a + 1], qf[kk], b[2], b[3]);
    }
  }
}

template <class Tr>
__device__ __forceinline__ void box_scores(float (&s)[1][8][4],
                                           const uint32_t (&qf)[Tr::kD / 16][4],
                                           const int (&row)[kBoxChunkRows], uint32_t sK, int kcol,
                                           int ksel, int ch, const unsigned (&rowbits)[2],
                                           const unsigned (&pat)[2], uint32_t plane = 0) {
  box_products<Tr>(s, qf, row, sK, kcol, ksel, plane);
  // Mask: element (block 2a + h, e) of row r is key (union row 4 ch + a, column 8h + t2 + e).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const unsigned rb = rowbits[r] >> (kBoxChunkRows * ch);
    unsigned m = 0;
#pragma unroll
    for (int a = 0; a < kBoxChunkRows; ++a) m |= ((rb >> a) & 1u) ? pat[r] << (4 * a) : 0u;
#pragma unroll
    for (int a = 0; a < kBoxChunkRows; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (((m >> (4 * a + 2 * h + e)) & 1u) == 0u) s[0][2 * a + h][2 * r + e] = -INFINITY;
  }
}

// The bias of one chunk's scores (the box and strip forwards with a bias): the table, divided by
// the scale, staged in shared memory (stage_bias: rows of kPitch = stage_stride(1) entries);
// at[r] is the address of row r's entry for union position (0, t2), so the score of union row
// 4 ch + a, column 8 h + t2 + e reads at[r] + 4 ((4 ch + a) kPitch + 8 h + e). Masked scores read
// nothing: their index may lie outside the table (staged_entry is volatile, never speculated
// ahead of the test).
__device__ __forceinline__ void box_bias(float (&s)[1][8][4], const uint32_t (&at)[2], int ch) {
  constexpr int kPitch = stage_stride(1);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t base = at[r] + uint32_t(ch * kBoxChunkRows * kPitch * 4);
#pragma unroll
    for (int a = 0; a < kBoxChunkRows; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[0][2 * a + h][2 * r + e];
          if (x != -INFINITY) x += staged_entry(base + uint32_t((a * kPitch + 8 * h + e) * 4));
        }
  }
}

template <class Tr>
__device__ __forceinline__ void box_update(FwdState<Tr>& st, float (&s)[1][8][4],
                                           const int (&row)[kBoxChunkRows], uint32_t sV, int vcol,
                                           int vsel, float scale_log2, uint32_t plane = 0) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
  softmax_update<Tr, true>(st, s, scale_log2);
  // O += P V: k-step a is union row 4 ch + a (16 keys).
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a) {
    uint32_t pa[4];
    pack_a<T>(pa, s[0][2 * a], s[0][2 * a + 1]);
    const uint32_t off = box_sw(row[a] + vcol, vsel);
#pragma unroll
    for (int jd = 0; jd < kD / 16; ++jd) {
      uint32_t b[4];
      mma::ldsm_x4_trans(b, box_step(sV, off, jd, plane));
      mma::mma_16816<T>(st.o[0][2 * jd], pa, b[0], b[1]);
      mma::mma_16816<T>(st.o[0][2 * jd + 1], pa, b[2], b[3]);
    }
  }
}

// One 64-key chunk of the strip dQ kernel's box (the backward's dQ = scale dS K, query-centric
// as the forward): S = Q K^T masked (box_scores, in s), dP = dO V^T (box_products over the V
// ring), then per thread row r: P = exp2(S scale log2(e) - LSE log2(e)) (0 where masked: S =
// -inf), dS = P (dP - rowsum(dO O)), and acc += dS K with K read transposed from the ring (as
// box_update reads V). stat[r] = {LSE log2(e), rowsum(dO O) - d_lse} of the thread's row r.
template <class Tr>
__device__ __forceinline__ void box_dq_update(float (&acc)[1][Tr::kD / 8][4], float (&s)[1][8][4],
                                              float (&dp)[1][8][4], const float2 (&stat)[2],
                                              const int (&row)[kBoxChunkRows], uint32_t sK,
                                              int vcol, int vsel, float scale_log2,
                                              uint32_t plane = 0) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pr = mma::fast_exp2(s[0][j][e] * scale_log2 - stat[r].x);
      s[0][j][e] = pr * (dp[0][j][e] - stat[r].y);
    }
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a) {
    uint32_t pa[4];
    pack_a<T>(pa, s[0][2 * a], s[0][2 * a + 1]);
    const uint32_t off = box_sw(row[a] + vcol, vsel);
#pragma unroll
    for (int jd = 0; jd < kD / 16; ++jd) {
      uint32_t b[4];
      mma::ldsm_x4_trans(b, box_step(sK, off, jd, plane));
      mma::mma_16816<T>(acc[0][2 * jd], pa, b[0], b[1]);
      mma::mma_16816<T>(acc[0][2 * jd + 1], pa, b[2], b[3]);
    }
  }
}

// box_dq_update's work for one union row of a chunk (16 keys at shared-memory row `row`) from
// the products on: S and dP of the row, its mask `keep[r]` (bit 2 h + e: column 8 h + t2 + e of
// the row is in the window of the thread's row r), P, dS and acc += dS K. S and dP take 16
// registers instead of a chunk's 64 (the strip dQ kernel at head dim 128).
template <class Tr>
__device__ __forceinline__ void box_dq_row(float (&acc)[1][Tr::kD / 8][4],
                                           const uint32_t (&qf)[Tr::kD / 16][4],
                                           const uint32_t (&of)[Tr::kD / 16][4],
                                           const float2 (&stat)[2], int row, uint32_t sK,
                                           uint32_t sV, int kcol, int ksel, int vcol, int vsel,
                                           const unsigned (&keep)[2], float scale_log2,
                                           uint32_t plane) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
  float s[2][4] = {}, dp[2][4] = {};
  const uint32_t koff = box_sw(row + kcol, ksel);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t b[4];
    mma::ldsm_x4(b, box_step(sK, koff, kk, plane));
    mma::mma_16816<T>(s[0], qf[kk], b[0], b[1]);
    mma::mma_16816<T>(s[1], qf[kk], b[2], b[3]);
    mma::ldsm_x4(b, box_step(sV, koff, kk, plane));
    mma::mma_16816<T>(dp[0], of[kk], b[0], b[1]);
    mma::mma_16816<T>(dp[1], of[kk], b[2], b[3]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pr = ((keep[r] >> (2 * h + (e & 1))) & 1u) != 0u
                           ? mma::fast_exp2(s[h][e] * scale_log2 - stat[r].x)
                           : 0.f;
      s[h][e] = pr * (dp[h][e] - stat[r].y);
    }
  uint32_t pa[4];
  pack_a<T>(pa, s[0], s[1]);
  const uint32_t voff = box_sw(row + vcol, vsel);
#pragma unroll
  for (int jd = 0; jd < kD / 16; ++jd) {
    uint32_t b[4];
    mma::ldsm_x4_trans(b, box_step(sK, voff, jd, plane));
    mma::mma_16816<T>(acc[0][2 * jd], pa, b[0], b[1]);
    mma::mma_16816<T>(acc[0][2 * jd + 1], pa, b[2], b[3]);
  }
}
// One 64-query chunk of the strip dK / dV kernel's box of 16 keys (the transposed products: rows
// are keys, columns queries): s = S^T masked (box_scores with K fragments against the Q ring), dp
// = dP^T (V fragments against the dO ring), cs[a][2 h + e] the statistics of the thread's query
// column 8 h + t2 + e of union row 4 ch + a. P^T = exp2(S^T scale log2(e) - LSE log2(e)), dS^T =
// P^T (dP^T - rowsum(dO O)), then dV += P^T dO and dK += dS^T Q, dO and Q read transposed from
// the rings (sO, sQ) as box_update reads V.
template <class Tr>
__device__ __forceinline__ void box_dkdv_update(float (&dk)[1][Tr::kD / 8][4],
                                                float (&dv)[1][Tr::kD / 8][4],
                                                float (&s)[1][8][4], float (&dp)[1][8][4],
                                                const float2 (&cs)[kBoxChunkRows][4],
                                                const int (&row)[kBoxChunkRows], uint32_t sQ,
                                                uint32_t sO, int vcol, int vsel, float scale_log2,
                                                uint32_t plane = 0) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 st = cs[a][2 * h + (e & 1)];
        const float pr = mma::fast_exp2(s[0][2 * a + h][e] * scale_log2 - st.x);
        s[0][2 * a + h][e] = pr;
        dp[0][2 * a + h][e] = pr * (dp[0][2 * a + h][e] - st.y);
      }
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a) {
    uint32_t pa[4], da[4];
    pack_a<T>(pa, s[0][2 * a], s[0][2 * a + 1]);
    pack_a<T>(da, dp[0][2 * a], dp[0][2 * a + 1]);
    const uint32_t off = box_sw(row[a] + vcol, vsel);
#pragma unroll
    for (int jd = 0; jd < kD / 16; ++jd) {
      uint32_t b[4];
      mma::ldsm_x4_trans(b, box_step(sO, off, jd, plane));
      mma::mma_16816<T>(dv[0][2 * jd], pa, b[0], b[1]);
      mma::mma_16816<T>(dv[0][2 * jd + 1], pa, b[2], b[3]);
      mma::ldsm_x4_trans(b, box_step(sQ, off, jd, plane));
      mma::mma_16816<T>(dk[0][2 * jd], da, b[0], b[1]);
      mma::mma_16816<T>(dk[0][2 * jd + 1], da, b[2], b[3]);
    }
  }
}

// box_dkdv_update for one union row of a chunk (16 queries at ring row `row`), from the products
// on, with its mask `keep` (box_dq_row's) and its columns' statistics cs[2 h + e]: S^T and dP^T
// take 16 registers (the strip dK / dV kernel at head dim 128). dK and dV accumulate kCols
// head-dim columns from col0 (the warp's share: two warps per box at head dim 128).
template <class Tr, int kCols = Tr::kD>
__device__ __forceinline__ void box_dkdv_row(float (&dk)[1][kCols / 8][4],
                                             float (&dv)[1][kCols / 8][4],
                                             const uint32_t (&kf)[Tr::kD / 16][4],
                                             const uint32_t (&vf)[Tr::kD / 16][4],
                                             const float2 (&cs)[4], int row, uint32_t sQ,
                                             uint32_t sO, int kcol, int ksel, int vcol, int vsel,
                                             const unsigned (&keep)[2], float scale_log2,
                                             uint32_t plane, int col0 = 0) {
  using T = typename Tr::Tag;
  constexpr int kD = Tr::kD;
  float s[2][4] = {}, dp[2][4] = {};
  const uint32_t koff = box_sw(row + kcol, ksel);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t b[4];
    mma::ldsm_x4(b, box_step(sQ, koff, kk, plane));
    mma::mma_16816<T>(s[0], kf[kk], b[0], b[1]);
    mma::mma_16816<T>(s[1], kf[kk], b[2], b[3]);
    mma::ldsm_x4(b, box_step(sO, koff, kk, plane));
    mma::mma_16816<T>(dp[0], vf[kk], b[0], b[1]);
    mma::mma_16816<T>(dp[1], vf[kk], b[2], b[3]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 st = cs[2 * h + (e & 1)];
      const float pr = ((keep[e >> 1] >> (2 * h + (e & 1))) & 1u) != 0u
                           ? mma::fast_exp2(s[h][e] * scale_log2 - st.x)
                           : 0.f;
      s[h][e] = pr;
      dp[h][e] = pr * (dp[h][e] - st.y);
    }
  uint32_t pa[4], da[4];
  pack_a<T>(pa, s[0], s[1]);
  pack_a<T>(da, dp[0], dp[1]);
  const uint32_t voff = box_sw(row + vcol, vsel);
#pragma unroll
  for (int jd = 0; jd < kCols / 16; ++jd) {
    const int step = col0 / 16 + jd;
    uint32_t b[4];
    mma::ldsm_x4_trans(b, box_step(sO, voff, step, plane));
    mma::mma_16816<T>(dv[0][2 * jd], pa, b[0], b[1]);
    mma::mma_16816<T>(dv[0][2 * jd + 1], pa, b[2], b[3]);
    mma::ldsm_x4_trans(b, box_step(sQ, voff, step, plane));
    mma::mma_16816<T>(dk[0][2 * jd], da, b[0], b[1]);
    mma::mma_16816<T>(dk[0][2 * jd + 1], da, b[2], b[3]);
  }
}

}  // namespace fused
}  // namespace fna
