// The relative positional bias of the fused forward (ProblemBlock::rpb): the staged copy of a
// head's table in shared memory, the thread's rows' offsets into the table, and the bias of one
// step's scores, for the tiled kernels (fwd_sm80.cuh, fwd_sm90.cuh, fwd_sm90_ws.cuh) on the
// per-warp accumulator layout of fwd_common.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/bias_stage.h"
#include "cuda/fused/kernel/common/fwd_common.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"

namespace fna {
namespace fused {

// Relative positional bias (ProblemBlock::rpb). The table is read either in global memory (dense,
// run-time strides ProblemBlock::rpb_stride) or, staged (FwdParams::rpb_staged), from a copy in
// shared memory divided by the scale, laid out with compile-time strides stage_stride (lifted
// axes 0, 1, 2: 1024, 32, 1), so that every score's entry sits at a constant offset from its
// row's base address. The thread's rows (two per m-tile) each hold the offset of local key
// coordinates 0 in the table, sum_a (K_a - 1 - q_a) * stride_a, and whether the CTA stores the
// row (rows past the group or outside the query region read nothing: their keys may lie outside
// the table).
template <class Tr>
struct BiasRows {
  const float* tab;    // global: the head's table; null: staged
  uint32_t sbase;      // staged: the copy's shared-memory address
  int off[Tr::kMT][2];
  bool ok[Tr::kMT][2];
};

// FwdParams::rpb_staged: the CTA's head table divided by the scale into shared memory at `dst`
// in the staged layout (every thread of the CTA; the caller's next barrier publishes it). Fills
// `br`'s table fields.
template <class Tr>
__device__ __forceinline__ void stage_bias(const FwdParams& p, int h, float* dst,
                                           BiasRows<Tr>& br) {
  const float* src = p.rpb + h * p.rpb_stride[0];
  br.tab = p.rpb_staged ? nullptr : src;
  dst += p.rpb_front;  // the table's origin (after its front guard, if any)
  br.sbase = mma::smem_u32(dst);
  if (!p.rpb_staged) return;
  const int n0 = 2 * p.geo.axis[0].kernel - 1, n1 = 2 * p.geo.axis[1].kernel - 1;
  const int n2 = 2 * p.geo.axis[2].kernel - 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int row = warp; row < n0 * n1; row += Tr::kThreads / 32) {
    const int i0 = row / n1, i1 = row - i0 * n1;
    const float* s = src + i0 * p.rpb_stride[1] + i1 * p.rpb_stride[2];
    float* d = dst + i0 * stage_stride(0) + i1 * stage_stride(1);
    for (int i2 = lane; i2 < n2; i2 += 32) d[i2] = __ldg(s + i2) * p.rpb_inv_scale;
  }
}

// The rows of the warp starting at tile row `row0` (the FwdState layout).
template <class Tr, class QT>
__device__ __forceinline__ void bias_rows(const FwdParams& p, const FwdTile& ft, int row0,
                                          BiasRows<Tr>& br) {
  const int lane = threadIdx.x & 31;
  const bool staged = p.rpb_staged != 0;
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int q[kAxes];
      QT::coord(row0 + mt * 16 + (lane >> 2) + 8 * r, q);
      bool ok = true;
      int off = 0;
#pragma unroll
      for (int ax = Tr::kFirstAxis; ax < kAxes; ++ax) {
        q[ax] += ft.qo[ax];
        ok = ok && q[ax] >= ft.qlo[ax] && q[ax] < ft.qhi[ax];
        off += (p.geo.axis[ax].kernel - 1 - q[ax]) * (staged ? stage_stride(ax) : p.rpb_stride[1 + ax]);
      }
      br.off[mt][r] = off;
      br.ok[mt][r] = ok;
    }
}

// Calls f(x, mt, r, coff) for each of this thread's scores x of one step (keys [col0, col0 +
// kStepN) of the key tile; rows r of m-tile mt): coff is the key's offset from the tile's
// origin, plus the thread's fast-axis columns 2 (lane % 4) where the fast axis is 8k (then
// folded into `base`, which the caller adds to its rows), in a table with strides stride(ax) and
// unit stride on the last axis. With compile-time strides every coff is a constant.
template <class Tr, class KT, class Stride, class F>
__device__ __forceinline__ void for_bias_scores(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                                const KvTile& tile, int col0, Stride stride,
                                                int& base, F f) {
  constexpr bool kFast8 = KT::kExt[kAxes - 1] % 8 == 0;
  const int t2 = 2 * (threadIdx.x & 3);
  base = tile.origin[kAxes - 1] + (kFast8 ? t2 : 0);
#pragma unroll
  for (int ax = Tr::kFirstAxis; ax < kAxes - 1; ++ax) base += tile.origin[ax] * stride(ax);
#pragma unroll
  for (int j = 0; j < Tr::kStepN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      int c[kAxes];
      if constexpr (kFast8) {
        KT::coord(col0 + j * 8, c);  // compile-time; t2 + e is on the fast axis
        c[kAxes - 1] += e;
      } else {
        KT::coord(col0 + j * 8 + t2 + e, c);
      }
      int coff = c[kAxes - 1];
#pragma unroll
      for (int ax = Tr::kFirstAxis; ax < kAxes - 1; ++ax) coff += c[ax] * stride(ax);
#pragma unroll
      for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) f(s[mt][j][2 * r + e], mt, r, coff);
    }
  }
}

