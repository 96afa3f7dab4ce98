// The fused neighborhood attention forward kernel (FlashAttention-2 style, mma.sync, sm_80+).
//
// A CTA owns one multi-dimensional query tile (QT) of one (batch, head, dilation group); each warp
// owns 16 * kMT query rows. It walks the key/value tiles (KT) covering the union of its queries'
// windows (tiling.cuh), then the additional keys as 1-D tiles, through one online softmax:
//   S = Q K^T (registers) -> mask (border tiles only) -> m, l update with exp2 -> O += P V,
// P going from the S accumulators straight into the A operand of the second MMA. Attention
// weights never leave registers; K/V tiles are double buffered in shared memory with cp.async,
// one barrier per tile. Dilation groups are separate CTAs of the same launch working in local
// coordinates; GQA maps the head to its KV head without copies.
//
// float32 (T = mma::F32 / mma::TF32) runs the same kernel on the TF32 tensor cores (m16n8k8):
// Q and K fragments come from ldmatrix as for 16-bit elements (the loaded 16-byte rows hold 4
// floats in the tf32 A / B layouts), P goes from the S accumulators into the A operand with the
// keys of each 8-key step permuted (A column t is key 2t, column t + 4 key 2t + 1), and V's B
// fragment follows that permutation with 32-bit shared loads. F32 splits every operand into two
// tf32 parts and makes three products of each pair (float32-class error), TF32 makes one.
#pragma once

#include <cmath>
#include <type_traits>

#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/fwd_bias.cuh"
#include "cuda/fused/kernel/common/fwd_common.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace fused {

template <class T, int kD_, int kRank_, int kMT_, class QT, class KT>
struct FwdTraits {
  using Elem = typename T::type;
  // float32 elements (TF32 tensor cores, m16n8k8) instead of 16-bit ones (m16n8k16).
  static constexpr bool kF32 = sizeof(Elem) == 4;
  static constexpr int kVec = 16 / int(sizeof(Elem));  // elements per 16-byte chunk
  static constexpr int kD = kD_;
  static constexpr int kRank = kRank_;
  static constexpr int kFirstAxis = kAxes - kRank;
  static constexpr int kQ = QT::kSize;
  static constexpr int kN = KT::kSize;
  // A warp owns kMT 16-row m-tiles: every K/V fragment read from shared memory then feeds kMT
  // MMAs. With one m-tile per warp, ldmatrix traffic (a whole K and V tile per warp per step)
  // outruns the tensor cores; two halve it. O (kMT * kD / 2 registers) bounds it to kD <= 128.
  // Chosen per configuration (configs/forward.h).
  static constexpr int kMT = kMT_;
  static constexpr int kWarpRows = 16 * kMT;
  static constexpr int kWarps = kQ / kWarpRows;
  static constexpr int kThreads = kWarps * 32;
  // Two CTAs per SM when a warp holds two m-tiles (4 warps, <= 255 registers each): one CTA's
  // barrier then never idles the SM.
  static constexpr int kMinBlocks = kMT == 2 ? 2 : 1;
  // Keys per softmax step: a 64-key tile is processed as two 32-key halves when S and O of two
  // m-tiles would not fit the registers together (head dim above 64).
  // float32 steps over at most 32 keys: its fragments take twice the registers.
  static constexpr int kStepN =
      kF32 ? (kN > 32 ? 32 : kN) : ((kMT == 2 && kD > 64 && kN > 32) ? 32 : kN);
  // Rows padded by 16 bytes: the 8 row addresses of one ldmatrix then fall in 8 distinct 16-byte
  // bank groups for every head dim that is a multiple of 8, with no swizzle to compute.
  // (float32: 16-byte padding too, so the same holds for its 4-float rows.)
  static constexpr int kPitch = kD + kVec;
  static constexpr int kChunks = kD / kVec;  // 16-byte chunks per row
  // Q fragments stay in registers while they take at most 32 registers; otherwise they are
  // re-read from shared memory each step so O still fits. float32 fragments (twice the registers,
  // and split ones twice again) are always re-read.
  static constexpr bool kQInRegs = !kF32 && kMT * kD <= 128;
  static constexpr int kTileElems = kN * kPitch;
  static constexpr int kQElems = kQ * kPitch;
  static constexpr int kKVElems = 4 * kTileElems;  // K and V, two buffers each
  // With Q in registers its shared-memory staging area is reused by the K/V buffers.
  static constexpr int kSmemElems =
      kQInRegs ? (kQElems > kKVElems ? kQElems : kKVElems) : kQElems + kKVElems;
  // Per-row windows (begin, end per axis) follow the tiles: read by border tiles only, so they
  // cost no registers in the main loop.
  static constexpr size_t kWinOffset = size_t(kSmemElems) * sizeof(Elem);
  static constexpr size_t kSmemBytes = kWinOffset + size_t(kQ) * sizeof(RowWindow);
  static_assert(kQ % kWarpRows == 0 && kN % kStepN == 0 && kStepN % 16 == 0 && kD % 16 == 0,
                "tile sizes");
};

