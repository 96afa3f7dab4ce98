// The SIMT forward's part of the forward plan (kernel/simt/fwd_simt.cuh): where it applies and
// its modelled time, next to the tensor-core families' (fwd_cost.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/kernel/common/simt_plan.h"
#include "cuda/fused/plan/fwd_cost.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace detail {
namespace fwd_simt {

using fused::FwdEntry;

// Whether the SIMT forward takes this problem on this device (its plan in `sp`); `why` says why
// not.
inline bool applies(const FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                    const DeviceProps& dev, fused::SimtPlan* sp, std::string* why) {
  if (p.num_additional > 0) {
    *why = "num_additional=" + std::to_string(p.num_additional) +
           " (the SIMT forward takes no additional keys)";
    return false;
  }
  if (p.has_query_region()) {
    *why = "a query region (query_offset / query_shape; the SIMT forward computes whole grids)";
    return false;
  }
  *sp = fused::simt_plan(geo, e.q, e.dim);
  if (sp->smem > static_cast<size_t>(dev.smem_optin)) {
    *why = "its halo of " + std::to_string(sp->halo_rows) + " key rows needs " +
           std::to_string(sp->smem) + " bytes of shared memory, the device has " +
           std::to_string(dev.smem_optin);
    return false;
  }
  return true;
}

// A thread's 8-key steps: the average window over 8, rounded up.
inline double steps(const Problem& p, const fused::Geometry& geo) {
  const double tokens = double(p.tokens());
  return tokens > 0 ? std::ceil(fused::needed_pairs(geo) / tokens / fused::kSimtKeys) : 0;
}

// Modelled time (fwd_cost.h's unit and form, kSimtModel): each CTA runs `steps` steps of
// q_size x 8 keys x D multiply-adds for S (and as many for O).
inline double cost(const FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                   const fused::SimtPlan& sp, const DeviceProps& dev) {
  const double ctas = fwd_cost::ctas_of(p, geo, e.q);
  if (ctas <= 0) return 0;
  return fwd_cost::model_cost(
      fwd_cost::kSimtModel, ctas, steps(p, geo),
      double(e.q_size()) * double(e.kv_size()) * double(e.dim),
      fwd_cost::resident_ctas(fused::FwdFamily::simt, sp.smem, e.warps, dev, e.dim), dev);
}

}  // namespace fwd_simt
}  // namespace detail
}  // namespace fna
