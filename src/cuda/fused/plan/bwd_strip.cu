// Host: the plan of the strip backward kernels (bwd_strip.h).
#include "cuda/fused/plan/bwd_strip.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "core/neighborhood.h"
#include "cuda/fused/configs/backward_table.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "cuda/fused/plan/fwd_tma.h"

namespace fna {
namespace bwd {

namespace {

Status unsupported(const std::string& why) {
  return {Code::unsupported, "backend=cuda-fused backward: " + why};
}

// What rules a call out of the strip backward kernels ("" where they take it): rank 2, 16-bit
// (the plan runs them with the Hopper kernels), head dims up to 128, no bias, additional keys or
// query region, rows 16-byte aligned.
std::string strip_bwd_rules(const Problem& pr, const Params& p) {
  if (pr.rpb) return "a relative positional bias";
  if (p.num_add > 0) return "additional keys";
  if (p.region) return "a query region";
  if (!p.aligned) return "rows that are not 16-byte aligned";
  if (pr.rank != 2) return "rank " + std::to_string(pr.rank) + " (they take rank 2)";
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  if (dmax > 128) return "head dim " + std::to_string(dmax) + " (at most 128)";
  return "";
}

// The strip backward kernel of `role` over `kd` head-dim columns into *out: the warp box (2x8 or
// 4x4) of fewer 64-key chunks where the strip plan takes it (inverse windows for dK / dV), its
// warps (configs/backward.h FNA_BWD_STRIP_CONFIGS: 12 for dQ at head dim 32, else 8), CTAs and
// copies (`copy`: Tuning::bwd_copy; automatic: TMA bands where the maps describe the tensors);
// false with `why`.
bool plan_strip_step(const Params& p, const detail::DeviceProps& dev, fused::StripRole role,
                     int kd, CopyEngine copy, StripStep* out, std::string* why) {
  const bool inverse = role == fused::StripRole::dkdv;
  const int warps = role == fused::StripRole::dq && kd == 32 ? 12 : 8;
  const int split = inverse && kd == 128 ? 2 : 1;  // fwd_strip.cuh strip_split
  fused::StripPlan best;
  int bh = 0, bw = 0;
  for (const int box_h : {2, 4}) {
    // 16 / box_w boxes x phases x split
    const int box_w = 16 / box_h, phases = warps * box_w / 16 / split;
    const fused::StripPlan sp =
        fused::strip_plan(p.geo, box_h, box_w, phases, dev.sms, dev.smem_optin,
                          double(p.batch) * double(p.heads), kd, false, inverse);
    if (!sp.ok) {
      if (why->empty()) *why = sp.why;
      continue;
    }
    if (!best.ok || sp.box.chunks < best.box.chunks) best = sp, bh = box_h, bw = box_w;
  }
  if (!best.ok) return false;
  const int64_t ctas = int64_t(p.batch) * p.heads * p.groups * best.sp.strips * best.sp.segs;
  if (ctas > INT32_MAX) {
    *why = std::to_string(ctas) + " CTAs";
    return false;
  }
  *out = StripStep{};
  out->dim = kd, out->bh = bh, out->bw = bw, out->phases = warps * bw / 16 / split;
  out->split = split;
  fused::FwdLaunch& fl = out->launch;
  fl.strip = best.sp;
  fl.smem = best.smem;
  fl.ctas = ctas;
  fl.grid = static_cast<unsigned>(ctas);
  // TMA bands (Tuning::bwd_copy) where the maps describe the tensors.
  if (copy != CopyEngine::cp_async) {
    std::string no_tma;
    fl.strip_tma = fused::strip_tma_maps(strip_params(p, role), best.sp, &no_tma);
    if (!fl.strip_tma.on && copy == CopyEngine::tma) {
      *why = "tuning bwd_copy='tma': TMA cannot load its bands: " + no_tma;
      return false;
    }
  }
  out->chunks = best.box.chunks;
  out->computed = best.box.computed;
  return true;
}

// The strip dQ kernel alone, after the plain Hopper dK / dV kernel (plan_strips): `rules` what
// rules the strip kernels out ("" where nothing does), `kd` the head-dim columns, `narrowest` the
// narrowest dilation group on the last axis.
Status plan_dq_strip(const Tuning& t, const detail::DeviceProps& dev, const Params& p,
                     const std::string& rules, int kd, int narrowest, BwdLaunch* l) {
  std::string why;
  if (t.bwd_dq_strip == Switch::off) return Status::Ok();
  auto no = [&](const std::string& w) {
    return t.bwd_dq_strip == Switch::on
               ? unsupported("tuning bwd_dq_strip='on': the strip dQ kernel does not take " + w)
               : Status::Ok();
  };
  if (l->family != fused::BwdFamily::sm90)
    return no("this call: it follows the plain Hopper dK / dV kernel (sm90), the plan runs " +
              std::string(fused::family_name(l->family)));
  if (l->q_steps != 1) return no("paired query tiles (tuning bwd_q_pairs)");
  if (!t.bwd_walk.empty()) return no("tuning bwd_walk (its CTAs walk strips)");
  if (!rules.empty()) return no(rules);
  // Automatic: head dims above 32 and dilation groups at least a strip wide on the last axis.
  // Forward+backward with it over without (tools/experiments/tuning_ab.py, H200, 2026-11-27):
  // 2d-nat 0.961, 2d-k3 0.956, 2d-k7 0.964; at head dim 32, whose float32 atomics cover 32
  // columns, nat-t 1.085 and nat-late 1.16; dinat-t (7-column dilation groups in 16-column
  // strips) 2.23.
  if (t.bwd_dq_strip == Switch::automatic && (kd == 32 || narrowest < fused::kStripCols))
    return Status::Ok();
  StripStep dq;
  if (!plan_strip_step(p, dev, fused::StripRole::dq, kd, t.bwd_copy, &dq, &why)) return no(why);
  l->dq_strip = dq;
  return Status::Ok();
}

}  // namespace

// The strip backward kernels (BwdLaunch::dq_strip, dkdv_strip), decided after the rest of the
// plan. dQ by the strip dQ kernel (Tuning::bwd_dq_strip): after the plain Hopper dK / dV kernel
// without its dQ, the strip forward's CTAs recompute S and dP per 16-query warp box over its K /
// V halo rows and write dQ, instead of the dK / dV kernel's float32 atomics into an accumulator
// the statistics kernel zeroes and a last pass converts. dK / dV by the strip dK / dV kernel
// (Tuning::bwd_strip): boxes of 16 keys against the query rows of their inverse neighborhoods,
// no GQA, in place of the plan's own choice of kernel (not a backward_config or bwd_kernel); it
// needs the strip dQ kernel (dQ has no accumulator then). The two add nothing by atomics, so they
// also serve deterministic calls. Where neither strip dQ kernel runs after the plain Hopper dK /
// dV kernel, the Hopper dQ kernel may (Tuning::bwd_dq_sm90, plan_dq_sm90): deterministic calls
// that make_bwd_plan gave the plain Hopper kernel, or where tuning asks. `on` asks for a kernel
// (unsupported where it does not apply), `off` never, automatic as measured below.
Status plan_strips(const Problem& pr, const Options& opt, bool named,
                   const detail::DeviceProps& dev, const Params& p, const Sm90DqStep* dq_planned,
                   BwdLaunch* l) {
  const Tuning& t = opt.tuning;
  l->dq_strip = l->dkdv_strip = StripStep{};
  const std::string rules = strip_bwd_rules(pr, p);
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  const int kd = dmax <= 32 ? 32 : dmax <= 64 ? 64 : 128;
  std::string why;
  // The narrowest dilation group on the last axis: a strip's 16 columns over fewer waste most of
  // its work.
  int narrowest = p.geo.axis[2].length;
  for (int g = 0; g < p.geo.axis[2].dilation; ++g)
    narrowest = std::min(narrowest, nbr::group_length(p.geo.axis[2], g));
  // The strip kernels are built with the Hopper ones (sm_90a) and run on 9.0.
  const bool hopper = dev.hopper() && sm90_built(pr.dtype, kd <= 64 ? 64 : 128,
                                                 fused::BwdFamily::sm90);
  // dK / dV. Automatic: head dim 128 (padded) where dilation groups are at least a strip wide.
  // Forward+backward with the strip dK / dV and dQ kernels over the plan's Hopper kernels
  // (tools/experiments/tuning_ab.py, H200, 2026-11-27): 2d-k3 0.841, 2d-k7 0.948; at head dim 32
  // nat-t 1.03, nat-late 1.18, dinat-t (7-column groups) 3.86. In deterministic mode (the strip
  // kernels add nothing by atomics; the alternative is the sm80 kernels with a second dQ pass)
  // at every head dim where the groups are a strip wide.
  const bool dkdv_auto =
      narrowest >= fused::kStripCols && (opt.deterministic ? hopper
                                                           : kd == 128 &&
                                                                 l->family != fused::BwdFamily::sm80);
  // Tuning the strip kernels would not honour (the Hopper kernels' walk and paired tiles).
  const bool other_tuning = !t.bwd_walk.empty() || t.bwd_q_pairs != Switch::automatic;
  if (t.bwd_strip == Switch::on || (t.bwd_strip == Switch::automatic && dkdv_auto && !named &&
                                    t.bwd_kernel == BwdKernel::automatic && !other_tuning &&
                                    t.bwd_dq_strip != Switch::off &&
                                    t.bwd_dq_sm90 != Switch::on && rules.empty() &&
                                    p.heads_per_kv == 1)) {
    auto no = [&](const std::string& w) {
      return t.bwd_strip == Switch::on
                 ? unsupported("tuning bwd_strip='on': the strip dK / dV kernel does not take " + w)
                 : Status::Ok();
    };
    Status st = Status::Ok();
    if (named || t.bwd_kernel != BwdKernel::automatic)
      st = no("a named backward kernel (backward_config or tuning bwd_kernel)");
    else if (other_tuning)
      st = no("tuning bwd_walk or bwd_q_pairs (the Hopper kernels' tile walk and paired tiles)");
    else if (!hopper)
      st = no("this call: it needs 16-bit tensors, compute capability 9.0 and a build for "
              "sm_90a");
    else if (t.bwd_dq_strip == Switch::off || t.bwd_dq_sm90 == Switch::on)
      st = no(std::string(t.bwd_dq_strip == Switch::off ? "tuning bwd_dq_strip='off'"
                                                        : "tuning bwd_dq_sm90='on'") +
              " (it needs the strip dQ kernel)");
    else if (!rules.empty())
      st = no(rules);
    else if (p.heads_per_kv != 1)
      st = no("grouped-query attention (" + std::to_string(p.heads_per_kv) +
              " query heads per key / value head)");
    else {
      StripStep dkdv, dq;
      if (plan_strip_step(p, dev, fused::StripRole::dkdv, kd, t.bwd_copy, &dkdv, &why) &&
          plan_strip_step(p, dev, fused::StripRole::dq, kd, t.bwd_copy, &dq, &why)) {
        l->dkdv_strip = dkdv;
        l->dq_strip = dq;
        // The launch goes through the Hopper launcher (deterministic calls were planned for the
        // sm80 kernels, which then do not run).
        l->family = fused::BwdFamily::sm90;
        return Status::Ok();
      }
      st = no(why);
    }
    if (!st.ok()) return st;
  }
  // dQ alone, after the plain Hopper dK / dV kernel: the strip dQ kernel, else the Hopper dQ
  // kernel, else (deterministic calls aside) the dK / dV kernel's atomics.
  if (t.bwd_dq_strip == Switch::on && t.bwd_dq_sm90 == Switch::on)
    return unsupported("tuning bwd_dq_strip='on' and bwd_dq_sm90='on' ask for two dQ kernels");
  if (t.bwd_dq_sm90 != Switch::on) {
    Status st = plan_dq_strip(t, dev, p, rules, kd, narrowest, l);
    if (!st.ok() || l->dq_strip.dim != 0) return st;
  }
  // The Hopper dQ kernel. Automatic: deterministic calls (make_bwd_plan gives them the plain
  // Hopper dK / dV kernel where this kernel takes the call), and rank 1. Forward+backward with
  // it over the atomics after the plain Hopper dK / dV kernel (tools/experiments/tuning_ab.py,
  // H100, 2026-11-28): 1d-small 0.944; 3d-small 1.02, nat-t 1.15, dinat-t 1.13, nat-late 1.25.
  // Deterministic calls, over the sm80 kernels: 1d-small 0.53, 3d-small 0.52, dinat-t 0.39,
  // 2d-nat (with the strip dQ kernel) 0.46.
  const bool dq_auto = l->family == fused::BwdFamily::sm90 && (opt.deterministic || pr.rank == 1);
  if (t.bwd_dq_sm90 == Switch::off || (t.bwd_dq_sm90 == Switch::automatic && !dq_auto))
    return Status::Ok();
  // What rules it out: an error where tuning asks for it (or a deterministic call, which
  // make_bwd_plan gave the plain Hopper kernel only where it applies), else the atomics.
  auto no = [&](const std::string& w) {
    if (t.bwd_dq_sm90 != Switch::on && !opt.deterministic) return Status::Ok();
    return unsupported(std::string(t.bwd_dq_sm90 == Switch::on ? "tuning bwd_dq_sm90='on'"
                                                               : "deterministic=true") +
                       ": the Hopper dQ kernel does not take " + w);
  };
  if (l->family != fused::BwdFamily::sm90)
    return no("this call: it follows the plain Hopper dK / dV kernel (sm90), the plan runs " +
              std::string(fused::family_name(l->family)));
  if (l->q_steps != 1) return no("paired query tiles (tuning bwd_q_pairs)");
  Sm90DqStep dq;
  if (dq_planned != nullptr)  // (the same call's step: planned once)
    dq = *dq_planned;
  else if (!plan_dq_sm90(pr, opt, dev, p, &dq, &why))
    return no(why);
  l->dq_sm90 = dq;
  return Status::Ok();
}

std::string strip_name(const StripStep& s, fused::StripRole role, DType dtype) {
  return std::string(role == fused::StripRole::dq ? "fna_dq_strip_" : "fna_bwd_strip_") +
         (dtype == DType::f16 ? "f16" : "bf16") + "_d" + std::to_string(s.dim) + "_b" +
         std::to_string(s.bh) + "x" + std::to_string(s.bw) + "_w" + std::to_string(s.warps());
}

}  // namespace bwd
}  // namespace fna
