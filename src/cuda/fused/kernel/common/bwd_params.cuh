// Plain parameters of the fused backward kernels and the per-CTA geometry they share: dilation
// groups, multi-dimensional tile boxes, and token addressing. Problems of rank < 3 are lifted to
// rank 3 with leading axes of length 1 (tiling.cuh) (kernel 1), which the neighborhood math treats as a
// single self-attending token, so one kernel serves every rank.
#pragma once

#include <cstdint>

#include "cuda/fused/kernel/common/bwd_mma.cuh"

#include "core/neighborhood.h"
#include "cuda/fused/kernel/common/problem_block.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace bwd {

using fused::kAxes;
using fused::Group;

// Element strides of a [B, L0, L1, L2, H, D] tensor (unit stride on D is required).
struct TokStrides {
  int64_t b, x[kAxes], h;
};
// Element strides of an additional-token tensor [B, N_add, H_kv, D].
struct AddStrides {
  int64_t b, n, h;
};

// The problem block (geometry, sizes, scale: problem_block.h) and the backward's tensors and tiles.
struct Params : fused::ProblemBlock {
  int tq[kAxes];         // query tile shape, prod = the kernel's query tile size
  int tkv[kAxes];        // key/value tile shape, prod = the kernel's key tile size
  int tiles[kAxes];      // tiles per axis of the owned tensor over the largest group (group 0);
                         // the dQ kernel's: over the query region's part of it
  int tile0[kAxes];      // the first of them (the dQ kernel with a query region; else 0)
  int tdiv[kAxes];       // the owned tiles' walk (tiling.cuh walk_divisors)

  const void *q, *k, *v, *d_o, *add_k, *add_v;
  void *dq, *dk, *dv, *d_add_k, *d_add_v;
  TokStrides sq, sk, sv, sdo, sdq, sdk, sdv;
  AddStrides sak, sav, sdak, sdav;

  // Per (batch, token, head): {LSE * log2(e), rowsum(dO * O)}; +inf LSE marks no query.
  const float2* stats;
  // Rows 16-byte aligned and head dims multiples of 16 bytes (8 16-bit / 4 float): tiles load with cp.async and results store
  // in pairs. Otherwise every element goes through its own load / store (correct, slower).
  bool aligned;
  // Atomic-dQ mode: float32 dQ * (1 / scale) accumulated as [B, N, H, dq_row], dq_row = D rounded
  // up to 8 (8-byte aligned pairs for vector atomics).
  float* dq_accum;
  int dq_row;
  // d rpb (with ProblemBlock::rpb; both dense [H, 2 K_a - 1 ..]), zeroed by the host: the dK / dV
  // kernel sums each CTA's dS per table entry in shared memory and adds the sums with atomics,
  // or (d_rpb_global: a table too large for shared memory) adds dS straight into d rpb.
  // d_rpb_warps > 0: every warp sums into a table of its own (rpb_pitch floats apart; plain
  // adds, no atomics), the copies summed when they go to d rpb; 0: one table, shared atomics.
  // d_rpb_part (deterministic calls, with d_rpb_warps): each neighborhood CTA stores its sums
  // per query head of its group, [grid_row()][blockIdx.x][heads_per_kv][rpb_elems] (zeroed by the
  // host), instead of adding them to d rpb; rpb_partial_sum adds them up in a fixed order.
  float* d_rpb;
  int d_rpb_global;
  int d_rpb_warps;
  int rpb_pitch;
  float* d_rpb_part;
};

// The CTA's grid row: (batch, head, group) rows past gridDim.y's limit of 65535 continue over
// blockIdx.z (fold_rows in plan/bwd_choice.cu); rows past the problem's count are the fold's
// padding, which the kernels skip.
__device__ __forceinline__ unsigned grid_row() { return blockIdx.y + gridDim.y * blockIdx.z; }

// Row t of a tile of shape `shape` -> offsets per axis, last axis fastest. Packed in one word
// (10 bits per axis) so tables of them fit in shared memory; tile extents are <= 256. Unsigned
// division: no sign corrections (t >= 0).
__device__ __forceinline__ uint32_t pack_offsets(const int* shape, int t) {
  const uint32_t s2 = uint32_t(shape[2]), s1 = uint32_t(shape[1]);
  uint32_t u = uint32_t(t);
  const uint32_t o2 = u % s2;
  u /= s2;
  const uint32_t o1 = u % s1;
  const uint32_t o0 = u / s1;
  return o0 | (o1 << 10) | (o2 << 20);
}
__device__ __forceinline__ int unpack_offset(uint32_t packed, int axis) {
  return int((packed >> (10 * axis)) & 1023u);
}

