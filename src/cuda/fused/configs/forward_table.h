// One row of the forward configuration table (configs/forward.h's X macros, expanded in
// forward_table.cu): what the plan chooses among, what fna::fused_configs lists, and the launcher
// the launch calls.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/plan/plan.h"
#include "fna/fna.h"

namespace fna {
namespace fused {

struct FwdEntry {
  int rank;
  DType dtype;
  bool tf32;  // float32 with plain TF32 products (Options::allow_tf32)
  int dim;    // padded head dim the kernel is compiled for
  int q[kAxes];
  int kv[kAxes];  // the key tile; for the box / strip families the warp box; SIMT: the keys
                  // of one softmax step (1x1x8)
  int warps;
  FwdFamily family;
  cudaError_t (*launch)(const FwdParams&, const FwdLaunch&, cudaStream_t);
  size_t (*smem)();  // the box / strip families: a lower bound (their plans size it)
  // The plain sm90 family: the backward's dQ kernel on this entry's tiles (launch_dq_sm90).
  cudaError_t (*launch_dq)(const FwdParams&, const FwdLaunch&, const StripBwd&, const DqTma&,
                           cudaStream_t) = nullptr;
  size_t (*dq_smem)() = nullptr;
  // The warp-specialized family: its shared memory with a bias (slice buffers, BiasSlice).
  size_t (*bias_smem)() = nullptr;

  int q_size() const { return q[0] * q[1] * q[2]; }
  int kv_size() const { return kv[0] * kv[1] * kv[2]; }
  bool boxes() const { return family == FwdFamily::box || family == FwdFamily::strip; }
  bool wgmma() const { return family == FwdFamily::sm90 || family == FwdFamily::sm90ws; }
  bool simt() const { return family == FwdFamily::simt; }
  std::string name() const {
    auto shape = [&](const int* e) {
      std::string s;
      for (int ax = kAxes - rank; ax < kAxes; ++ax)
        s += (ax > kAxes - rank ? "x" : "") + std::to_string(e[ax]);
      return s;
    };
    const char* dt = dtype == DType::bf16 ? "bf16" : (dtype == DType::f16 ? "f16" : "f32");
    return std::string("fna_fwd_") + family_name(family) + "_" + dt + "_d" +
           std::to_string(dim) + "_q" + shape(q) +
           (simt() ? std::string() : (boxes() ? "_b" : "_kv") + shape(kv)) + "_w" +
           std::to_string(warps);
  }
};

// Every row compiled into this build (the Hopper ones with FNA_WITH_SM90).
const std::vector<FwdEntry>& forward_table();

}  // namespace fused
}  // namespace fna
