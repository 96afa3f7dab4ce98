// The pieces of the Hopper (wgmma, sm_90a) forward shared by its plain kernel (fwd_sm90.cuh) and
// its warp-specialized kernel (fwd_sm90_ws.cuh): the tile traits, the swizzled row copies, the
// two GEMMs' issue and the per-tile step (fwd_sm90.cuh describes the algorithm).
#pragma once


#include <cstdlib>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/runtime.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/fused/kernel/common/fwd_bias.cuh"
#include "cuda/fused/kernel/common/fwd_common.cuh"

namespace fna {
namespace fused {

template <class T, int kD_, int kRank_, class QT, class KT>
struct Sm90Traits {
  using Elem = typename T::type;
  static constexpr bool kF32 = false;
  static constexpr int kVec = 8;
  static constexpr int kD = kD_;
  static constexpr int kRank = kRank_;
  static constexpr int kFirstAxis = kAxes - kRank;
  static constexpr int kQ = QT::kSize;
  static constexpr int kN = KT::kSize;
  // The sm_80 kernel's names for the per-warp view (FwdState, apply_mask, softmax_update).
  static constexpr int kMT = 1;
  static constexpr int kWarpRows = 16;
  static constexpr int kStepN = kN;
  static constexpr bool kQInRegs = false;
  static constexpr int kWarps = kQ / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  static constexpr int kQBytes = kQ * kD * 2;
  static constexpr int kTileBytes = kN * kD * 2;
  static constexpr int kWinOffset = kQBytes + 4 * kTileBytes;  // K, V double buffered
  // 1024 bytes of slack: the swizzle pattern repeats every 1024 bytes, so regions start aligned.
  static constexpr size_t kSmemBytes = 1024 + size_t(kWinOffset) + size_t(kQ) * sizeof(RowWindow);
  // As many CTAs per SM as the SM's 228 KiB of shared memory hold (1 KiB reserved per CTA), at
  // most 4 and with at least 128 registers per thread (S, O and P need them): one CTA's barrier
  // and softmax then overlap the others' MMAs. The launch bound makes the compiler fit the
  // registers to that.
  static constexpr int kBySmem = int((228 * 1024) / (kSmemBytes + 1024));
  static constexpr int kByThreads = 65536 / (kThreads * 128);
  static constexpr int kMinBlocks0 = kBySmem < kByThreads ? kBySmem : kByThreads;
  static constexpr int kMinBlocks = kMinBlocks0 > 4 ? 4 : (kMinBlocks0 < 1 ? 1 : kMinBlocks0);
  // Head dim 256 only in the warp-specialized kernel (fwd_sm90_ws.cuh: O takes 128 registers of
  // a compute thread, and Q with two K / V stages 192 KiB).
  static_assert(kQ % 64 == 0 && (kD == 64 || kD == 128 || kD == 256) && (kN == 64 || kN == 128),
                "sm90 tile sizes");
};

// Threads per row for kThr threads copying kRows rows: as many as there are threads per row, and
// more when the rows do not split evenly into passes (192 rows by 128 threads: 2 per row, 3 passes).
constexpr int copy_threads_per_row(int rows, int threads) {
  int tpr = threads >= rows ? threads / rows : 1;
  while (tpr < threads && rows % (threads / tpr) != 0) tpr *= 2;
  return tpr;
}

// copy_rows (fwd_sm80.cuh) into the 128-byte-swizzled layout: row r's chunk c of region c / 8
// (64 columns) lands at region + r * 128 + ((c % 8) ^ (r % 8)) * 16. `kThr` threads copy, `tid`
// being this thread's number among them. Each row's source is computed by its kTPR threads;
// they copy its chunks kTPR apart, or with kSpread (the plan's `spread`, Tuning::fwd_spread) each warp instruction
// copies whole rows, a row's chunks on consecutive lanes with the row's address shuffled from
// its first thread (every lane of the warp must take part).
template <class Tr, int kRows, bool kTwo, int kThr, class RowSrc, bool kSpread = false>
__device__ __forceinline__ void copy_rows_sw(int tid, uint32_t dst_a, int dim_a, const void* fb_a,
                                             uint32_t dst_b, int dim_b, const void* fb_b,
                                             RowSrc row_src) {
  using Elem = typename Tr::Elem;
  constexpr int kTPR = copy_threads_per_row(kRows, kThr);
  constexpr int kRowsPerPass = kThr / kTPR;
  constexpr int kPasses = kRows / kRowsPerPass;
  constexpr int kCPT = Tr::kChunks / kTPR;
  constexpr uint32_t kRegion = kRows * 128;
  static_assert(kRows % kRowsPerPass == 0 && Tr::kChunks % kTPR == 0, "copy partition");
  static_assert(!kSpread || (32 % Tr::kChunks == 0 && kThr % 32 == 0 && 32 % kTPR == 0),
                "spread copies");
  const int sub = tid % kTPR;
  const int r0 = tid / kTPR;
  const int lane = tid & 31;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = r0 + pass * kRowsPerPass;
    const Elem* src_a = nullptr;
    const Elem* src_b = nullptr;
    const bool ok = row_src(row, src_a, src_b);
#pragma unroll
    for (int i = 0; i < kCPT; ++i) {
      // The chunk this thread copies: of its own row, kTPR apart, or (kSpread) chunk lane % kChunks
      // of the warp's row lr, whose source comes from that row's first thread.
      int r = row, ch = i * kTPR + sub;
      const Elem* a = src_a;
      const Elem* b = src_b;
      bool in = ok;
      if constexpr (kSpread) {
        const int lr = i * (32 / Tr::kChunks) + lane / Tr::kChunks;
        const int from = lr * kTPR;
        r = (tid & ~31) / kTPR + pass * kRowsPerPass + lr;
        ch = lane % Tr::kChunks;
        a = reinterpret_cast<const Elem*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src_a), from));
        if constexpr (kTwo)
          b = reinterpret_cast<const Elem*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src_b), from));
        in = __shfl_sync(0xffffffffu, int(ok), from) != 0;
      }
      const uint32_t off =
          (ch >> 3) * kRegion + uint32_t(r) * 128 + uint32_t(((ch & 7) ^ (r & 7)) << 4);
      const bool v = in && ch * Tr::kVec < dim_a;
      mma::cp_async_16(dst_a + off, v ? a + ch * Tr::kVec : fb_a, v);
      if constexpr (kTwo) {
        const bool vb = in && ch * Tr::kVec < dim_b;
        mma::cp_async_16(dst_b + off, vb ? b + ch * Tr::kVec : fb_b, vb);
      }
    }
  }
}

