// The relative positional bias in the dK / dV kernels (bwd_dkdv_sm80.cuh, bwd_dkdv_sm90.cuh,
// bwd_dkdv_sm90_ws.cuh), on their S^T layout: this thread's key rows wrow + lane / 4 and 8 below,
// query columns n * 8 + 2 * (lane % 4) + j of the query sub-tile. P^T recomputes the forward's
// biased logits, and dS^T, the gradient of the logits, is summed per table entry into the current
// head's table in shared memory, which goes to d rpb with one global atomic per entry when the
// CTA's walk moves to the next head and at its end. Where shared memory holds a copy per warp
// (Params::d_rpb_warps) each warp adds into its own with plain loads and stores; else the warp's
// diagonal sums go straight into d rpb (Params::d_rpb_global), or, where tuning asks for it, one
// table takes shared atomics (compare-and-swap loops on Hopper: slower, plan/bwd_choice.cu).
//
// The bias region (shared memory after the kernel's own, BwdLaunch::bias_smem): int qrel[kQ],
// the table offset of each query-tile row (its packed offsets times the table strides), then
// the table copies (none with d_rpb_global), rpb_pitch floats apart.
#pragma once

#include <cmath>

#include "cuda/fused/kernel/common/bwd_params.cuh"

namespace fna {
namespace bwd {

struct BwdBias {
  bool on;       // a bias, and the CTA's keys are neighborhood keys
  bool priv;     // acc is this warp's own copy (plain adds)
  int kb[2];     // table index of this thread's two key rows at query coordinates 0
  float* acc;    // the current head's d rpb sums (this warp's copy, the shared table, or d rpb
                 // itself with p.d_rpb_global); null: no gradient
  float* table;  // the first shared copy
  const int* qrel;  // [kQ]: table offsets of the query-tile rows
  int h;         // the current head
};

// Bytes of the bias region before the tables (qrel), for a query tile of q rows; the region
// starts at the kernel's own shared memory rounded up to 16 bytes (BwdLaunch::bias_smem counts
// the padding as 16 bytes).
__host__ __device__ constexpr int bias_qrel_bytes(int q) { return (q * 4 + 15) / 16 * 16; }
__host__ __device__ constexpr size_t bias_region_offset(size_t kernel_smem) {
  return (kernel_smem + 15) / 16 * 16;
}

// The bias functions run on the kThreads threads that compute the scores (the whole CTA, or the
// warp-specialized kernel's compute warpgroups): `tid` is the thread's index among them (its
// warp tid / 32 owns table copy tid / 32), `sync` their barrier.
struct CtaSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// The thread's key rows of the key tile at kv0; fills qrel from the tile's packed row offsets
// `qoff` (kQ rows) and zeroes the table copies when the kernel computes d rpb (`grad`), both made
// visible by the caller's next barrier; with p.d_rpb_global points the sums straight at head
// h0's d rpb (global atomics).
template <int kThreads, int kQ>
__device__ __forceinline__ BwdBias bias_setup(const Params& p, bool additional, bool grad,
                                              const int* kv0, int wrow, int lane, int h0,
                                              const uint32_t* qoff, unsigned char* region,
                                              int tid) {
  BwdBias bb;
  bb.on = p.rpb != nullptr && !additional;
  int* qrel = reinterpret_cast<int*>(region);
  bb.qrel = qrel;
  bb.table = reinterpret_cast<float*>(region + bias_qrel_bytes(kQ));
  bb.priv = !p.d_rpb_global && p.d_rpb_warps > 0;
  bb.acc = !(bb.on && grad) ? nullptr
           : p.d_rpb_global ? p.d_rpb + int64_t(h0) * p.rpb_stride[0]
           : bb.priv        ? bb.table + (tid >> 5) * p.rpb_pitch
                            : bb.table;
  bb.h = h0;
  bb.kb[0] = bb.kb[1] = 0;
  if (!bb.on) return bb;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t off = pack_offsets(p.tkv, wrow + (lane >> 2) + 8 * half);
#pragma unroll
    for (int a = 0; a < kAxes; ++a)
      bb.kb[half] +=
          (kv0[a] + unpack_offset(off, a) + p.geo.axis[a].kernel - 1) * p.rpb_stride[1 + a];
  }
  for (int i = tid; i < kQ; i += kThreads) {
    int r = 0;
#pragma unroll
    for (int a = 0; a < kAxes; ++a) r += unpack_offset(qoff[i], a) * p.rpb_stride[1 + a];
    qrel[i] = r;
  }
  if (bb.acc != nullptr && !p.d_rpb_global) {
    const int n = bb.priv ? p.d_rpb_warps * p.rpb_pitch : p.rpb_elems;
    for (int i = tid; i < n; i += kThreads) bb.table[i] = 0.f;
  }
  return bb;
}

// The table's sums (every copy's, in order) into d rpb of head bb.h (after a barrier that follows
// every add), zeroing them; with p.d_rpb_part stored into this CTA's slot of the head instead.
template <int kThreads>
__device__ __forceinline__ void bias_flush(const Params& p, const BwdBias& bb, int tid) {
  if (p.d_rpb_global) return;  // the adds went to d rpb directly
  float* g = p.d_rpb + int64_t(bb.h) * p.rpb_stride[0];
  float* part = nullptr;
  if (p.d_rpb_part != nullptr)
    part = p.d_rpb_part +
           ((int64_t(grid_row()) * gridDim.x + blockIdx.x) * p.heads_per_kv +
            bb.h % p.heads_per_kv) *
               int64_t(p.rpb_elems);
  const int copies = bb.priv ? p.d_rpb_warps : 1;
  for (int i = tid; i < p.rpb_elems; i += kThreads) {
    float v = 0.f;
    for (int c = 0; c < copies; ++c) {
      float* t = bb.table + c * p.rpb_pitch + i;
      v += *t;
      *t = 0.f;
    }
    if (part != nullptr)
      part[i] = v;
    else if (v != 0.f)
      atomicAdd(g + i, v);
  }
}

// At the top of an iteration (after its first barrier) of query head h: a change of head flushes
// the previous head's sums; the barrier after it (the same branch on every thread) keeps new
// adds behind the zeroing.
template <int kThreads, class Sync = CtaSync>
__device__ __forceinline__ void bias_next_head(const Params& p, BwdBias& bb, int h, int tid,
                                               Sync sync = {}) {
  if (bb.acc != nullptr && h != bb.h) {
    if (p.d_rpb_global) {  // (no shared sums, no barrier)
      bb.acc = p.d_rpb + int64_t(h) * p.rpb_stride[0];
      bb.h = h;
      return;
    }
    bias_flush<kThreads>(p, bb, tid);
    bb.h = h;
    sync();
  }
}

// Shared memory at `addr` += v, a plain load and store: only this lane adds there in this
// instruction (the caller's __syncwarp orders the warp's later adds).
__device__ __forceinline__ void shared_add(float* ptr, float v) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  asm volatile(
      "{\n .reg .f32 x;\n ld.shared.f32 x, [%0];\n add.f32 x, x, %1;\n st.shared.f32 [%0], x;\n}\n" ::"r"(
          addr),
      "f"(v)
      : "memory");
}