// Global token coordinates of local coordinates `i` of group G; false when outside the group.
__device__ __forceinline__ bool to_global(const Params& p, const Group& G, const int* i, int* x) {
  bool ok = true;
  for (int a = 0; a < kAxes; ++a) {
    ok = ok && i[a] >= 0 && i[a] < G.len[a];
    x[a] = i[a] * p.geo.axis[a].dilation + G.g[a];
  }
  return ok;
}

// to_global for query rows: false also outside the query region (ProblemBlock::qlo / qhi),
// whose rows the Q-role tensors (Q, dO, dQ, O, LSE) do not hold.
__device__ __forceinline__ bool query_global(const Params& p, const Group& G, const int* i, int* x) {
  const bool ok = to_global(p, G, i, x);
  return p.region ? ok && fused::in_query_region(p, x) : ok;
}

// Flat token index -> global coordinates.
__device__ __forceinline__ void token_coords(const Params& p, int64_t tok, int* x) {
  x[2] = int(tok % p.geo.axis[2].length);
  tok /= p.geo.axis[2].length;
  x[1] = int(tok % p.geo.axis[1].length);
  x[0] = int(tok / p.geo.axis[1].length);
}

__device__ __forceinline__ int64_t token_index(const Params& p, const int* x) {
  return (int64_t(x[0]) * p.geo.axis[1].length + x[1]) * p.geo.axis[2].length + x[2];
}

__device__ __forceinline__ int64_t tok_offset(const TokStrides& s, int b, const int* x, int h) {
  return b * s.b + x[0] * s.x[0] + x[1] * s.x[1] + x[2] * s.x[2] + h * s.h;
}

// Row (b * N + token) * H + h of a [B, N.., H, ...] tensor -> its batch, coordinates and head, for
// tok_offset (the statistics and dQ-conversion passes, with any strides).
struct RowPlace {
  int b, h;
  int x[kAxes];
};
__device__ __forceinline__ RowPlace row_place(const Params& p, int64_t row) {
  RowPlace r;
  r.h = int(row % p.heads);
  r.b = int(row / (int64_t(p.heads) * p.tokens));
  token_coords(p, (row / p.heads) % p.tokens, r.x);
  return r;
}

// Elements [kPer c, kPer c + kPer) (kPer = 16 bytes of elements: 8 16-bit, 4 float) of a row of
// `cols` elements at `row` (null: no row) into 16 bytes of shared memory at `dst`; columns past
// `cols` become zeros (head-dim padding).
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const T* row, int c, int cols, bool aligned,
                                           const T* any) {
  constexpr int kPer = 16 / int(sizeof(T));
  if (aligned) {
    const bool v = row != nullptr && c * kPer < cols;
    cp_async16(dst, v ? row + c * kPer : any, v);
    return;
  }
  if constexpr (sizeof(T) == 4) {
    float e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = row != nullptr && c * 4 + k < cols ? row[c * 4 + k] : 0.f;
    *reinterpret_cast<float4*>(dst) = make_float4(e[0], e[1], e[2], e[3]);
  } else {
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
    uint16_t e[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) e[k] = row != nullptr && c * 8 + k < cols ? r[c * 8 + k] : 0;
    uint4 w;
    w.x = e[0] | (uint32_t(e[1]) << 16);
    w.y = e[2] | (uint32_t(e[3]) << 16);
    w.z = e[4] | (uint32_t(e[5]) << 16);
    w.w = e[6] | (uint32_t(e[7]) << 16);
    *reinterpret_cast<uint4*>(dst) = w;
  }
}

// Stores the pair (lo, hi) at columns col, col + 1 of a row of `cols` elements.
template <typename T>
__device__ __forceinline__ void store_pair(T* row, int col, int cols, float lo, float hi,
                                           bool aligned) {
  if constexpr (sizeof(T) == 4) {
    if (aligned) {
      if (col < cols) *reinterpret_cast<float2*>(row + col) = make_float2(lo, hi);
      return;
    }
    if (col < cols) row[col] = lo;
    if (col + 1 < cols) row[col + 1] = hi;
  } else {
    const uint32_t v = pack2<T>(lo, hi);
    if (aligned) {
      if (col < cols) *reinterpret_cast<uint32_t*>(row + col) = v;
      return;
    }
    uint16_t* r = reinterpret_cast<uint16_t*>(row);
    if (col < cols) r[col] = uint16_t(v & 0xffffu);
    if (col + 1 < cols) r[col + 1] = uint16_t(v >> 16);
  }
}

}  // namespace bwd
}  // namespace fna
