// Host: the backward's launch plan (what make_bwd_plan in bwd_choice.cu decides and the launchers
// consume) and the TMA maps of the warp-specialized dK / dV kernel's query tiles.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/tma.h"
#include "cuda/fused/kernel/common/bwd_params.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace bwd {

// TMA maps of the query tiles' Q and dO (on = 0: cp.async copies instead).
struct BwdTma {
  tma::TokenMap q, o;
  int on;
};

// Strides [batch, axis 0, axis 1, axis 2, head] of a token tensor (TMA maps, FwdParams).
inline void lift_strides(const TokStrides& s, int64_t (&out)[5]) {
  out[0] = s.b;
  for (int a = 0; a < kAxes; ++a) out[1 + a] = s.x[a];
  out[4] = s.h;
}

// The maps for the neighborhood launch of `p` (its query tile p.tq), or on = 0 with `why` where
// TMA cannot load the tiles: tensors or dilations TMA cannot describe (tma::token_map).
inline BwdTma bwd_tma_maps(const Params& p, std::string* why) {
  BwdTma t{};
  t.on = 0;
  const int dil[kAxes] = {p.geo.axis[0].dilation, p.geo.axis[1].dilation, p.geo.axis[2].dilation};
  // Q and dO span the query region (the whole grid without one): the maps describe the
  // tensors as they are (their pointers moved forward again by the region's offset, see
  // cuda_fused_backward), and the kernel's coordinates are global minus qlo; rows past the
  // region's end read as zeros (TMA's out-of-bounds fill).
  const int64_t len[5] = {p.batch, p.qhi[0] - p.qlo[0], p.qhi[1] - p.qlo[1], p.qhi[2] - p.qlo[2],
                          p.heads};
  auto data = [&](const void* shifted, const TokStrides& s) {  // 16-bit elements
    return fused::moved(shifted, fused::region_elements(p, s.x), 2);
  };
  int64_t sq[5], so[5];
  lift_strides(p.sq, sq);
  lift_strides(p.sdo, so);
  if (!tma::token_map(&t.q, data(p.q, p.sq), p.dim, len, sq, p.tq, dil, why) ||
      !tma::token_map(&t.o, data(p.d_o, p.sdo), p.dim_v, len, so, p.tq, dil, why))
    return t;
  t.on = 1;
  return t;
}

// One strip backward kernel the plan runs (configs/backward.h FNA_BWD_STRIP_CONFIGS): the head-dim
// columns its products cover (32, 64, 128; 0: the kernel does not run), its warp box, the box
// rows side by side, and its launch (the strip plan's CTAs, ring and TMA maps).
struct StripStep {
  int dim = 0, bh = 0, bw = 0, phases = 0;
  int split = 1;  // warps per box (2: dK / dV at head dim 128)
  fused::FwdLaunch launch{};
  double chunks = 0, computed = 0;  // the warps' 64-pair chunks and pairs per (batch, head)
  int warps() const { return 16 / (bw > 0 ? bw : 16) * phases * split; }
};

// The Hopper dQ kernel's step (fwd_sm90.cuh's dQ role, Tuning::bwd_dq_sm90): the plain Hopper
// forward's plan for the call (tiles, walk, CTAs) and the launcher of that configuration's dQ
// instance; `fp` holds the call's tensors as strip_params gives them for dQ, with the tiles.
struct Sm90DqStep {
  bool on = false;
  fused::FwdParams fp{};
  fused::FwdLaunch launch{};
  cudaError_t (*run)(const fused::FwdParams&, const fused::FwdLaunch&, const fused::StripBwd&,
                     const fused::DqTma&, cudaStream_t) = nullptr;
  fused::DqTma tma{};  // tma.fwd.on: tiles by TMA (Tuning::bwd_copy), dO's map in tma.dout
  size_t smem = 0;
  std::string name;  // fna_dq_sm90_<dtype>_d<head dim>_q<tile>_kv<tile>_w<warps>
};

