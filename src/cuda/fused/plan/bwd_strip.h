// Host: the plan of the backward's kernels after the Hopper dK / dV kernel's own choice, part of
// make_bwd_plan (bwd_choice.cu): the strip kernels (fwd_strip.cuh with StripRole::dq / dkdv) and
// the Hopper dQ kernel (fwd_sm90.cuh's dQ role): whether they run, their tiles, CTAs and TMA
// maps, and names.
#pragma once

#include <string>

#include "core/backends.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/plan/bwd_plan.h"

namespace fna {
namespace bwd {

// The strip backward kernels (BwdLaunch::dq_strip, dkdv_strip) and the Hopper dQ kernel
// (dq_sm90), decided after the rest of the plan (`named`: a backward configuration was named;
// `dq_planned`: the Hopper dQ kernel's step where make_bwd_plan has planned it for this call, else
// null); bwd_strip.cu says when each runs.
Status plan_strips(const Problem& pr, const Options& opt, bool named,
                   const detail::DeviceProps& dev, const Params& p, const Sm90DqStep* dq_planned,
                   BwdLaunch* l);

// The Hopper dQ kernel's step for the call (BwdLaunch::dq_sm90; bwd_dq_sm90.cu): false with `why`
// where it does not run the call.
bool plan_dq_sm90(const Problem& pr, const Options& opt, const detail::DeviceProps& dev,
                  const Params& p, Sm90DqStep* out, std::string* why);

// A strip kernel's name: fna_<dq|bwd>_strip_<dtype>_d<cols>_b<box>_w<warps>.
std::string strip_name(const StripStep& s, fused::StripRole role, DType dtype);

}  // namespace bwd
}  // namespace fna