// Copies kRows rows into smem (pitch Tr::kPitch) with cp.async, for one tensor (Q) or two that
// share the row set (K and V). `row_src(row, a, b)` sets the rows' source pointers and returns
// false when the row is out of bounds (then zero-filled); columns past `dim_a` / `dim_b` are
// zero-filled too. Each row is copied by kTPR threads that take interleaved 16-byte chunks, so a
// row costs one coordinate / address computation per thread, adjacent lanes read adjacent chunks
// (whole 32-byte sectors) and the chunk loop runs on immediate offsets.
template <class Tr, int kRows, bool kTwo, class RowSrc>
__device__ __forceinline__ void copy_rows(typename Tr::Elem* dst_a, int dim_a, const void* fb_a,
                                          typename Tr::Elem* dst_b, int dim_b, const void* fb_b,
                                          RowSrc row_src) {
  using Elem = typename Tr::Elem;
  constexpr int kTPR = Tr::kThreads >= kRows ? Tr::kThreads / kRows : 1;
  constexpr int kRowsPerPass = Tr::kThreads / kTPR;
  constexpr int kPasses = kRows / kRowsPerPass;
  constexpr int kCPT = Tr::kChunks / kTPR;
  static_assert(kRows % kRowsPerPass == 0 && Tr::kChunks % kTPR == 0, "copy partition");
  const int sub = threadIdx.x % kTPR;
  const int r0 = threadIdx.x / kTPR;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = r0 + pass * kRowsPerPass;
    const Elem* src_a = nullptr;
    const Elem* src_b = nullptr;
    const bool ok = row_src(row, src_a, src_b);
    const uint32_t da = mma::smem_u32(dst_a + row * Tr::kPitch);
#pragma unroll
    for (int i = 0; i < kCPT; ++i) {
      const int ch = i * kTPR + sub;
      const bool v = ok && ch * Tr::kVec < dim_a;
      mma::cp_async_16(da + ch * 16, v ? src_a + ch * Tr::kVec : fb_a, v);
    }
    if constexpr (kTwo) {
      const uint32_t db = mma::smem_u32(dst_b + row * Tr::kPitch);
#pragma unroll
      for (int i = 0; i < kCPT; ++i) {
        const int ch = i * kTPR + sub;
        const bool v = ok && ch * Tr::kVec < dim_b;
        mma::cp_async_16(db + ch * 16, v ? src_b + ch * Tr::kVec : fb_b, v);
      }
    }
  }
}

// One float32 operand for the TF32 MMAs: rounded once (TF32) or split into big + small (F32).
template <class T>
__device__ __forceinline__ void tf32_operand(float x, uint32_t& big, uint32_t& small) {
  if constexpr (T::kSplit) {
    mma::split_tf32(x, big, small);
  } else {
    big = mma::to_tf32(x);
    small = 0;
  }
}

// d += a * b on the TF32 tensor cores; F32: the three products that matter of the split operands,
// small terms first.
template <class T>
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&as)[4], uint32_t b0, uint32_t b1,
                                         uint32_t bs0, uint32_t bs1) {
  if constexpr (T::kSplit) {
    mma::mma_1688_tf32(d, as, b0, b1);
    mma::mma_1688_tf32(d, a, bs0, bs1);
  }
  mma::mma_1688_tf32(d, a, b0, b1);
}

// float32 S = Q K^T for kStepN keys at sK: per 8-dim k-step, one ldmatrix.x4 per m-tile gives the
// A fragment (rows g, g + 8; dims t, t + 4) and one per 16 keys the B fragments of two n-tiles.
// Split TF32 from head dim 128 on sums the small cross products in their own accumulators: the
// rounding of the tensor cores' f32 accumulation, relative to |S|, then happens once per k-step
// instead of three times.
template <class Tr, class T>
__device__ __forceinline__ void scores_tf32(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                            const float* sQ, const float* sK, int row0, int lane) {
  constexpr int kN = Tr::kStepN, kMT = Tr::kMT;
  constexpr bool kLo = T::kSplit && Tr::kD >= 128;
  float lo[kLo ? kMT : 1][kLo ? kN / 8 : 1][4];
  if constexpr (kLo) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) lo[mt][j][i] = 0.f;
  }
  // The 16-bit lane patterns with their column offsets (0 or 8 elements = 16 bytes) as floats.
  const mma::LdsmOffset oa = mma::ldsm_a_addr(lane);
  const mma::LdsmOffset ob = mma::ldsm_b_nk_addr(lane);
  const float* qa = sQ + (row0 + oa.row) * Tr::kPitch + oa.col / 2;
  const float* kb = sK + ob.row * Tr::kPitch + ob.col / 2;
