// The plans of the cuda-fused backend: every decision about what a call runs is made here, on
// the host, from the problem, the device's cached properties and Options (config names and
// Tuning), and nowhere else. A plan is what the launch consumes (the launchers are switches on
// it) and what fna::fused_plan reports.
#pragma once

#include <string>

#include "core/launch_record.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "fna/fna.h"

namespace fna {
namespace fused {

// Forward kernel families (the `family` part of a configuration's name).
enum class FwdFamily : int {
  sm80,    // fna_fwd_sm80_*: mma.sync, every sm_80+ device (fwd_sm80.cuh)
  sm90,    // fna_fwd_sm90_*: wgmma, plain schedule (fwd_sm90.cuh)
  sm90ws,  // fna_fwd_sm90ws_*: wgmma, warp-specialized (fwd_sm90_ws.cuh)
  box,     // fna_fwd_box_*: warp boxes of 4x4 queries over their own windows (fwd_box.cuh)
  strip,   // fna_fwd_strip_*: the box forward on a CTA walking a column strip (fwd_strip.cuh)
  simt,    // fna_fwd_simt_*: CUDA cores, one query per thread, exactly the needed pairs (fwd_simt.cuh)
};
const char* family_name(FwdFamily f);

struct FwdPlan {
  FwdFamily family = FwdFamily::sm80;
  std::string config;         // the configuration's name (its table row)
  int q[kAxes] = {1, 1, 1};   // query tile (box / strip: the CTA's rows in flight x columns)
  int kv[kAxes] = {1, 1, 1};  // key tile (box / strip: the warp box)
  int warps = 0;
  cudaError_t (*launcher)(const FwdParams&, const FwdLaunch&, cudaStream_t) = nullptr;
  bool tma = false;           // copy engine: TMA (else cp.async)
  FwdLaunch launch;           // grid, shared memory, flags and maps the launcher consumes
  int walk[kAxes] = {2, 1, 0};  // CTA tile walk, lifted axes fastest first
  double visited_tiles = 0;   // per (batch, head) pair of the whole problem: see FusedPlan
  double unmasked_fraction = 0;
  double needed_fraction = 0;
};

// The backward's dK / dV kernel families.
enum class BwdFamily : int { sm80, sm90, sm90ws };
const char* family_name(BwdFamily f);

}  // namespace fused

namespace detail {

// The forward plan for `p` under `opt` on device opt.device_index. `fp`: the call's parameters
// (tensor pointers and strides; dense placeholders when planning without tensors), completed
// here with the tile counts and walk. Errors: invalid_argument for options that contradict each
// other or the problem, unsupported for what the fused forward cannot run (auto falls back).
Status make_fwd_plan(const Problem& p, const Options& opt, fused::FwdParams* fp,
                     fused::FwdPlan* plan);


}  // namespace detail
}  // namespace fna