// The CTA's query tile into sQ (swizzled), by kThr threads (`tid` this one's number among them).
template <class Tr, class QT, int kThr, bool kSpread = false>
__device__ __forceinline__ void copy_q_tile(int tid, const FwdParams& p, const FwdTile& ft,
                                            uint32_t sQ) {
  using Elem = typename Tr::Elem;
  const Elem* gQ = static_cast<const Elem*>(p.q) + ft.b * p.q_stride[0] + ft.h * p.q_stride[4];
  auto src = [&](int row, const typename Tr::Elem*& a, const typename Tr::Elem*&) {
    return q_row_src<QT, Tr::kFirstAxis>(p, ft, gQ, row, a);
  };
  copy_rows_sw<Tr, Tr::kQ, false, kThr, decltype(src), kSpread>(tid, sQ, p.dim, p.q, 0, 0,
                                                                nullptr, src);
}

// Key/value tile `t` (neighborhood or additional keys) into sK / sV, by kThr threads; gK / gV are
// the (batch, kv head) bases of K and V.
template <class Tr, class KT, int kThr, bool kSpread = false>
__device__ __forceinline__ void copy_kv_tile(int tid, const FwdParams& p, const FwdTile& ft,
                                             int hkv, const KvTile& t,
                                             const typename Tr::Elem* gK,
                                             const typename Tr::Elem* gV, uint32_t sK,
                                             uint32_t sV) {
  using Elem = typename Tr::Elem;
  if (t.add_begin < 0) {
    auto src = [&](int row, const Elem*& k, const Elem*& v) {
      return kv_row_src<KT, Tr::kFirstAxis>(p, ft.gr, t, gK, gV, row, k, v);
    };
    copy_rows_sw<Tr, Tr::kN, true, kThr, decltype(src), kSpread>(tid, sK, p.dim, p.k, sV,
                                                                 p.dim_v, p.v, src);
  } else {
    copy_rows_sw<Tr, Tr::kN, true, kThr>(tid, sK, p.dim, p.add_k, sV, p.dim_v, p.add_v,
                                         [&](int row, const Elem*& k, const Elem*& v) {
                                           return add_row_src(p, ft.b, hkv, t, row, k, v);
                                         });
  }
}