#pragma unroll
  for (int kk = 0; kk < Tr::kD / 8; ++kk) {
    uint32_t a[kMT][4], as[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      uint32_t r[4];
      mma::ldsm_x4(r, mma::smem_u32(qa + mt * 16 * Tr::kPitch + kk * 8));
#pragma unroll
      for (int i = 0; i < 4; ++i) tf32_operand<T>(__uint_as_float(r[i]), a[mt][i], as[mt][i]);
    }
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t r[4], b[4], bs[4];
      mma::ldsm_x4(r, mma::smem_u32(kb + j * 16 * Tr::kPitch + kk * 8));
#pragma unroll
      for (int i = 0; i < 4; ++i) tf32_operand<T>(__uint_as_float(r[i]), b[i], bs[i]);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kLo) {
          mma::mma_1688_tf32(lo[mt][2 * j], as[mt], b[0], b[1]);
          mma::mma_1688_tf32(lo[mt][2 * j], a[mt], bs[0], bs[1]);
          mma::mma_1688_tf32(s[mt][2 * j], a[mt], b[0], b[1]);
          mma::mma_1688_tf32(lo[mt][2 * j + 1], as[mt], b[2], b[3]);
          mma::mma_1688_tf32(lo[mt][2 * j + 1], a[mt], bs[2], bs[3]);
          mma::mma_1688_tf32(s[mt][2 * j + 1], a[mt], b[2], b[3]);
        } else {
          mma_tf32<T>(s[mt][2 * j], a[mt], as[mt], b[0], b[1], bs[0], bs[1]);
          mma_tf32<T>(s[mt][2 * j + 1], a[mt], as[mt], b[2], b[3], bs[2], bs[3]);
        }
      }
    }
  }
  if constexpr (kLo) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mt][j][i] += lo[mt][j][i];
  }
}

// float32 O += P V. The accumulators of n-tile kk hold P[g][2t], P[g][2t+1] (c0, c1) and the same
// of row g + 8 (c2, c3); taken as the A fragment of k-step kk with A column t = key 2t and column
// t + 4 = key 2t + 1 (a0 = c0, a1 = c2, a2 = c1, a3 = c3), no shuffle is needed, and V's B
// fragment is read in the same key order: b0 = V[2t][g], b1 = V[2t + 1][g]. The 8 lanes of one t
// read 8 consecutive floats of a row and 2t rows lie 8t banks apart (pitch = kD + 4, kD a multiple
// of 16), so the loads are free of bank conflicts.
template <class Tr, class T>
__device__ __forceinline__ void pv_tf32(FwdState<Tr>& st,
                                        const float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                        const float* sV, int lane) {
  constexpr int kN = Tr::kStepN, kMT = Tr::kMT;
  const float* vb = sV + 2 * (lane & 3) * Tr::kPitch + (lane >> 2);
#pragma unroll
  for (int kk = 0; kk < kN / 8; ++kk) {
    uint32_t a[kMT][4], as[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      tf32_operand<T>(s[mt][kk][0], a[mt][0], as[mt][0]);
      tf32_operand<T>(s[mt][kk][2], a[mt][1], as[mt][1]);
      tf32_operand<T>(s[mt][kk][1], a[mt][2], as[mt][2]);
      tf32_operand<T>(s[mt][kk][3], a[mt][3], as[mt][3]);
    }
#pragma unroll
    for (int jd = 0; jd < Tr::kD / 8; ++jd) {
      uint32_t b0, b1, bs0, bs1;
      tf32_operand<T>(vb[kk * 8 * Tr::kPitch + jd * 8], b0, bs0);
      tf32_operand<T>(vb[(kk * 8 + 1) * Tr::kPitch + jd * 8], b1, bs1);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma_tf32<T>(st.o[mt][jd], a[mt], as[mt], b0, b1, bs0, bs1);
    }
  }
}

