// The query tiles a dK / dV CTA visits and their loads, shared by the mma.sync (bwd_dkdv_sm80.cuh) and
// the wgmma (bwd_dkdv_sm90.cuh) kernels.
//
// A CTA visits every query tile of its key tile's inverse neighborhood (per axis: qr[a], nq[a]
// tiles of p.tq[a] queries) for each query head of its kv head, heads outer; in additional mode,
// all tokens in flat order, in tiles of kQ rows. QWalk steps through them as an odometer, so no
// step divides (the 64-bit divisions of a flat index were most of the loop's integer work).
//
// load_q_rows gives each query row to kThreads / kRows threads, which compute the row's place
// once (not once per 16-byte chunk) and store the row's flat (batch, token, head) index for the
// dQ atomics.
#pragma once

#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

// Global coordinates `x` of query row `row` of the query tile at `q0`; false when the row holds
// no query (outside the group, past the last token, or outside the query region). Neighborhood mode: local coordinates q0 +
// the row's offsets (s_qoff: the query tile shape's packed offsets). Additional mode: the
// queries are all tokens in flat order, q0[0] numbering tiles of `q_rows` rows.
__device__ __forceinline__ bool query_row_coords(const Params& p, const Group& G, bool additional,
                                                 const int* q0, int q_rows,
                                                 const uint32_t* s_qoff, int row, int* x) {
  if (!additional) {
    int i[kAxes];
    const uint32_t off = s_qoff[row];
    for (int a = 0; a < kAxes; ++a) i[a] = q0[a] + unpack_offset(off, a);
    return query_global(p, G, i, x);
  }
  const int64_t tok = int64_t(q0[0]) * q_rows + row;
  const bool valid = tok < p.tokens;
  token_coords(p, valid ? tok : 0, x);
  return valid && fused::in_query_region(p, x);
}

struct QWalk {
  int h;          // query head
  int t[kAxes];   // tile index per axis (additional mode: t[0] is the flat tile index)
  int q0[kAxes];  // the tile's first local coordinates (additional mode: q0[0] = t[0])

  __device__ __forceinline__ void origin(const Params& p, bool additional,
                                         const nbr::Range (&qr)[kAxes]) {
#pragma unroll
    for (int a = 0; a < kAxes; ++a)
      q0[a] = additional ? (a == 0 ? t[0] : 0) : qr[a].begin + t[a] * p.tq[a];
  }
  // The first tile.
  __device__ __forceinline__ void start(const Params& p, bool additional, int hkv,
                                        const nbr::Range (&qr)[kAxes]) {
    h = hkv * p.heads_per_kv;
#pragma unroll
    for (int a = 0; a < kAxes; ++a) t[a] = 0;
    origin(p, additional, qr);
  }
  // The next tile; nq: tiles per axis ({n_tiles, 1, 1} in additional mode).
  __device__ __forceinline__ void next(const Params& p, bool additional,
                                       const nbr::Range (&qr)[kAxes], const int (&nq)[kAxes]) {
    int a = kAxes - 1;
#pragma unroll
    for (; a >= 0; --a) {
      if (++t[a] < nq[a]) break;
      t[a] = 0;
    }
    if (a < 0) ++h;
    origin(p, additional, qr);
  }
  // The tile after this one (this one unchanged).
  __device__ __forceinline__ QWalk after(const Params& p, bool additional,
                                         const nbr::Range (&qr)[kAxes],
                                         const int (&nq)[kAxes]) const {
    QWalk n = *this;
    n.next(p, additional, qr, nq);
    return n;
  }
};

// A (key tile, query tile) pair needs no mask when both lie inside the group and the keys are in
// every window of the query tile, on every axis (qtile_full_axis). In additional mode the mask
// keeps the rows of existing keys whole and clears the rows past the last one
// (key_tile_windows).
__device__ __forceinline__ bool qtile_full_axis(const nbr::Axis& axis, int len, int q0, int tq,
                                                int kv0, int tkv) {
  const int q1 = q0 + tq, k1 = kv0 + tkv;
  if (q1 > len || k1 > len) return false;
  const nbr::Range in = nbr::tile_intersection(axis, len, q0, q1);
  return in.begin <= kv0 && k1 <= in.end;
}
// Element `a` of a register array without indexing it at run time (which would put it in local
// memory).
__device__ __forceinline__ int pick_axis(const int* v, int a) {
  return a == 0 ? v[0] : (a == 1 ? v[1] : v[2]);
}
__device__ __forceinline__ bool qtile_full(const Params& p, const Group& G, bool additional,
                                           const int* kv0, const int* q0) {
  if (additional) return false;
  for (int a = 0; a < kAxes; ++a)
    if (!qtile_full_axis(p.geo.axis[a], G.len[a], q0[a], p.tq[a], kv0[a], p.tkv[a])) return false;
  return true;
}