// The diagonal sums of one key-row half's 8 x 8 block (see bias_grad_add): lane (g, t) gets the
// sum of its diagonal c = g - 2t when it is the diagonal's first lane (g < 2 or t == 0); lane
// (0, 3) keeps ds[1] of the diagonal -7 for itself.
__device__ __forceinline__ float diagonal_sum(const float (&ds)[2], int lane) {
  const int g = lane >> 2, t = lane & 3;
  // (g, t, 0) and (g + 1, t, 1) share a diagonal: lane + 4 holds the latter.
  const float v1_next = __shfl_down_sync(0xffffffffu, ds[1], 4);
  float w = ds[0] + (g < 7 ? v1_next : 0.f);
  // (0, t, 1) is on the diagonal of (1, t + 1, 0): lane - 5 holds it (t + 1 <= 3).
  const float v1_prev = __shfl_up_sync(0xffffffffu, ds[1], 5);
  if (g == 1 && t >= 1) w += v1_prev;
  // Along a diagonal: (g, t), (g + 2, t + 1), (g + 4, t + 2), (g + 6, t + 3).
  float o = __shfl_down_sync(0xffffffffu, w, 9);
  w += (g + 2 <= 7 && t + 1 <= 3) ? o : 0.f;
  o = __shfl_down_sync(0xffffffffu, w, 18);
  w += (g + 4 <= 7 && t + 2 <= 3) ? o : 0.f;
  return w;
}