// Keys [col0, col0 + kStepN) of one K/V tile: S = Q K^T, mask (kMasked), online softmax,
// O += P V.
template <class Tr, class T, class KT, bool kMasked, bool kBias>
__device__ __forceinline__ void fwd_step(FwdState<Tr>& st, const typename Tr::Elem* sQ,
                                         const typename Tr::Elem* sK,
                                         const typename Tr::Elem* sV, const KvTile& tile,
                                         const RowWindow* sWin, const BiasRows<Tr>& br,
                                         const FwdParams& p, int col0) {
  const int num_add = p.num_add;
  constexpr int kN = Tr::kStepN, kD = Tr::kD, kMT = Tr::kMT;
  sK += col0 * Tr::kPitch;
  sV += col0 * Tr::kPitch;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = warp * Tr::kWarpRows;
  float s[kMT][kN / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;

  if constexpr (Tr::kF32) {
    scores_tf32<Tr, T>(s, sQ, sK, row0, lane);
  } else {
    const mma::LdsmOffset oa = mma::ldsm_a_addr(lane);
    const mma::LdsmOffset ob = mma::ldsm_b_nk_addr(lane);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = st.qf[mt][kk][i];
        } else {
          mma::ldsm_x4(a[mt], mma::smem_u32(sQ + (row0 + mt * 16 + oa.row) * Tr::kPitch +
                                            kk * 16 + oa.col));
        }
      }
#pragma unroll
      for (int j = 0; j < kN / 16; ++j) {
        uint32_t b[4];
        mma::ldsm_x4(b, mma::smem_u32(sK + (j * 16 + ob.row) * Tr::kPitch + kk * 16 + ob.col));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma::mma_16816<T>(s[mt][2 * j], a[mt], b[0], b[1]);
          mma::mma_16816<T>(s[mt][2 * j + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  const bool guarded = kBias && p.rpb_front > 0;
  if constexpr (kBias)
    if (guarded) add_bias_guarded<Tr, KT>(s, tile, br, col0);
  if constexpr (kMasked) apply_mask<Tr, KT>(s, tile, sWin, num_add, col0);

  if constexpr (kBias) {
    const float sl2 = guarded ? p.scale_log2 : add_bias<Tr, KT, kMasked>(s, tile, br, p, col0);
    softmax_update<Tr, true>(st, s, sl2);  // a bias may make a row all -inf
  } else {
    softmax_update<Tr, kMasked>(st, s, p.scale_log2);
  }

  if constexpr (Tr::kF32) {
    pv_tf32<Tr, T>(st, s, sV, lane);
  } else {
    const mma::LdsmOffset ov = mma::ldsm_b_kn_addr(lane);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t p[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        p[mt][0] = mma::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        p[mt][1] = mma::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        p[mt][2] = mma::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        p[mt][3] = mma::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int jd = 0; jd < kD / 16; ++jd) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b,
                           mma::smem_u32(sV + (kk * 16 + ov.row) * Tr::kPitch + jd * 16 + ov.col));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma::mma_16816<T>(st.o[mt][2 * jd], p[mt], b[0], b[1]);
          mma::mma_16816<T>(st.o[mt][2 * jd + 1], p[mt], b[2], b[3]);
        }
      }
    }
  }
}

