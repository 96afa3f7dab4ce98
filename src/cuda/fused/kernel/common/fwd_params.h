// Device-side parameters of the fused forward kernel: built once on the host from the public
// (Problem, ForwardArgs, Options) in forward.cu, passed by value to every instantiation.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/tma.h"
#include "cuda/fused/kernel/common/bias_stage.h"
#include "cuda/fused/kernel/common/problem_block.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace fused {

// The problem block (geometry, sizes, scale: problem_block.h) and the forward's tensors and tiles.
struct FwdParams : ProblemBlock {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // null: not requested
  const void* add_k;
  const void* add_v;
  // Strides in elements, lifted to [batch, axis 0, axis 1, axis 2, head] (unit stride on the last
  // dim is a precondition); lifted axes have stride 0.
  int64_t q_stride[5], k_stride[5], v_stride[5], o_stride[5], lse_stride[5];
  // Additional keys / values: [batch, token, head].
  int64_t add_k_stride[3], add_v_stride[3];
  int q_tiles[kAxes];  // query tiles per axis over the largest group (its part of the query
                       // region, with one)
  int q_tiles_total;
  int q_div[kAxes];    // tile walk (tiling.cuh walk_divisors)
  // fwd_tile's divisions by the three values above as multiply-and-shift (set with them).
  FastDiv div_tiles_total, div_q_div[kAxes], div_q_tiles[kAxes];
  // With a bias, the plan's choice for the sm80 / plain sm90 kernels: 1 = each CTA copies its
  // head's table, times rpb_inv_scale (1 / scale), into shared memory after the kernel's own
  // (stage_bias), and adds it to the raw scores; 0 = the scores read the table in global memory.
  int rpb_staged;
  float rpb_inv_scale;
  // Staged with guard zones (rank <= 2): rpb_front floats of shared memory before the table and
  // enough after it that every (query, key) pair of a CTA's tiles addresses memory of the copy,
  // so the scores take the bias before the mask, without a per-score test (add_bias_guarded);
  // 0: no guard, the scores the mask removed read nothing.
  int rpb_front;
  // The plain sm90 kernel at rank 3 (rpb_staged 0): 1 = each key tile's slice of the table,
  // times rpb_inv_scale, copied into shared memory after the kernel's own and preloaded into
  // the scores' accumulators (fwd_bias.cuh BiasSlice, as the warp-specialized kernel always does).
  int rpb_tiles;
};



// TMA maps the plan builds for a launch (on = 0: the kernel copies by cp.async instead): the
// warp-specialized Hopper forward's Q, K and V tiles, the strip forward's K and V bands.
struct FwdTma {
  tma::TokenMap q, k, v;
  int on;
};
// The Hopper dQ kernel's maps (fwd_sm90.cuh's dQ role): the plain forward's (fwd.on = 0: cp.async
// copies) and dO's, described as Q's.
struct DqTma {
  FwdTma fwd;
  tma::TokenMap dout;
};
// The strip backward kernels' tensors beyond FwdParams (fwd_strip.cuh, roles StripRole::dq and
// dkdv). FwdParams carries the box tensor (q: Q for dQ, K for dK / dV), the ring tensors (k, v:
// K and V for dQ, Q and dO for dK / dV) and the first output (o: dQ, or dK); here the second box
// tensor `a2` (dO, or V), the second output `out2` (dV; none for dQ), their strides ([batch,
// axis 0, axis 1, axis 2, head]), and the backward's per-query statistics, one float2 per (batch,
// token, head) row: {LSE log2(e), rowsum(dO O) - d_lse} (bwd_stats.cuh).
struct StripBwd {
  const void* a2;
  int64_t a2_stride[5];
  void* out2;
  int64_t out2_stride[5];
  const float2* stats;
};
struct StripTma {
  tma::TokenMap k, v;
  int on;
};