// The staged copy's entry at shared-memory address `addr` (volatile: never speculated ahead of
// the caller's test, whose false may mean an address outside the copy).
__device__ __forceinline__ float staged_entry(uint32_t addr) {
  float b;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(b) : "r"(addr));
  return b;
}

// FwdParams::rpb_front > 0: the staged bias of one step's scores, added before the mask without a
// test per score (the guard zones hold every pair's address; the mask then overwrites the scores
// it removes, whatever they read, and rows the CTA does not store are never stored). Additional
// keys have no bias. The caller's softmax keeps scale_log2.
template <class Tr, class KT>
__device__ __forceinline__ void add_bias_guarded(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                                 const KvTile& tile, const BiasRows<Tr>& br,
                                                 int col0) {
  if (tile.add_begin >= 0) return;
  int base = 0;
  auto add = [&](float& x, int mt, int r, int coff) {
    x += staged_entry(br.sbase + 4u * uint32_t(br.off[mt][r] + base + coff));
  };
  for_bias_scores<Tr, KT>(s, tile, col0, [](int ax) { return stage_stride(ax); }, base, add);
}

// The bias of one step's scores (keys [col0, col0 + kStepN) of `tile`), returning the scale the
// caller's softmax_update then applies. Staged (the copy holds bias / scale): s += it, and the
// scale stays scale_log2. Global: s = s * scale_log2 + bias * log2(e), logits in the softmax's
// log2 units, and the scale is 1. kMasked: scores the mask set to -inf read no bias (their index
// may lie outside the table); in tiles inside every window only rows the CTA does not store are
// skipped. Additional keys have no bias.
template <class Tr, class KT, bool kMasked>
__device__ __forceinline__ float add_bias(float (&s)[Tr::kMT][Tr::kStepN / 8][4],
                                          const KvTile& tile, const BiasRows<Tr>& br,
                                          const FwdParams& p, int col0) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float sl2 = p.scale_log2;
  const bool staged = br.tab == nullptr;
  if (tile.add_begin >= 0) {
    if (staged) return sl2;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
      for (int j = 0; j < Tr::kStepN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mt][j][i] *= sl2;
    return 1.f;
  }
  int base = 0;
  auto use = [&](float x, int mt, int r) {
    return br.ok[mt][r] && (!kMasked || x != -INFINITY);
  };
  if (staged) {
    auto add = [&](float& x, int mt, int r, int coff) {
      if (use(x, mt, r))
        x += staged_entry(br.sbase + 4u * uint32_t(br.off[mt][r] + base + coff));
    };
    for_bias_scores<Tr, KT>(s, tile, col0, [](int ax) { return stage_stride(ax); }, base, add);
    return sl2;
  }
  auto stride = [&](int ax) { return p.rpb_stride[1 + ax]; };
  auto add = [&](float& x, int mt, int r, int coff) {
    const float b = use(x, mt, r) ? __ldg(br.tab + (br.off[mt][r] + base + coff)) : 0.f;
    x = fmaf(b, kLog2e, x * sl2);
  };
  for_bias_scores<Tr, KT>(s, tile, col0, stride, base, add);
  return 1.f;
}