// kBias: the call has a relative positional bias (a separate instantiation, so that calls
// without one run the kernel as it is without the bias code).
template <class T, int kD, int kRank, int kMT, class QT, class KT, bool kBias>
__global__ void __launch_bounds__(FwdTraits<T, kD, kRank, kMT, QT, KT>::kThreads,
                                  FwdTraits<T, kD, kRank, kMT, QT, KT>::kMinBlocks)
    fna_fwd_kernel(const FwdParams p) {
  using Tr = FwdTraits<T, kD, kRank, kMT, QT, KT>;
  using Elem = typename Tr::Elem;
  constexpr int kFirst = Tr::kFirstAxis;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sKV = Tr::kQInRegs ? sQ : sQ + Tr::kQElems;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  FwdTile ft;
  if (!fwd_tile<QT>(p, blockIdx.x, ft)) return;  // this group is shorter than the largest one
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int hkv = ft.h / p.heads_per_kv;
  const Elem* gQ = static_cast<const Elem*>(p.q) + ft.b * p.q_stride[0] + ft.h * p.q_stride[4];
  const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
  const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];

  copy_rows<Tr, Tr::kQ, false>(sQ, p.dim, p.q, nullptr, 0, nullptr,
                               [&](int row, const Elem*& a, const Elem*&) {
                                 return q_row_src<QT, kFirst>(p, ft, gQ, row, a);
                               });
  mma::cp_async_commit();

  // The key-tile span lives in shared memory: it is read once per tile, and kept in registers it
  // would pin a dozen of them next to O for the whole loop.
  // The span (one axis per warp) and the rows' windows are computed side by side while Q loads.
  __shared__ KvSpan sSpan;
  kv_span_by_warps<QT, KT, Tr::kWarps>(geo, ft, sSpan, warp, lane);
  RowWindow* sWin = reinterpret_cast<RowWindow*>(smem_raw + Tr::kWinOffset);
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
    Elem* sK = sKV + (2 * buf) * Tr::kTileElems;
    Elem* sV = sK + Tr::kTileElems;
    if (t.add_begin < 0) {
      copy_rows<Tr, Tr::kN, true>(
          sK, p.dim, p.k, sV, p.dim_v, p.v, [&](int row, const Elem*& k, const Elem*& v) {
            return kv_row_src<KT, kFirst>(p, gr, t, gK, gV, row, k, v);
          });
    } else {
      copy_rows<Tr, Tr::kN, true>(
          sK, p.dim, p.add_k, sV, p.dim_v, p.add_v, [&](int row, const Elem*& k, const Elem*& v) {
            return add_row_src(p, ft.b, hkv, t, row, k, v);
          });
    }
  };

  FwdState<Tr> st;
  init_state(st);
  const int row0 = warp * Tr::kWarpRows;
  if constexpr (kBias) bias_rows<Tr, QT>(p, ft, row0, br);

  if constexpr (Tr::kQInRegs) {
    // Q to registers first: its staging area is about to hold K/V.
    mma::cp_async_wait<0>();
    __syncthreads();
    const mma::LdsmOffset oa = mma::ldsm_a_addr(lane);
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        mma::ldsm_x4(st.qf[mt][kk], mma::smem_u32(sQ + (row0 + mt * 16 + oa.row) * Tr::kPitch +
                                                  kk * 16 + oa.col));
    __syncthreads();
  }
  load_kv(cur, 0);
  mma::cp_async_commit();


  // One barrier per tile: once every warp has passed it, tile `it` has landed for all and every
  // warp has finished tile it - 1, so its buffer can take tile it + 1 while `it` is computed.
  for (int it = 0; it < n_tiles; ++it) {
    mma::cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_tiles) {
      load_kv(kv_tile_next<Tr, KT>(span, n_nbr, cur, it), (it + 1) & 1);
      mma::cp_async_commit();
    }
    const KvTile t = cur;
    const Elem* sK = sKV + (2 * (it & 1)) * Tr::kTileElems;
    const Elem* sV = sK + Tr::kTileElems;
    if (t.inside) {
#pragma unroll
      for (int c0 = 0; c0 < Tr::kN; c0 += Tr::kStepN)
        fwd_step<Tr, T, KT, false, kBias>(st, sQ, sK, sV, t, sWin, br, p, c0);
    } else {
#pragma unroll
      for (int c0 = 0; c0 < Tr::kN; c0 += Tr::kStepN)
        fwd_step<Tr, T, KT, true, kBias>(st, sQ, sK, sV, t, sWin, br, p, c0);
    }
    cur = kv_tile_next<Tr, KT>(span, n_nbr, cur, it);
  }
  store_output<Tr, T, QT>(st, p, ft, row0, lane);
}

template <class T, int kD, int kRank, int kMT, class QT, class KT>
size_t fwd_smem_bytes() {
  return FwdTraits<T, kD, kRank, kMT, QT, KT>::kSmemBytes;
}

template <class T, int kD, int kRank, int kMT, class QT, class KT>
cudaError_t launch_fwd(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  using Tr = FwdTraits<T, kD, kRank, kMT, QT, KT>;
  auto kernel = p.rpb != nullptr ? fna_fwd_kernel<T, kD, kRank, kMT, QT, KT, true>
                                 : fna_fwd_kernel<T, kD, kRank, kMT, QT, KT, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p);
  return cudaGetLastError();
}

// Instantiates one row of configs/forward.h's mma.sync tables (the build's generated files expand it).
#define FNA_FWD_INSTANTIATE(R, D, Q0, Q1, Q2, K0, K1, K2, MT, DT)                          \
  template cudaError_t launch_fwd<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>( \
      const FwdParams&, const FwdLaunch&, cudaStream_t);                                  \
  template size_t fwd_smem_bytes<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>();

}  // namespace fused
}  // namespace fna