// Adds this thread's dS^T values ds[half][j] (j = 0, 1: columns 2 (lane % 4) + j of an 8-query
// block; both key-row halves) to the table at their indices idx[half][j]. `diag`: the 8 key
// rows and the 8 query columns are each consecutive on the last axis (key and query tiles with a
// last extent of 8k), so the value of lane (g, t) (g = lane / 4, t = lane % 4) at column
// 2t + j has index idx(lane 0, j = 0) + g - 2t - j: a half's 64 values fall into 15 diagonals
// c = g - 2t - j, which shuffles sum first (both halves' in turn, independent chains), and one
// lane per diagonal adds (no two lanes of an add share an address: into the warp's own copy,
// `priv`, that is a plain load and store). Otherwise each value is added by itself: with
// atomics, or (`ordered`: into the warp's own copy for a deterministic call) lane by lane in
// lane order, so that the sums do not depend on the order of same-address atomics.
__device__ __forceinline__ void bias_grad_add(float* acc, bool priv, bool diag, bool ordered,
                                              const float (&ds)[2][2], const int (&idx)[2][2],
                                              int lane) {
  if (!diag) {
    if (ordered) {
      for (int l = 0; l < 32; ++l) {
        if (lane == l) {
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              if (ds[half][j] != 0.f) shared_add(acc + idx[half][j], ds[half][j]);
        }
        __syncwarp();
      }
      return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (ds[half][j] != 0.f) atomicAdd(acc + idx[half][j], ds[half][j]);
    return;
  }
  const int g = lane >> 2, t = lane & 3;
  const float w[2] = {diagonal_sum(ds[0], lane), diagonal_sum(ds[1], lane)};
  // The diagonal's first lane adds its sum; (0, 3, 1) has a diagonal of its own.
  const bool first = g < 2 || t == 0, own = g == 0 && t == 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (priv) {
      if (first && w[half] != 0.f) shared_add(acc + idx[half][0], w[half]);
      if (own && ds[half][1] != 0.f) shared_add(acc + idx[half][1], ds[half][1]);
      __syncwarp();  // the other half's adds may touch the same entries
    } else {
      if (first && w[half] != 0.f) atomicAdd(acc + idx[half][0], w[half]);
      if (own && ds[half][1] != 0.f) atomicAdd(acc + idx[half][1], ds[half][1]);
    }
  }
}

// P^T = exp2(S^T scale_log2 + bias log2(e) - LSE) and (kDs) dS^T = P^T (dP^T - Dsum) in place for
// query head h, the sub-tile's queries at local coordinates q0 + (the offsets of) its rows
// qrel[column] (bb.qrel from the sub-tile's first row), statistics stat[column]; with bb.acc,
// dS^T summed per table entry (bias_grad_add). Masked pairs (-inf) read no bias: their index may
// lie outside the table.
template <int kNB, bool kDs>
__device__ __forceinline__ void bias_softmax(const Params& p, const BwdBias& bb, int h,
                                             float (&s)[kNB][4], float (&dp)[kNB][4],
                                             const float2* stat, const int* qrel, const int* q0,
                                             int lane) {
  const float* tab = p.rpb + int64_t(h) * p.rpb_stride[0];
  const bool diag = p.tkv[kAxes - 1] % 8 == 0 && p.tq[kAxes - 1] % 8 == 0;
  int qbase = 0;
#pragma unroll
  for (int a = 0; a < kAxes; ++a) qbase += q0[a] * p.rpb_stride[1 + a];
  // Key row half's index at the tile's first query: kb - qbase.
  const int kq[2] = {bb.kb[0] - qbase, bb.kb[1] - qbase};
#pragma unroll
  for (int n = 0; n < kNB; ++n) {
    const int2 qr = *reinterpret_cast<const int2*>(qrel + n * 8 + 2 * (lane & 3));
    const int qcs[2] = {qr.x, qr.y};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 st = stat[n * 8 + 2 * (lane & 3) + j];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 2 * half + j;
        const int idx = kq[half] - qcs[j];
        const bool in = s[n][e] != -INFINITY;
        const float x =
            fmaf(in ? __ldg(tab + idx) : 0.f, 1.4426950408889634f, s[n][e] * p.scale_log2);
        const float pe = mma::fast_exp2(x - st.x);
        s[n][e] = pe;
        if (kDs) dp[n][e] = pe * (dp[n][e] - st.y);
      }
    }
    if (kDs && bb.acc != nullptr) {
      // (pe = 0 for masked pairs and rows without a query: their dS^T is 0)
      const float v[2][2] = {{dp[n][0], dp[n][1]}, {dp[n][2], dp[n][3]}};
      const int idx[2][2] = {{kq[0] - qcs[0], kq[0] - qcs[1]}, {kq[1] - qcs[0], kq[1] - qcs[1]}};
      bias_grad_add(bb.acc, bb.priv, diag, bb.priv && p.d_rpb_part != nullptr, v, idx, lane);
    }
  }
}

}  // namespace bwd
}  // namespace fna