// Only K (kWhich 0) or only V (1) of key/value tile `t` into `dst`, as copy_kv_tile copies both:
// the warp-specialized kernel's two-stage ring (head dim 256) hands back K's and V's buffers
// separately.
template <class Tr, class KT, int kThr, int kWhich>
__device__ __forceinline__ void copy_kv_half(int tid, const FwdParams& p, const FwdTile& ft,
                                             int hkv, const KvTile& t,
                                             const typename Tr::Elem* gK,
                                             const typename Tr::Elem* gV, uint32_t dst) {
  using Elem = typename Tr::Elem;
  const int dim = kWhich == 0 ? p.dim : p.dim_v;
  if (t.add_begin < 0) {
    auto src = [&](int row, const Elem*& a, const Elem*&) {
      const Elem* k = nullptr;
      const Elem* v = nullptr;
      const bool ok = kv_row_src<KT, Tr::kFirstAxis>(p, ft.gr, t, gK, gV, row, k, v);
      a = kWhich == 0 ? k : v;
      return ok;
    };
    copy_rows_sw<Tr, Tr::kN, false, kThr>(tid, dst, dim, kWhich == 0 ? p.k : p.v, 0, 0, nullptr,
                                          src);
  } else {
    auto src = [&](int row, const Elem*& a, const Elem*&) {
      const Elem* k = nullptr;
      const Elem* v = nullptr;
      const bool ok = add_row_src(p, ft.b, hkv, t, row, k, v);
      a = kWhich == 0 ? k : v;
      return ok;
    };
    copy_rows_sw<Tr, Tr::kN, false, kThr>(tid, dst, dim, kWhich == 0 ? p.add_k : p.add_v, 0, 0,
                                          nullptr, src);
  }
}

// TMA copies (docs/design.md "TMA loads"; one thread issues them, the caller sets the barrier's
// expected bytes). One box of map `m` whose first row lies at global grid coordinate `og` (batch
// b, head h): the head dim's 64-column blocks kRows * 128 bytes apart from `dst`, completing on
// `bar`.
template <class Tr, int kRows>
__device__ __forceinline__ void tma_box(const tma::TokenMap& m, int b, const int (&og)[kAxes],
                                        int h, uint32_t dst, uint32_t bar) {
  int c[4];
  tma::box_coords(m, b, og, h, c);
#pragma unroll
  for (int cb = 0; cb < Tr::kD / 64; ++cb) tma::load_box(dst + cb * kRows * 128, m, 64 * cb, c, bar);
}

// The CTA's query-tile rows of map `m` (Q, or the dQ role's dO: maps that span the query region,
// so coordinates start at its first row) into `dst`, as kParts boxes of 64 rows (the map's box),
// warpgroup w's rows from the w-th.
template <class Tr, class QT, int kParts>
__device__ __forceinline__ void tma_query_tile(const tma::TokenMap& m, const FwdParams& p,
                                               const FwdTile& ft, uint32_t dst, uint32_t bar) {
  constexpr int kQExt[kAxes] = {QT::kExt[0], QT::kExt[1], QT::kExt[2]};
  constexpr int kPartAxis = part_axis(kQExt, kParts);
  static_assert(kPartAxis >= 0, "query tile in warpgroup boxes");
  constexpr int kPartExt = kQExt[kPartAxis] / kParts;
#pragma unroll
  for (int w = 0; w < kParts; ++w) {
    int og[kAxes];
#pragma unroll
    for (int a = 0; a < kAxes; ++a)
      og[a] = ft.gr.global(p.geo, a, ft.qo[a] + (a == kPartAxis ? w * kPartExt : 0)) - p.qlo[a];
    tma_box<Tr, Tr::kQ>(m, ft.b, og, ft.h, dst + w * 64 * 128, bar);
  }
}

