// The key/value tile a dK / dV CTA owns, shared by the mma.sync (bwd_dkdv_sm80.cuh) and the wgmma
// (bwd_dkdv_sm90.cuh) kernels: its rows' places in global memory, its load, the inverse windows
// of its keys (the border mask), the range of query tiles it visits, and the dK / dV store.
#pragma once

#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

// Element offsets of key row `row` of the CTA's tile in two tensors laid out like K (neighborhood
// keys: strides t1, t2; additional keys: a1, a2); false when the row holds no key.
__device__ __forceinline__ bool key_row(const Params& p, const Group& G, bool additional, int b,
                                        int hkv, const int* kv0, int64_t n0, int row,
                                        const TokStrides& t1, const TokStrides& t2,
                                        const AddStrides& a1, const AddStrides& a2, int64_t& o1,
                                        int64_t& o2) {
  if (!additional) {
    const uint32_t off = pack_offsets(p.tkv, row);
    int i[kAxes], x[kAxes];
    for (int a = 0; a < kAxes; ++a) i[a] = kv0[a] + unpack_offset(off, a);
    const bool valid = to_global(p, G, i, x);
    o1 = tok_offset(t1, b, x, hkv);
    o2 = tok_offset(t2, b, x, hkv);
    return valid;
  }
  o1 = b * a1.b + (n0 + row) * a1.n + hkv * a1.h;
  o2 = b * a2.b + (n0 + row) * a2.n + hkv * a2.h;
  return n0 + row < p.num_add;
}

// K (and with load_v, V) rows of the tile into shared memory: byte offset `sw(row, c)` of 16-byte
// chunk c from sK / sV.
template <typename E, int kKV, int kThreads, int kChunks, class Sw>
__device__ __forceinline__ void load_kv_rows(const Params& p, const Group& G, bool additional,
                                             int b, int hkv, const int* kv0, int64_t n0,
                                             unsigned char* sK, unsigned char* sV, bool load_v,
                                             Sw sw) {
  const E* gK = static_cast<const E*>(additional ? p.add_k : p.k);
  const E* gV = static_cast<const E*>(additional ? p.add_v : p.v);
  for (int idx = threadIdx.x; idx < kKV * kChunks; idx += kThreads) {
    const int row = idx / kChunks, c = idx % kChunks;
    int64_t ok = 0, ov = 0;
    const bool valid = key_row(p, G, additional, b, hkv, kv0, n0, row, p.sk, p.sv, p.sak, p.sav,
                               ok, ov);
    const uint32_t so = sw(row, c);
    load_chunk(reinterpret_cast<E*>(sK + so), valid ? gK + ok : nullptr, c, p.dim, p.aligned, gK);
    if (load_v)
      load_chunk(reinterpret_cast<E*>(sV + so), valid ? gV + ov : nullptr, c, p.dim_v, p.aligned,
                 gV);
  }
  cp_async_commit();
}

