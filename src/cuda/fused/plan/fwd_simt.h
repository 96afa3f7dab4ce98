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
  *sp = fused::simt_plan(geo, e.q, e.dim);
  if (sp->smem > static_cast<size_t>(dev.smem_optin)) {
    *why = "its halo of " + std::to_string(sp->halo_rows) + " key rows needs " +
           std::to_string(sp->smem) + " bytes of shared memory, the device has " +
           std::to_string(dev.smem_optin);
    return false;
  }
  return true;
}

// Modelled time (microseconds on an H200, the unit of fwd_cost.h's models) of the SIMT forward:
// the busiest SM's CTAs, each of `warps` warps walking the average window, at about 1.3 * kD SM
// cycles per warp and key (per key a warp reads kD / 4 16-byte K and V chunks per lane, kD / 2
// shared-memory wavefronts each for K and V, and issues about 4 kD instructions: widening and
// FMAs for S and O), plus per wave of resident CTAs the halo copy's latency.
constexpr double kSimtCyclesPerKeyDim = 1.3;
constexpr double kSimtWaveUs = 1.5;
constexpr double kSimtClockMhz = 1980.0;

inline double cost(const FwdEntry& e, const Problem& p, const fused::Geometry& geo,
                   const fused::SimtPlan& sp, const DeviceProps& dev) {
  const double ctas = fwd_cost::ctas_of(p, geo, e.q);
  if (ctas <= 0) return 0;
  const double tokens = double(p.tokens());
  const double keys = tokens > 0 ? fused::needed_pairs(geo) / tokens : 0;
  const int threads = e.q_size();
  const int by_smem = int((size_t(dev.smem_optin) + 1024) / (sp.smem + 1024));
  const int by_threads = std::max(1, 2048 / threads);
  const int resident = std::max(1, std::min(by_smem, by_threads));
  const double busiest = std::ceil(ctas / double(std::max(dev.sms, 1)));
  const double waves = std::ceil(busiest / resident);
  return waves * kSimtWaveUs +
         busiest * (threads / 32.0) * keys * e.dim * kSimtCyclesPerKeyDim / kSimtClockMhz;
}

}  // namespace fwd_simt
}  // namespace detail
}  // namespace fna