// The global coordinate of key tile `t`'s first row (neighborhood keys: the maps exist only
// without additional keys).
__device__ __forceinline__ void kv_tile_origin(const FwdParams& p, const FwdTile& ft,
                                               const KvTile& t, int (&og)[kAxes]) {
#pragma unroll
  for (int a = 0; a < kAxes; ++a) og[a] = ft.gr.global(p.geo, a, t.origin[a]);
}

// Key / value tile `t` into sK / sV by TMA, both completing on `bar` (arrived on with their bytes).
template <class Tr>
__device__ __forceinline__ void tma_kv_tile(const FwdTma& tm, const FwdParams& p,
                                            const FwdTile& ft, int hkv, const KvTile& t,
                                            uint32_t sK, uint32_t sV, uint32_t bar) {
  tma::arrive_expect_tx(bar, 2 * Tr::kTileBytes);
  int og[kAxes];
  kv_tile_origin(p, ft, t, og);
  tma_box<Tr, Tr::kN>(tm.k, ft.b, og, hkv, sK, bar);
  tma_box<Tr, Tr::kN>(tm.v, ft.b, og, hkv, sV, bar);
}

// S = Q K^T for one warpgroup's 64 rows (sQw) and one key tile (sK), issued and committed as one
// wgmma group; the caller waits. kPreloaded: S += Q K^T onto the caller's values (a bias).
template <class Tr, class T, bool kPreloaded = false>
__device__ __forceinline__ void issue_s(float (&s)[1][Tr::kN / 8][4], uint32_t sQw, uint32_t sK) {
  constexpr int kN = Tr::kN, kD = Tr::kD;
  using MmaS = wgmma::Mma<T, kN>;
  // Descriptors: the k-step's offset only changes the start address field (16-byte units).
  const uint64_t dq = wgmma::desc_sw128(sQw, 16, 1024);
  const uint64_t dk = wgmma::desc_sw128(sK, 16, 1024);
  if constexpr (!kPreloaded)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
  wgmma::fence_operands(s[0]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    MmaS::ss(s[0], dq + ((kk >> 2) * (Tr::kQ * 128) + (kk & 3) * 32) / 16,
             dk + ((kk >> 2) * (kN * 128) + (kk & 3) * 32) / 16, 1);
  wgmma::commit();
  wgmma::fence_operands(s[0]);
}

// P (the softmax'd scores) packed as the register A operand of every k-step of P V; done before
// the first MMA is issued (packing between MMAs would make the compiler serialize them).
template <class Tr, class T>
__device__ __forceinline__ void pack_p(const float (&s)[1][Tr::kN / 8][4],
                                       uint32_t (&a)[Tr::kN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < Tr::kN / 16; ++kk) {
    a[kk][0] = mma::pack2<T>(s[0][2 * kk][0], s[0][2 * kk][1]);
    a[kk][1] = mma::pack2<T>(s[0][2 * kk][2], s[0][2 * kk][3]);
    a[kk][2] = mma::pack2<T>(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
    a[kk][3] = mma::pack2<T>(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
  }
}

// O += P V (V read transposed from the swizzled tile at sV), issued and committed as one group;
// the caller waits (P's registers stay in use until then).
template <class Tr, class T>
__device__ __forceinline__ void issue_pv(FwdState<Tr>& st, uint32_t (&a)[Tr::kN / 16][4],
                                         uint32_t sV) {
  // Head dim 256 as two n128 halves: the second reads V's columns 128.. from its third
  // 64-column region.
  constexpr int kNO = Tr::kD > 128 ? 128 : Tr::kD;
  using MmaO = wgmma::Mma<T, kNO>;
  const uint64_t dv = wgmma::desc_sw128(sV, Tr::kN * 128, 1024);
  wgmma::fence_operands(st.o[0]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kN / 16; ++kk)
#pragma unroll
    for (int h = 0; h < Tr::kD / kNO; ++h)
      MmaO::rs(*reinterpret_cast<float(*)[kNO / 8][4]>(&st.o[0][h * (kNO / 8)][0]), a[kk],
               dv + (h * (kNO / 64) * Tr::kN * 128 + kk * 16 * 128) / 16, 1);
  wgmma::commit();
  wgmma::fence_operands(st.o[0]);
  wgmma::fence_operands(a);
}

// The plain kernel's tile end: P packed from the softmax'd S (or dS), O += P V (V, or K for dQ,
// read transposed from sV), waited for.
template <class Tr, class T>
__device__ __forceinline__ void pv_and_wait(FwdState<Tr>& st, const float (&s)[1][Tr::kN / 8][4],
                                            uint32_t sV) {
  uint32_t a[Tr::kN / 16][4];
  pack_p<Tr, T>(s, a);
  issue_pv<Tr, T>(st, a, sV);
  wgmma::wait<0>();
  wgmma::fence_operands(st.o[0]);
  wgmma::fence_operands(a);
}

// One key/value tile for one warpgroup: S = Q K^T, mask, bias, online softmax, O += P V.
template <class Tr, class T, class KT, bool kMasked, bool kBias>
__device__ __forceinline__ void sm90_step(FwdState<Tr>& st, uint32_t sQw, uint32_t sK,
                                          uint32_t sV, const KvTile& tile, const RowWindow* sWin,
                                          const BiasRows<Tr>& br, const FwdParams& p) {
  float s[1][Tr::kN / 8][4];
  issue_s<Tr, T>(s, sQw, sK);
  wgmma::wait<0>();
  wgmma::fence_operands(s[0]);
  const bool guarded = kBias && p.rpb_front > 0;
  if constexpr (kBias)
    if (guarded) add_bias_guarded<Tr, KT>(s, tile, br, 0);
  if constexpr (kMasked) apply_mask<Tr, KT>(s, tile, sWin, p.num_add, 0);
  if constexpr (kBias) {
    const float sl2 = guarded ? p.scale_log2 : add_bias<Tr, KT, kMasked>(s, tile, br, p, 0);
    softmax_update<Tr, true>(st, s, sl2);  // a bias may make a row all -inf
  } else {
    softmax_update<Tr, kMasked>(st, s, p.scale_log2);
  }
  pv_and_wait<Tr, T>(st, s, sV);
}

// sm90_step with the bias by key-tile slices (FwdParams::rpb_tiles): S starts from the tile's
// slice (bias_preload: the last one filled), then the mask and the softmax as without a bias
// (which may make a row all -inf).
template <class Tr, class T, class KT, bool kMasked, class BS>
__device__ __forceinline__ void sm90_step_tiles(FwdState<Tr>& st, uint32_t sQw, uint32_t sK,
                                                uint32_t sV, const KvTile& tile,
                                                const RowWindow* sWin, const BiasTiles<Tr, BS>& bt,
                                                const FwdParams& p) {
  float s[1][Tr::kN / 8][4];
  bias_preload<Tr, KT, BS>(s, tile, bt.row, bt.n - 1);
  issue_s<Tr, T, true>(s, sQw, sK);
  wgmma::wait<0>();
  wgmma::fence_operands(s[0]);
  if constexpr (kMasked) apply_mask<Tr, KT>(s, tile, sWin, p.num_add, 0);
  softmax_update<Tr, true>(st, s, p.scale_log2);
  pv_and_wait<Tr, T>(st, s, sV);
}

}  // namespace fused
}  // namespace fna