// Everything a forward launcher needs beyond FwdParams, decided by the plan (plan.h) and
// consumed as is: the launchers decide nothing.
struct FwdLaunch {
  int64_t ctas = 0;         // work items: batch x heads x dilation groups x query tiles (strips
                            // x row segments for the strip forward)
  unsigned grid = 0;        // CTAs launched: `ctas`, or one per SM when persistent
  size_t smem = 0;          // dynamic shared memory per CTA (bytes)
  bool persistent = false;  // warp-specialized: CTAs take work items from a counter
  bool spread = false;      // plain Hopper: whole-row copies per warp instruction
  bool wg_skip = false;     // warp-specialized: warpgroups visit only their own rows' key tiles
  int halo_cap = 0;         // box / SIMT forwards: halo rows their shared memory holds
  StripParams strip{};      // strip forward: strips, row segments, ring
  FwdTma tma{};             // Hopper forwards' maps (plain and warp-specialized)
  StripTma strip_tma{};     // strip forward's maps
};

// The launchers, one per kernel family (each a switch on `l`; they return the launch's error).
// sm80: mma.sync (fwd_sm80.cuh; kMT 16-row m-tiles per warp).
template <class T, int kD, int kRank, int kMT, class QT, class KT>
cudaError_t launch_fwd(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, int kRank, int kMT, class QT, class KT>
size_t fwd_smem_bytes();

// sm90 (plain) and sm90ws (warp-specialized): wgmma, sm_90a (fwd_sm90.cuh / fwd_sm90_ws.cuh),
// built when FNA_WITH_SM90 is defined.
template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_fwd_sm90(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90_smem_bytes();
// The backward's dQ kernel on a plain sm90 configuration's tiles (fwd_sm90.cuh's dQ role): `p`
// as strip_params gives it for dQ (Q, K, V, dQ in o, no LSE, no bias), `l` the plain forward
// plan's launch, `bw` dO (a2) and the statistics, `tm` the TMA maps (tm.fwd.on = 0: cp.async).
template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_dq_sm90(const FwdParams& p, const FwdLaunch& l, const StripBwd& bw,
                           const DqTma& tm, cudaStream_t stream);
template <class T, int kD, int kRank, class QT, class KT>
size_t dq_sm90_smem_bytes();
template <class T, int kD, int kRank, class QT, class KT>
cudaError_t launch_fwd_sm90ws(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90ws_smem_bytes();
template <class T, int kD, int kRank, class QT, class KT>
size_t fwd_sm90ws_bias_smem_bytes();

// The box forward of fwd_box.cuh (rank 2, 16-bit, mma.sync); its shared memory depends on the
// problem (box_plan), the size below is a lower bound.
template <class T, int kD, class QT>
cudaError_t launch_fwd_box(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, class QT>
size_t fwd_box_smem_bytes();

// The SIMT forward of fwd_simt.cuh (ranks 1-3, 16-bit, CUDA cores); its shared memory comes from
// simt_plan (FwdLaunch::halo_cap rows), the size below is a lower bound.
template <class T, int kD, int kRank, class QT>
cudaError_t launch_fwd_simt(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, int kRank, class QT>
size_t fwd_simt_smem_bytes();

// The strip forward of fwd_strip.cuh (rank 2, 16-bit, mma.sync; kPhases rows of kBH x kBW warp
// boxes side by side); its shared memory comes from strip_plan, the size below is a lower bound.
template <class T, int kD, int kPhases, int kBH, int kBW>
cudaError_t launch_fwd_strip(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream);
template <class T, int kD, int kPhases, int kBH, int kBW>
size_t fwd_strip_smem_bytes();
// The backward's strip kernels (fwd_strip.cuh, kRole: StripRole::dq or dkdv as int; rank 2,
// 16-bit, sm_90a builds): `p` the box tensor, ring tensors and first output, `l` a strip plan's
// launch, `bw` the second box tensor and output and the statistics (StripBwd).
template <class T, int kRole, int kD, int kPhases, int kBH, int kBW>
cudaError_t launch_bwd_strip(const FwdParams& p, const FwdLaunch& l, const StripBwd& bw,
                             cudaStream_t stream);

}  // namespace fused
}  // namespace fna
