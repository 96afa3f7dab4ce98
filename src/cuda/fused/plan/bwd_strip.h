// Host: the plan of the strip backward kernels (fwd_strip.cuh with StripRole::dq / dkdv), part of
// make_bwd_plan (backward.cu): whether they run, their warp boxes, CTAs and TMA maps, and names.
#pragma once

#include <string>

#include "core/backends.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/plan/bwd_plan.h"

namespace fna {
namespace bwd {

// The strip backward kernels (BwdLaunch::dq_strip, dkdv_strip), decided after the rest of the
// plan (`named`: a backward configuration was named); bwd_strip.cu says when each runs.
Status plan_strips(const Problem& pr, const Options& opt, bool named,
                   const detail::DeviceProps& dev, const Params& p, BwdLaunch* l);

// A strip kernel's name: fna_<dq|bwd>_strip_<dtype>_d<cols>_b<box>_w<warps>.
std::string strip_name(const StripStep& s, fused::StripRole role, DType dtype);

}  // namespace bwd
}  // namespace fna
