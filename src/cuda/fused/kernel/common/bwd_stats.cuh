// The backward's per-query statistics kernel (launched by plan/backward.cu before the dK / dV
// and dQ kernels): {LSE * log2(e), rowsum(dO * O) - d_lse} per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

constexpr float kLog2e = 1.4426950408889634f;


// stats = {LSE * log2(e), sum_d dO * O - d_lse} per (batch, token, head) row, and the row of
// p.dq_accum zeroed where it is set (the atomic-dQ mode), 2^log_tpr threads per row, each reading
// 16 bytes of dO and of O per step. d_lse (null = zero) is the gradient into the row's LSE:
// d LSE / d s_j = P_j, so it adds P_j * d_lse to dS_j, and the kernels' dS = P (dP - stats.y)
// take it in through stats.y. `dense`: O, dO, LSE and d_lse laid out densely, so
// a row's place takes no division; `vec`: 16-byte loads (dense, aligned, D_v a multiple of 16
// bytes). kTf32 (plain TF32): dO rounded to TF32 as in dP = dO V^T, so that dS = P (dP - sum)
// stays consistent (a query alone in its window gets dS = d_lse, not the rounding error of dP).
template <typename T, bool kTf32 = false>
__global__ void stats_kernel(const Params p, const T* o, TokStrides so, const float* lse,
                             TokStrides sl, const float* d_lse, TokStrides sdl, float2* stats,
                             int log_tpr, bool dense, bool vec) {
  constexpr int kPer = 16 / int(sizeof(T));
  const int tpr = 1 << log_tpr;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> log_tpr;
  const int lane = threadIdx.x & 31, sub = lane & (tpr - 1);
  if (row >= int64_t(p.batch) * p.tokens * p.heads) return;  // whole rows: the shuffles' groups
  // The atomic-dQ mode's accumulator row, zeroed here instead of by a separate pass over it
  // (dq_row % 8 == 0: 16-byte stores).
  if (p.dq_accum != nullptr) {
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + row * p.dq_row);
    for (int c = sub; c < p.dq_row / 4; c += tpr) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (p.region) {
    // Rows of the grid outside the query region hold no query: +inf LSE (P = 0) and no loads
    // (the Q-role tensors hold the region only; `dense` is off with a region).
    const RowPlace r = row_place(p, row);
    if (!fused::in_query_region(p, r.x)) {
      if (sub == 0) stats[row] = make_float2(INFINITY, 0.f);
      return;  // the row's lanes all leave: its shuffle group is not used
    }
  }
  const T* gdO;
  const T* gO;
  int64_t lse_off, dlse_off;
  if (dense) {
    gdO = static_cast<const T*>(p.d_o) + row * p.dim_v;
    gO = o + row * p.dim_v;
    lse_off = dlse_off = row;
  } else {
    const RowPlace r = row_place(p, row);
    gdO = static_cast<const T*>(p.d_o) + tok_offset(p.sdo, r.b, r.x, r.h);
    gO = o + tok_offset(so, r.b, r.x, r.h);
    lse_off = tok_offset(sl, r.b, r.x, r.h);
    dlse_off = tok_offset(sdl, r.b, r.x, r.h);
  }
  float acc = 0.f;
  for (int c = kPer * sub; c < p.dim_v; c += kPer * tpr) {
    T a[kPer], b[kPer];
    if (vec) {
      *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(gdO + c);
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(gO + c);
    } else {
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const bool in = c + e < p.dim_v;
        a[e] = in ? gdO[c + e] : T(0.f);
        b[e] = in ? gO[c + e] : T(0.f);
      }
    }
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      float x = float(a[e]);
      if constexpr (kTf32) x = __uint_as_float(mma::to_tf32(x));
      acc += x * float(b[e]);
    }
  }
  // The row's threads are 2^log_tpr aligned lanes of one warp, all present.
  const unsigned group = (tpr == 32 ? 0xffffffffu : ((1u << tpr) - 1u)) << (lane & ~(tpr - 1));
  for (int m = tpr / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(group, acc, m);
  if (sub == 0)
    stats[row] = make_float2(lse[lse_off] * kLog2e, d_lse != nullptr ? acc - d_lse[dlse_off] : acc);
}

}  // namespace bwd
}  // namespace fna