// The bias by key-tile slices (the warp-specialized forward, fwd_sm90_ws.cuh; the plain one at
// rank 3, FwdParams::rpb_tiles): per key tile and compute warpgroup, the part of the head's table
// the warpgroup's 64 rows and the tile's keys can address, divided by the scale, is copied into
// one of two buffers of the warpgroup's in shared memory (BiasSlice), and the tile's scores
// start from it: S = Q K^T + bias / scale, the bias preloaded into the MMA's accumulators
// (bias_preload), so a score costs one shared load at a constant offset from its row's and no
// add, test or global load. A warpgroup's rows are a box of wge(a) queries per axis and a key
// tile a box of KT's, so a pair's relative position k - q + K - 1 along axis a spans
// wge(a) + kv(a) - 1 values over the tile: the slice. Entries outside the table (pairs no window
// holds, which the mask removes) read 0. In the warp-specialized kernel the loader warpgroup
// copies the slices (bias_copy) ahead of the compute warpgroups, behind a full / empty mbarrier
// pair per buffer; the plain kernel's compute threads fill the next tile's slice after each tile
// (bias_fill), published by its per-tile __syncthreads.
template <class Tr, class QT, class KT, int kParts>
struct BiasSlice {
  static constexpr int kQExt[kAxes] = {QT::kExt[0], QT::kExt[1], QT::kExt[2]};
  static constexpr int kPartAxis = part_axis(kQExt, kParts);
  static_assert(kPartAxis >= 0, "query tile in warpgroup boxes");
  // (Scalars, not arrays: device code folds them.)
  static constexpr int kQ0 = QT::kExt[0], kQ1 = QT::kExt[1], kQ2 = QT::kExt[2];
  static constexpr int kK0 = KT::kExt[0], kK1 = KT::kExt[1], kK2 = KT::kExt[2];
  FNA_HD static constexpr int qext(int a) { return a == 0 ? kQ0 : (a == 1 ? kQ1 : kQ2); }
  FNA_HD static constexpr int kext(int a) { return a == 0 ? kK0 : (a == 1 ? kK1 : kK2); }
  FNA_HD static constexpr int wge(int a) { return a == kPartAxis ? qext(a) / kParts : qext(a); }
  FNA_HD static constexpr int ext(int a) { return wge(a) + kext(a) - 1; }
  FNA_HD static constexpr int stride(int a) {
    return a == 2 ? 1 : (a == 1 ? ext(2) : ext(1) * ext(2));
  }
  static constexpr int kFloats = bias_slice_floats(wge(0), wge(1), wge(2), kK0, kK1, kK2);
  static constexpr int kPitch = (kFloats + 3) / 4 * 4;  // floats per buffer (16-byte multiple)
  static constexpr size_t kBytes = bias_slice_bytes(kFloats, kParts);
  // The key tile's fast axis a multiple of 8 keys: a thread's columns 2 (lane % 4) + 0, 1 of
  // each 8 then lie on it, so its scores' entries sit at constant offsets from its row's.
  static_assert(kK2 % 8 == 0, "key tiles of 8k keys on the fast axis");
  // A thread's second row (8 rows after its first, in a warp's 16 consecutive rows) is 8 keys on
  // along a fast axis of 16k queries, or the next row of a fast axis of 8 (an even number of
  // them): its slice offset is kRowDelta from the first's.
  static_assert(kQ2 % 16 == 0 || (kQ2 == 8 && kQ1 % 2 == 0), "rows 8 apart one step apart");
  static constexpr int kRowDelta = kQ2 % 16 == 0 ? -8 : -stride(1);
};

// Where a warpgroup's slices come from (per CTA tile): the table offset of the warpgroup's slice
// origin less the key tile's origin, and per axis of the problem's rank K_a - 1 less the
// warpgroup box's last query.
struct BiasSrc {
  int hbase;
  int rel0[kAxes];
};

template <class Tr, class BS>
__device__ __forceinline__ BiasSrc bias_src(const FwdParams& p, const FwdTile& ft, int wg) {
  BiasSrc src;
  src.hbase = ft.h * p.rpb_stride[0];
#pragma unroll
  for (int a = 0; a < kAxes; ++a) src.rel0[a] = 0;
#pragma unroll
  for (int a = Tr::kFirstAxis; a < kAxes; ++a) {
    const int wgo = a == BS::kPartAxis ? wg * BS::wge(a) : 0;
    src.rel0[a] = p.geo.axis[a].kernel - 1 - (ft.qo[a] + wgo + BS::wge(a) - 1);
    src.hbase += src.rel0[a] * p.rpb_stride[1 + a];
  }
  return src;
}

// The address of a compute thread's first row (warpgroup `wg`, tile row `row0` of its warp: the
// FwdState layout, rows row0 + lane / 4 and + 8) in its warpgroup's first buffer `buf`, its
// fast-axis columns 2 (lane % 4) included (BiasSlice: 8k keys on that axis); its second row is a
// constant kRowDelta entries away.
template <class Tr, class QT, class BS>
__device__ __forceinline__ uint32_t bias_row(int wg, int row0, uint32_t buf) {
  const int lane = threadIdx.x & 31;
  int q[kAxes];
  QT::coord(row0 + (lane >> 2), q);
  int off = 0;
#pragma unroll
  for (int a = Tr::kFirstAxis; a < kAxes; ++a) {
    const int ql = q[a] - (a == BS::kPartAxis ? wg * BS::wge(a) : 0);
    off += (BS::wge(a) - 1 - ql) * BS::stride(a);
  }
  off += 2 * (lane & 3);
  return buf + 4u * uint32_t(off);
}