// Everything the backward launchers consume: decided by make_bwd_plan (bwd_choice.cu).
struct BwdLaunch {
  fused::BwdFamily family = fused::BwdFamily::sm80;  // the dK / dV kernel
  int kv_rows = 128;           // sm90: keys per dK / dV tile (64 or 128; sm90ws: 128)
  int q_steps = 1;             // sm90: query tiles per dK / dV step (2: paired, head dim 64,
                               // 128 keys, no bias; Tuning::bwd_q_pairs)
  // The head-dim columns the dK / dV kernel's products cover: the padded head dim, or 32 where
  // max(D, D_v) <= 32 on the plain sm90 kernel with 64-key tiles (in the head-dim-64 layout).
  int dim_cols = 64;
  bool deterministic = false;  // dQ by its own kernel (sm80 only), else by atomics
  dim3 grid_dkdv, grid_add, grid_dq;  // neighborhood dK / dV, additional keys, dQ kernel
  size_t smem = 0;             // the most dynamic shared memory one of its kernels takes
  size_t bias_smem = 0;        // with a bias: the dK / dV kernel's d rpb table (shared memory)
  bool d_rpb_global = false;   // with a bias: the table does not fit shared memory, d rpb takes
                               // the dK / dV kernel's adds directly (Params::d_rpb_global)
  int d_rpb_warps = 0;         // with a bias: a table copy per warp (Params::d_rpb_warps)
  int rpb_pitch = 0;           // floats between those copies
  size_t rpb_part_bytes = 0;   // deterministic with a bias: the CTAs' d rpb slots
                               // (Params::d_rpb_part)
  BwdTma tma{};                // sm90ws: the neighborhood launch's maps (on = 0: cp.async)
  // dQ by the strip dQ kernel after a dK / dV kernel without dQ (Tuning::bwd_dq_strip; no
  // accumulator, no atomics, no conversion), and dK / dV by the strip dK / dV kernel instead of
  // the Hopper one (Tuning::bwd_strip; needs the strip dQ).
  StripStep dq_strip, dkdv_strip;
  // dQ by the Hopper dQ kernel after the plain Hopper dK / dV kernel without its dQ.
  Sm90DqStep dq_sm90;
  // The dK / dV kernel writes no dQ (a dQ kernel follows it: strip or Hopper).
  bool dq_after() const { return dq_strip.dim != 0 || dq_sm90.on; }
};

// A strip backward kernel's FwdParams from the backward's (the problem block, no LSE output, no
// bias): dQ (role dq) takes Q as its box tensor, K and V as its rings and writes dQ; dK / dV
// (role dkdv, no GQA: heads_per_kv 1) takes K as its box tensor, Q and dO as its rings and writes
// dK.
inline fused::FwdParams strip_params(const Params& p, fused::StripRole role) {
  fused::FwdParams f{};
  static_cast<fused::ProblemBlock&>(f) = p;
  f.rpb = nullptr;
  f.lse = nullptr;
  if (role == fused::StripRole::dq) {
    f.q = p.q, f.k = p.k, f.v = p.v, f.o = p.dq;
    lift_strides(p.sq, f.q_stride);
    lift_strides(p.sk, f.k_stride);
    lift_strides(p.sv, f.v_stride);
    lift_strides(p.sdq, f.o_stride);
  } else {
    f.q = p.k, f.k = p.q, f.v = p.d_o, f.o = p.dk;
    lift_strides(p.sk, f.q_stride);
    lift_strides(p.sq, f.k_stride);
    lift_strides(p.sdo, f.v_stride);
    lift_strides(p.sdk, f.o_stride);
  }
  return f;
}

// Its StripBwd: dO (dq) or V and dV (dkdv), and the statistics.
inline fused::StripBwd strip_bwd(const Params& p, fused::StripRole role) {
  fused::StripBwd b{};
  const bool dq = role == fused::StripRole::dq;
  b.a2 = dq ? p.d_o : p.v;
  lift_strides(dq ? p.sdo : p.sv, b.a2_stride);
  b.out2 = dq ? nullptr : p.dv;
  lift_strides(p.sdv, b.out2_stride);
  b.stats = p.stats;
  return b;
}

}  // namespace bwd
}  // namespace fna
