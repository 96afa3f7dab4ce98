// The launcher of the Hopper (wgmma, sm_90a) dK / dV kernels: the plan's family picks the plain
// kernel (bwd_dkdv_sm90.cuh) or the warp-specialized one (bwd_dkdv_sm90_ws.cuh); dQ accumulated by
// atomics, then converted. Instantiated by the build from FNA_BWD_SM90_INSTANCES.
#pragma once

#include "cuda/fused/kernel/common/bwd_common.cuh"
#include "cuda/fused/kernel/sm90/bwd_dkdv_sm90.cuh"
#include "cuda/fused/kernel/sm90/bwd_dkdv_sm90_ws.cuh"
#include "cuda/fused/kernel/sm90/bwd_dkdv_sm90_d256.cuh"
#include "cuda/fused/configs/backward.h"
#include "cuda/fused/plan/bwd_plan.h"
#include "cuda/fused/launch/bwd_sm90.h"

namespace fna {
namespace bwd {

// The plain Hopper dK / dV kernel with kKV-key tiles over the neighborhood and the additional keys,
// its products over kDn head-dim columns, kSteps query tiles per step (2: no bias).
// With a dQ kernel after it (l.dq_after(): the strip or the Hopper dQ kernel), the instance
// without dQ.
template <typename T, int kD, int kKV, int kDn = kD, int kSteps = 1>
Status launch_plain(const Params& p, const BwdLaunch& l, cudaStream_t stream) {
  using Tr = DkdvSm90Traits<T, kD, kKV, kSteps>;
  auto kernel = dkdv_sm90_kernel<T, kD, kKV, false, kDn, kSteps>;
  if constexpr (kSteps == 1) {
    if (p.rpb != nullptr && l.dq_after())  // the plan never asks for it
      return {Code::runtime_error, "dkdv (sm90): a dQ kernel after it with a bias"};
    if (p.rpb != nullptr) kernel = dkdv_sm90_kernel<T, kD, kKV, true, kDn>;
    if (l.dq_after()) kernel = dkdv_sm90_kernel<T, kD, kKV, false, kDn, 1, false>;
  } else if (p.rpb != nullptr || l.dq_after()) {  // the plan never asks for it
    return {Code::runtime_error, "dkdv (sm90): paired query tiles with a bias or the strip dQ"};
  }
  const size_t smem = Tr::kSmem + l.bias_smem;  // (bias: its d rpb table after the kernel's own)
  const char* what = l.dq_after() ? "dkdv (sm90, no dq)" : "dkdv (sm90, atomic dq)";
  Status st = set_smem(kernel, smem, what);
  if (!st.ok()) return st;
  kernel<<<l.grid_dkdv, Tr::kThreads, smem, stream>>>(p, false);
  st = launch_error(what);
  if (!st.ok() || l.grid_add.x == 0) return st;
  kernel<<<l.grid_add, Tr::kThreads, smem, stream>>>(p, true);
  return launch_error("dkdv (sm90, additional, atomic dq)");
}

// A strip backward kernel the plan chose (`step`: l.dq_strip or l.dkdv_strip;
// FNA_BWD_STRIP_CONFIGS): dQ, or dK and dV, straight into their tensors.
template <typename T>
Status launch_strip(const Params& p, const StripStep& step, fused::StripRole role,
                    cudaStream_t stream) {
  using Tag = typename MmaTag<T>::type;
  const fused::FwdParams fp = strip_params(p, role);
  const fused::StripBwd bw = strip_bwd(p, role);
  cudaError_t err = cudaErrorInvalidConfiguration;
  bool found = false;
#define FNA_BWD_STRIP_CASE(ROLE, D, PH, BH, BW, DT)                                           \
  if (!found && std::is_same<Tag, mma::DT>::value && int(role) == ROLE && step.dim == D &&   \
      step.phases == PH && step.bh == BH && step.bw == BW) {                                  \
    found = true;                                                                             \
    err = fused::launch_bwd_strip<mma::DT, ROLE, D, PH, BH, BW>(fp, step.launch, bw, stream); \
  }
  FNA_BWD_STRIP_CONFIGS(FNA_BWD_STRIP_CASE, BF16)
  FNA_BWD_STRIP_CONFIGS(FNA_BWD_STRIP_CASE, F16)
#undef FNA_BWD_STRIP_CASE
  const char* what = role == fused::StripRole::dq ? "dq (strip)" : "dkdv (strip)";
  if (!found)  // the plan never asks for it
    return {Code::runtime_error, std::string(what) + ": no instance for head dim " +
                                     std::to_string(step.dim)};
  if (err != cudaSuccess)
    return {Code::runtime_error, std::string(what) + ": " + cudaGetErrorString(err)};
  return Status::Ok();
}

// A warp-specialized Hopper dK / dV kernel's two launches: over the neighborhood (`kernel`: the TMA
// instance when l.tma.on) and over the additional keys (`plain`: query tiles in flat token order,
// by cp.async). `what` names the kernel in errors.
template <class K>
Status launch_ws_grids(K kernel, K plain, int threads, size_t smem, const std::string& what,
                       const Params& p, const BwdLaunch& l, cudaStream_t stream) {
  const BwdTma off{};  // on = 0
  const std::string name = "dkdv kernel (" + what + ", atomic dq)";
  Status st = set_smem(kernel, smem, name.c_str());
  if (!st.ok()) return st;
  kernel<<<l.grid_dkdv, threads, smem, stream>>>(p, false, l.tma);
  st = launch_error(("dkdv (" + what + ", atomic dq)").c_str());
  if (!st.ok() || l.grid_add.x == 0) return st;
  st = set_smem(plain, smem, name.c_str());
  if (!st.ok()) return st;
  plain<<<l.grid_add, threads, smem, stream>>>(p, true, off);
  return launch_error(("dkdv (" + what + ", additional, atomic dq)").c_str());
}

// The warp-specialized Hopper dK / dV kernel with kSteps query tiles per step; with a bias, its
// bias instance over the neighborhood (d rpb tables after its own shared memory: l.bias_smem) and
// the plain one over the additional keys (which take no bias).
template <typename T, int kD, int kSteps>
Status launch_ws(const Params& p, const BwdLaunch& l, cudaStream_t stream) {
  using Tr = DkdvSm90WsTraits<T, kD, 2, kSteps>;
  auto plain = dkdv_sm90_ws_kernel<T, kD, 2, false, kSteps>;
  auto kernel = l.tma.on ? dkdv_sm90_ws_kernel<T, kD, 2, true, kSteps> : plain;
  if constexpr (kSteps == 1) {
    if (p.rpb != nullptr)
      kernel = l.tma.on ? dkdv_sm90_ws_kernel<T, kD, 2, true, 1, true>
                        : dkdv_sm90_ws_kernel<T, kD, 2, false, 1, true>;
  } else if (p.rpb != nullptr) {  // the plan never asks for it
    return {Code::runtime_error, "dkdv (sm90ws): paired query tiles with a bias"};
  }
  return launch_ws_grids(kernel, plain, Tr::kThreads, Tr::kSmem + l.bias_smem, "sm90ws", p, l,
                         stream);
}

// The padded-head-dim-256 warp-specialized kernel (bwd_dkdv_sm90_d256.cuh; 64-key tiles x 64
// queries).
template <typename T>
Status launch_d256(const Params& p, const BwdLaunch& l, cudaStream_t stream) {
  using Tr = DkdvSm90D256Traits<T>;
  auto plain = dkdv_sm90_d256_kernel<T, false>;
  return launch_ws_grids(l.tma.on ? dkdv_sm90_d256_kernel<T, true> : plain, plain, Tr::kThreads,
                         Tr::kSmem, "sm90ws d256", p, l, stream);
}

// The plan's Hopper dK / dV kernel: plain (sm90; 64- or 128-key tiles) or warp-specialized (sm90ws; its neighborhood
// launch by TMA when l.tma.on, the additional keys' launch, query tiles in flat token order, by
// cp.async).
template <typename T, int kD>
Status launch_dkdv_sm90(const Params& p, const BwdLaunch& l, cudaStream_t stream) {
  Status st;
  if (l.dkdv_strip.dim != 0) {  // the strip dK / dV kernel, then the strip dQ kernel
    st = launch_strip<T>(p, l.dkdv_strip, fused::StripRole::dkdv, stream);
    if (!st.ok()) return st;
    return launch_strip<T>(p, l.dq_strip, fused::StripRole::dq, stream);
  }
  if constexpr (kD == 256) {
    if (l.family != fused::BwdFamily::sm90ws)  // the plan never asks for it
      return {Code::runtime_error, "dkdv (sm90): head dim 256 has the warp-specialized kernel only"};
    st = launch_d256<T>(p, l, stream);
    if (!st.ok()) return st;
  } else if (l.family == fused::BwdFamily::sm90ws) {
    if constexpr (kD == 64) {
      st = l.q_steps == 2 ? launch_ws<T, kD, 2>(p, l, stream) : launch_ws<T, kD, 1>(p, l, stream);
    } else {
      st = launch_ws<T, kD, 1>(p, l, stream);
    }
    if (!st.ok()) return st;
  } else if (l.kv_rows == 64) {
    if constexpr (kD == 64)
      st = l.dim_cols == 32 ? launch_plain<T, 64, 64, 32>(p, l, stream)
                            : launch_plain<T, 64, 64>(p, l, stream);
    else
      st = launch_plain<T, kD, 64>(p, l, stream);
    if (!st.ok()) return st;
  } else if (l.q_steps == 2) {
    if constexpr (kD == 64)
      st = launch_plain<T, 64, 128, 64, 2>(p, l, stream);
    else
      st = {Code::runtime_error, "dkdv (sm90): paired query tiles need head dim 64"};
    if (!st.ok()) return st;
  } else {
    st = launch_plain<T, kD, 128>(p, l, stream);
    if (!st.ok()) return st;
  }
  if (l.dq_strip.dim != 0) return launch_strip<T>(p, l.dq_strip, fused::StripRole::dq, stream);
  if (l.dq_sm90.on) {  // the Hopper dQ kernel on the plain forward's tiles
    const cudaError_t err =
        l.dq_sm90.run(l.dq_sm90.fp, l.dq_sm90.launch, strip_bwd(p, fused::StripRole::dq),
                      l.dq_sm90.tma, stream);
    if (err != cudaSuccess)
      return {Code::runtime_error, "dq (sm90): " + std::string(cudaGetErrorString(err))};
    return Status::Ok();
  }
  launch_dq_convert<T>(p, stream);
  return launch_error("dq convert");
}

template <typename T, int kD>
size_t dkdv_sm90_smem(fused::BwdFamily f, int kv_rows, int q_steps) {
  if constexpr (kD == 256) {
    (void)f, (void)kv_rows, (void)q_steps;
    return size_t(DkdvSm90D256Traits<T>::kSmem);
  } else {
    if constexpr (kD == 64)
      if (q_steps == 2)
        return f == fused::BwdFamily::sm90ws ? size_t(DkdvSm90WsTraits<T, 64, 2, 2>::kSmem)
                                             : size_t(DkdvSm90Traits<T, 64, 128, 2>::kSmem);
    if (f == fused::BwdFamily::sm90ws) return size_t(DkdvSm90WsTraits<T, kD>::kSmem);
    return kv_rows == 64 ? size_t(DkdvSm90Traits<T, kD, 64>::kSmem)
                         : size_t(DkdvSm90Traits<T, kD>::kSmem);
  }
}

#define FNA_BWD_SM90_INSTANTIATE(T, D)                                                    \
  template Status launch_dkdv_sm90<T, D>(const Params&, const BwdLaunch&, cudaStream_t); \
  template size_t dkdv_sm90_smem<T, D>(fused::BwdFamily, int, int);

}  // namespace bwd
}  // namespace fna