// A compute thread's state for BiasSlice where it fills the slices itself (the plain kernel at
// rank 3): its first row's address (bias_row), the slices filled so far (the buffer of the next
// fill: n % 2), and the slices' source.
template <class Tr, class BS>
struct BiasTiles {
  uint32_t row;
  int n;
  BiasSrc src;
};

// Per CTA tile: the table of head ft.h and the thread's rows (warpgroup `wg`, tile row `row0`
// of its warp). `buf`: the warpgroup's first buffer.
template <class Tr, class QT, class BS>
__device__ __forceinline__ void bias_tiles_rows(const FwdParams& p, const FwdTile& ft, int wg,
                                                int row0, uint32_t buf, BiasTiles<Tr, BS>& bt) {
  bt.src = bias_src<Tr, BS>(p, ft, wg);
  bt.row = bias_row<Tr, QT, BS>(wg, row0, buf);
}

// The slice of key tile `t` (its table entries divided by the scale, 0 outside the table) into
// the buffer at shared address `dst`, by kN threads (`tid` in [0, kN)), in chunks of at most
// twelve entries a thread (the loads of a chunk in flight together). Nothing publishes it: the
// caller's barrier does.
template <class Tr, class BS, int kN>
__device__ __forceinline__ void bias_copy(const FwdParams& p, const KvTile& t, const BiasSrc& src,
                                          uint32_t dst, int tid) {
  int base = src.hbase;
#pragma unroll
  for (int a = Tr::kFirstAxis; a < kAxes; ++a) base += t.origin[a] * p.rpb_stride[1 + a];
  constexpr int kPer = (BS::kFloats + kN - 1) / kN;
  constexpr int kChunk = kPer <= 12 ? kPer : (kPer + 1) / 2 <= 12 ? (kPer + 1) / 2 : 8;
#pragma unroll 1
  for (int i0 = 0; i0 < kPer; i0 += kChunk) {
    float v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int idx = tid + kN * (i0 + i);
      const int c[kAxes] = {idx / (BS::ext(1) * BS::ext(2)), (idx / BS::ext(2)) % BS::ext(1),
                            idx % BS::ext(2)};
      bool ok = idx < BS::kFloats;
      int off = base;
#pragma unroll
      for (int a = Tr::kFirstAxis; a < kAxes; ++a) {
        const int ta = t.origin[a] + src.rel0[a] + c[a];
        ok = ok && ta >= 0 && ta < 2 * p.geo.axis[a].kernel - 1;
        off += c[a] * p.rpb_stride[1 + a];
      }
      v[i] = ok ? __ldg(p.rpb + off) * p.rpb_inv_scale : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int idx = tid + kN * (i0 + i);
      if (idx < BS::kFloats)
        asm volatile("st.shared.f32 [%0], %1;" ::"r"(dst + 4u * uint32_t(idx)), "f"(v[i]) : "memory");
    }
  }
}

// The compute threads' own fill (the plain kernel at rank 3): the slice of key tile `t` into
// buffer bt.n % 2 of `buf` by the warpgroup's 128 threads, published by the caller's next barrier.
// Additional-key tiles (no bias; bias_preload gives them zeros) copy nothing.
template <class Tr, class BS>
__device__ __forceinline__ void bias_fill(const FwdParams& p, const KvTile& t,
                                          BiasTiles<Tr, BS>& bt, uint32_t buf) {
  if (t.add_begin < 0)
    bias_copy<Tr, BS, 128>(p, t, bt.src, buf + uint32_t(bt.n & 1) * BS::kPitch * 4u,
                           threadIdx.x & 127);
  ++bt.n;
}

// S's accumulators preloaded with tile `t`'s bias / scale, read from buffer `slot` (the slice
// filled for it) at the thread's rows (`row`: bias_row); additional-key tiles start from 0.
template <class Tr, class KT, class BS>
__device__ __forceinline__ void bias_preload(float (&s)[1][Tr::kN / 8][4], const KvTile& t,
                                             uint32_t row, int slot) {
  if (t.add_begin >= 0) {
#pragma unroll
    for (int j = 0; j < Tr::kN / 8; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
    return;
  }
  const uint32_t src = row + uint32_t(slot & 1) * BS::kPitch * 4u;
#pragma unroll
  for (int j = 0; j < Tr::kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      int c[kAxes];
      KT::coord(j * 8, c);  // compile-time; the thread's columns are in bt.row
      const int coff = (c[0] * BS::stride(0) + c[1] * BS::stride(1) + c[2] + e) * 4;
      s[0][j][e] = staged_entry(src + uint32_t(coff));
      s[0][j][2 + e] = staged_entry(src + uint32_t(coff + 4 * BS::kRowDelta));
    }
}

}  // namespace fused
}  // namespace fna
