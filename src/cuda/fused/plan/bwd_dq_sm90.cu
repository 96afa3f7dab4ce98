// Host: the plan of the Hopper dQ kernel (fwd_sm90.cuh's dQ role, BwdLaunch::dq_sm90).
#include <algorithm>
#include <string>

#include "cuda/fused/configs/forward_table.h"
#include "cuda/fused/plan/bwd_strip.h"
#include "cuda/fused/plan/fwd_tma.h"

namespace fna {
namespace bwd {

// The Hopper dQ kernel runs the plain Hopper forward's tiles and walk: the forward's plan for the
// call restricted to that schedule (Tuning::fwd_schedule = plain, nothing else of the caller's
// forward tuning) chooses them by its cost model, whose per-tile work the dQ kernel shares (S
// and P V there; S, dP and dS K here). What it does not take: a bias (it adds none), float32,
// head dims past 128, rows that are not 16-byte aligned, a device or build without sm_90a.
bool plan_dq_sm90(const Problem& pr, const Options& opt, const detail::DeviceProps& dev,
                  const Params& p, Sm90DqStep* out, std::string* why) {
  *out = Sm90DqStep{};
  if (pr.rpb) return *why = "a relative positional bias", false;
  if (pr.dtype == DType::f32) return *why = "float32 tensors (it takes 16-bit ones)", false;
  if (std::max(pr.dim, pr.dim_v) > 128)
    return *why = "head dim " + std::to_string(std::max(pr.dim, pr.dim_v)) + " (at most 128)",
           false;
  if (!p.aligned) return *why = "rows that are not 16-byte aligned", false;
  if (!dev.hopper())
    return *why = "compute capability " + std::to_string(dev.cc_major) + "." +
                  std::to_string(dev.cc_minor) + " (it runs on 9.0)",
           false;
  fused::FwdParams fp = strip_params(p, fused::StripRole::dq);
  fp.add_k = p.add_k, fp.add_v = p.add_v;
  const int64_t sak[3] = {p.sak.b, p.sak.n, p.sak.h}, sav[3] = {p.sav.b, p.sav.n, p.sav.h};
  std::copy(sak, sak + 3, fp.add_k_stride);
  std::copy(sav, sav + 3, fp.add_v_stride);
  Options o;
  o.device_index = opt.device_index;
  o.scale = opt.scale;
  o.tuning.fwd_schedule = FwdSchedule::plain;
  // Copies: Tuning::bwd_copy; automatic: cp.async (TMA ran forward+backward 0.98-1.0x as fast:
  // 1d-small, 3d-small, dinat-t, nat-late, H200, docs/benchmarks.md).
  const CopyEngine copy = opt.tuning.bwd_copy;
  o.tuning.fwd_copy = copy == CopyEngine::tma ? CopyEngine::automatic : CopyEngine::cp_async;
  fused::FwdPlan fplan;
  const Status st = detail::make_fwd_plan(pr, o, &fp, &fplan);
  if (!st.ok()) return *why = st.message, false;
  fused::DqTma tm{};
  tm.fwd = fplan.launch.tma;
  std::string no_tma = tm.fwd.on ? "" : "its Q, K and V tiles";
  if (tm.fwd.on) {
    // dO as Q (its map's boxes one warpgroup's 64 rows, as the forward plan made Q's).
    const fused::StripBwd bw = strip_bwd(p, fused::StripRole::dq);
    int part[kAxes];
    std::string w = "query tile not in 64-row boxes";
    if (!fused::warpgroup_box(fplan.q, part) ||
        !fused::query_map(&tm.dout, fp, bw.a2, fp.dim_v, bw.a2_stride, part, &w)) {
      tm.fwd.on = 0;
      no_tma = "dO: " + w;
    }
  }
  if (!tm.fwd.on && copy == CopyEngine::tma)
    return *why = "tuning bwd_copy='tma': TMA cannot load " + no_tma, false;
  const fused::FwdEntry* entry = nullptr;
  for (const fused::FwdEntry& e : fused::forward_table())
    if (e.launch_dq != nullptr && e.name() == fplan.config) entry = &e;
  if (entry == nullptr || fplan.family != fused::FwdFamily::sm90)  // (not reached: built with it)
    return *why = "no Hopper dQ instance for " + fplan.config, false;
  out->on = true;
  out->fp = fp;
  out->launch = fplan.launch;
  out->tma = tm;
  out->run = entry->launch_dq;
  out->smem = entry->dq_smem();
  if (out->smem > static_cast<size_t>(dev.smem_optin)) {
    *why = std::to_string(out->smem) + " bytes of shared memory (the device has " +
           std::to_string(dev.smem_optin) + ")";
    *out = Sm90DqStep{};
    return false;
  }
  out->name = "fna_dq_sm90_" + fplan.config.substr(std::string("fna_fwd_sm90_").size());
  return true;
}

}  // namespace bwd
}  // namespace fna