// The inverse windows of the key tile's keys per axis into s_kinv ([kKV][kAxes]; keys outside the
// group get empty ones): one (key, axis) pair per thread, the last axes first (a rank below 3 pads
// the first axes with length 1, whose searches take no step). The caller's barrier makes them
// visible to key_tile_ranges and the border masks.
// Additional mode (the tile holds additional keys n0 ..): every query sees every additional key,
// so an existing key gets a range that covers any query tile (kAllQueries, clamped by the masks)
// and a row past the last key an empty one. The masks (qtile_full is false in additional mode)
// then give those rows P = 0. Unmasked, a row past the last key (zero K and V) has P =
// exp2(-LSE), which for a query whose LSE is far below 0 overflows a 16-bit dS^T, and that inf
// times the row's zero K is a NaN in dQ.
constexpr int kAllQueries = 1 << 29;
template <int kKV>
__device__ __forceinline__ void key_tile_windows(const Params& p, const Group& G, bool additional,
                                                 const int* kv0, int64_t n0, int2* s_kinv) {
  if (additional) {
    for (int idx = threadIdx.x; idx < kKV * kAxes; idx += blockDim.x) {
      const int key = idx % kKV;
      s_kinv[key * kAxes + idx / kKV] = n0 + key < p.num_add
                                            ? make_int2(-kAllQueries, kAllQueries)
                                            : make_int2(0, 0);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kKV * kAxes; idx += blockDim.x) {
    const int key = idx % kKV, ax = kAxes - 1 - idx / kKV;
    const uint32_t off = pack_offsets(p.tkv, key);
    bool valid = true;
    for (int a = 0; a < kAxes; ++a) valid = valid && kv0[a] + unpack_offset(off, a) < G.len[a];
    const nbr::Range r =
        valid ? nbr::inverse_window(p.geo.axis[ax], G.len[ax], kv0[ax] + unpack_offset(off, ax))
              : nbr::Range{0, 0};
    s_kinv[key * kAxes + ax] = make_int2(r.begin, r.end);
  }
}

// The query tiles the key tile visits, after key_tile_windows' barrier: per axis, queries qr[a]
// in nq[a] tiles of p.tq[a] (additional mode: all tokens, nq = {tiles of kQ, 1, 1}); returns the
// tile count. The union of the keys' inverse windows on axis a runs from the first key's window
// start to the end of the window of the last key along a (offset 0 on the other axes, so a key
// of the group): windows are monotone, and no key's is empty (stride <= kernel puts every key in
// some window; tests/cpp/inverse_neighborhood_test.cpp), so no search is repeated here.
// kSearch: each axis' range by nbr::inverse_tile_union instead (no barrier needed).
template <int kQ, bool kSearch = false>
__device__ __forceinline__ int64_t key_tile_ranges(const Params& p, const Group& G,
                                                   bool additional, const int* kv0,
                                                   const int2* s_kinv, nbr::Range (&qr)[kAxes],
                                                   int (&nq)[kAxes]) {
  for (int a = 0; a < kAxes; ++a) nq[a] = 1;
  if (additional) {
    const int64_t n_tiles = (p.tokens + kQ - 1) / kQ;
    nq[0] = int(n_tiles);
    return n_tiles;
  }
  int64_t n_tiles = 1;
  int row_stride = 1;  // key rows per step on axis a (the later axes' tile extents)
  for (int a = kAxes - 1; a >= 0; --a) {
    const int last = min(kv0[a] + p.tkv[a], G.len[a]) - 1 - kv0[a];
    qr[a] = kSearch ? nbr::inverse_tile_union(p.geo.axis[a], G.len[a], kv0[a], kv0[a] + last + 1)
                    : nbr::Range{s_kinv[a].x, s_kinv[last * row_stride * kAxes + a].y};
    row_stride *= p.tkv[a];
    if (p.region) {
      // Only the query region's queries: local [ceil((qlo - g) / d), ceil((qhi - g) / d)) of
      // the group (qlo >= 0 and g < d: the dividends are >= 0, so the division rounds down).
      const int d = p.geo.axis[a].dilation;
      const int lo = (p.qlo[a] - G.g[a] + d - 1) / d, hi = (p.qhi[a] - G.g[a] + d - 1) / d;
      qr[a].begin = max(qr[a].begin, lo);
      qr[a].end = min(qr[a].end, hi);
    }
    nq[a] = (qr[a].size() + p.tq[a] - 1) / p.tq[a];
    n_tiles *= nq[a];
  }
  return n_tiles;
}

// Border mask of S^T (keys as rows, mma.sync C layout: this thread's rows wrow + lane / 4 and 8
// below, columns n * 8 + 2 * (lane % 4) + j of the query sub-tile whose packed offsets start at
// qoff): a key row keeps the queries of its inverse window on every axis. The windows are taken
// relative to the query tile origin q0 once, so each element costs one unsigned compare per axis
// ((unsigned)(o - lo) < len tests lo <= o < lo + len).
template <int kNB>
__device__ __forceinline__ void mask_key_rows(float (&s)[kNB][4], const int2* s_kinv,
                                              const uint32_t* qoff, const int* q0, int wrow,
                                              int lane) {
  int lo[2][kAxes], len[2][kAxes];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + (lane >> 2) + half * 8;
#pragma unroll
    for (int a = 0; a < kAxes; ++a) {
      const int2 r = s_kinv[row * kAxes + a];
      lo[half][a] = r.x - q0[a];
      len[half][a] = r.y - r.x;
    }
  }
#pragma unroll
  for (int n = 0; n < kNB; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t off = qoff[n * 8 + 2 * (lane & 3) + j];
      int o[kAxes];
#pragma unroll
      for (int a = 0; a < kAxes; ++a) o[a] = unpack_offset(off, a);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        bool in = true;
#pragma unroll
        for (int a = 0; a < kAxes; ++a)
          in = in && unsigned(o[a] - lo[half][a]) < unsigned(len[half][a]);
        if (!in) s[n][2 * half + j] = -INFINITY;
      }
    }
  }
}

