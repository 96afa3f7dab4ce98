// Which forward configuration a call runs (fwd_choice.cu): the named one or the heuristic's, and
// the candidate lists it chooses among.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/runtime.cuh"
#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "fna/fna.h"

namespace fna {
namespace detail {

// The entries of the smallest compiled head dim that holds `need` (max(D, D_v)).
std::vector<const fused::FwdEntry*> candidates(int rank, DType dtype, bool tf32, int64_t need);
// Those plus, where that bucket has no wgmma kernel (head dims 16, 32), the smallest bucket that
// has one: what fna::fused_configs lists.
std::vector<const fused::FwdEntry*> listed_candidates(int rank, DType dtype, bool tf32,
                                                      int64_t need);
// What the plan chooses among on device `dev` (the listed ones on Hopper, the bucket elsewhere).
std::vector<const fused::FwdEntry*> plan_candidates(int rank, DType dtype, bool tf32, int64_t need,
                                                    const DeviceProps& dev);
fused::Geometry geometry_of(const Problem& p);
// Whether the box / strip forward takes the problem on this device (its plan; `why` if not).
bool box_applies(const fused::FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                 int smem_optin, fused::BoxPlan* bp, std::string* why);
bool strip_applies(const fused::FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                   const DeviceProps& dev, fused::StripPlan* sp, std::string* why);
// Options::config's entry (an error when it does not fit the call or the device).
Status named_config(const Problem& p, const Options& opt, const fused::Geometry& geo,
                    const DeviceProps& dev, const fused::FwdEntry** out);
// The heuristic's entry: the candidate of the least modelled time (fwd_cost.h, fwd_simt.h).
Status heuristic_config(const Problem& p, const Options& opt, const fused::Geometry& geo,
                        const DeviceProps& dev, const fused::FwdEntry** out);

}  // namespace detail
}  // namespace fna