// Q and dO rows of query tile `w` into shared memory (byte offset `sw(row, c)` of 16-byte chunk c
// from sQ / sdO), the rows' statistics into `stat` by cp.async (waited with the tile), and each
// row's flat index (b * tokens + token) * heads + h, or -1 for no query, into `tok`, and
// qtile_full into `full`.
// kFast: rows that are whole (16-byte aligned, D and D_v equal to the padded head dim) take an
// unrolled copy loop without per-chunk tests. kCopy = false: everything but the Q and dO rows
// (which the caller loads by TMA).
template <typename E, int kRows, int kThreads, int kChunks, class Sw, bool kFast = false,
          bool kCopy = true>
__device__ __forceinline__ void load_q_rows(const Params& p, const Group& G, bool additional,
                                            int b, const int* kv0, const QWalk& w,
                                            const uint32_t* s_qoff, unsigned char* sQ,
                                            unsigned char* sdO, float2* stat, int64_t* tok,
                                            int* full, Sw sw) {
  constexpr int kTPR0 = kThreads >= kRows ? kThreads / kRows : 1;
  constexpr int kTPR = kTPR0 > kChunks ? kChunks : kTPR0;  // threads per row
  constexpr int kRowsPerPass = kThreads / kTPR;
  const E* gQ = static_cast<const E*>(p.q);
  const E* gdO = static_cast<const E*>(p.d_o);
  const int sub = threadIdx.x % kTPR;
  const bool whole = kFast && p.aligned && p.dim == kChunks * (16 / int(sizeof(E))) &&
                     p.dim_v == p.dim;
  for (int row = threadIdx.x / kTPR; row < kRows; row += kRowsPerPass) {
    int x[kAxes];
    const bool valid = query_row_coords(p, G, additional, w.q0, kRows, s_qoff, row, x);
    const int64_t t = (int64_t(b) * p.tokens + token_index(p, x)) * p.heads + w.h;
    const E* q = valid ? gQ + tok_offset(p.sq, b, x, w.h) : nullptr;
    const E* o = valid ? gdO + tok_offset(p.sdo, b, x, w.h) : nullptr;
    constexpr int kPer = 16 / int(sizeof(E));
    if (!kCopy) {
    } else if (whole) {
      static_assert(kChunks % kTPR == 0, "whole passes");
#pragma unroll
      for (int i = 0; i < kChunks / kTPR; ++i) {
        const int c = sub + i * kTPR;
        const uint32_t so = sw(row, c);
        cp_async16(reinterpret_cast<E*>(sQ + so), valid ? q + c * kPer : gQ, valid);
        cp_async16(reinterpret_cast<E*>(sdO + so), valid ? o + c * kPer : gdO, valid);
      }
    } else {
      for (int c = sub; c < kChunks; c += kTPR) {
        const uint32_t so = sw(row, c);
        load_chunk(reinterpret_cast<E*>(sQ + so), q, c, p.dim, p.aligned, gQ);
        load_chunk(reinterpret_cast<E*>(sdO + so), o, c, p.dim_v, p.aligned, gdO);
      }
    }
    if (sub == 0) {
      // The statistics travel with the tile (cp.async, waited at the next barrier) instead of
      // a load whose latency the issuing thread would wait out here.
      if (valid)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(stat + row)),
                     "l"(p.stats + t));
      else
        stat[row] = make_float2(INFINITY, 0.f);  // no query: P = exp2(-inf) = 0
      tok[row] = valid ? t : -1;
    }
  }
  cp_async_commit();
  // Whether the tile needs no mask against key tile kv0, for everyone after the barrier: by the
  // last thread, or (kFast) by one lane of the last warp per axis.
  if (kFast) {
    if (threadIdx.x >= kThreads - 32) {
      const int a = int(threadIdx.x) - (kThreads - 32);
      static_assert(kAxes == 3, "pick_axis");
      const bool ok = !additional &&
                      (a >= kAxes ||
                       qtile_full_axis(p.geo.axis[a], pick_axis(G.len, a), pick_axis(w.q0, a),
                                       p.tq[a], pick_axis(kv0, a), p.tkv[a]));
      const unsigned all = __ballot_sync(0xffffffffu, ok);
      if (a == 0) *full = all == 0xffffffffu;
    }
  } else if (threadIdx.x == kThreads - 1) {
    *full = qtile_full(p, G, additional, kv0, w.q0);
  }
}

// The empty second tile of a paired step whose walk has odd length (bwd_dkdv_sm90.cuh): zero Q
// and dO rows (finite products), statistics that make P = exp2(-inf) = 0, no dQ rows, no mask;
// thread t of kThreads.
template <int kRows, int kThreads, int kBytes>
__device__ __forceinline__ void clear_q_rows(unsigned char* sQ, unsigned char* sdO, float2* stat,
                                             int64_t* tok, int* full, int t) {
  uint4* q = reinterpret_cast<uint4*>(sQ);
  uint4* o = reinterpret_cast<uint4*>(sdO);
  for (int i = t; i < kBytes / 16; i += kThreads) q[i] = o[i] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += kThreads) {
    const int r = r0 + t;
    if (kThreads <= kRows || r < kRows) {
      stat[r] = make_float2(INFINITY, 0.f);
      tok[r] = -1;
    }
  }
  if (t == 0) *full = 1;
}

}  // namespace bwd
}  // namespace fna