// The border mask of a 64-query tile as bit sets (the Hopper kernel, bwd_dkdv_sm90.cuh): for
// each axis a and bound v in [0, p.tq[a]], cm[a * 65 + v] holds the tile's queries (bit = row of
// the tile) whose offset on axis a is below v, so the queries of a key row's window [lo, hi) on
// that axis are cm[hi] & ~cm[lo]. Built once per CTA from the packed offsets (qoff, 64 rows).
// A warp per entry: two ballots over the 64 rows (entries past p.tq[a] are never read).
constexpr int kColMaskStride = 65;
__device__ __forceinline__ void build_col_masks(const Params& p, const uint32_t* qoff,
                                                uint64_t* cm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const uint32_t off_lo = qoff[lane], off_hi = qoff[lane + 32];
  for (int a = 0; a < kAxes; ++a)
    for (int v = warp; v <= p.tq[a]; v += warps) {
      const uint32_t lo = __ballot_sync(0xffffffffu, unpack_offset(off_lo, a) < v);
      const uint32_t hi = __ballot_sync(0xffffffffu, unpack_offset(off_hi, a) < v);
      if (lane == 0) cm[a * kColMaskStride + v] = uint64_t(lo) | (uint64_t(hi) << 32);
    }
}

// mask_key_rows for 64-query tiles by the bit sets of build_col_masks: per key row, one AND-NOT
// of two table entries per axis, then one bit test and select per element. The tile's columns are
// n8 blocks kN0 .. kN0 + 7 of s (kN0 = 8: the second tile of a paired step).
template <int kNB, int kN0 = 0>
__device__ __forceinline__ void mask_key_rows_bits(float (&s)[kNB][4], const int2* s_kinv,
                                                   const uint64_t* cm, const Params& p,
                                                   const int* q0, int wrow, int lane) {
  static_assert(kNB == kN0 + 8 || (kN0 == 0 && kNB == 16), "64-query tiles");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + (lane >> 2) + half * 8;
    uint64_t m = ~uint64_t(0);
#pragma unroll
    for (int a = 0; a < kAxes; ++a) {
      const int2 r = s_kinv[row * kAxes + a];
      const int t = p.tq[a];
      const int lo = min(max(r.x - q0[a], 0), t), hi = min(max(r.y - q0[a], 0), t);
      m &= cm[a * kColMaskStride + hi] & ~cm[a * kColMaskStride + lo];
    }
    m >>= 2 * (lane & 3);  // bit n * 8 + j: this thread's column n * 8 + 2 * (lane % 4) + j
    const uint32_t w[2] = {uint32_t(m), uint32_t(m >> 32)};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (!(w[n >> 2] & (1u << ((n & 3) * 8 + j)))) s[kN0 + n][2 * half + j] = -INFINITY;
  }
}

// dK (times the softmax scale) and dV of this thread's two key rows (wrow + lane / 4 and 8 rows
// below), from accumulators in the mma.sync C layout (n8 blocks of the head dim).
// col0: the head-dim column of the accumulators' first (the d256 Hopper kernel's warpgroups each
// hold one half).
template <bool kDk, bool kDv, int kDB, typename E>
__device__ __forceinline__ void store_dkdv(const Params& p, const Group& G, bool additional,
                                           int b, int hkv, const int* kv0, int64_t n0, int wrow,
                                           int lane, const float (&acc_dk)[kDB][4],
                                           const float (&acc_dv)[kDB][4], int col0 = 0) {
  E* gdK = static_cast<E*>(additional ? p.d_add_k : p.dk);
  E* gdV = static_cast<E*>(additional ? p.d_add_v : p.dv);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + (lane >> 2) + half * 8;
    int64_t ok, ov;
    if (!key_row(p, G, additional, b, hkv, kv0, n0, row, p.sdk, p.sdv, p.sdak, p.sdav, ok, ov))
      continue;
#pragma unroll
    for (int n = 0; n < kDB; ++n) {
      const int col = col0 + n * 8 + 2 * (lane & 3);
      if (kDk)
        store_pair(gdK + ok, col, p.dim, acc_dk[n][2 * half] * p.scale,
                   acc_dk[n][2 * half + 1] * p.scale, p.aligned);
      if (kDv)
        store_pair(gdV + ov, col, p.dim_v, acc_dv[n][2 * half], acc_dv[n][2 * half + 1],
                   p.aligned);
    }
  }
}

}  // namespace bwd
}  // namespace fna
