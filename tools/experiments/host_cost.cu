// Host time of one fna::forward call (C++ API, no Python) on a standard problem's shapes, with
// the GPU idle before each call: what the call costs the CPU before its kernel can start.
//   nvcc -O2 -std=c++17 -arch=sm_90 -Iinclude tools/experiments/host_cost.cu build/gpu/libfna.a \
//       -cudart shared -ldl -lpthread -o /tmp/host_cost
//   /tmp/host_cost [2d-nat|3d-video] [calls] [config]
// With LD_PRELOAD of tools/experiments/cudart_timer.c's library, the CUDA runtime calls inside are timed;
// tools/experiments/launch_cost.cu times bare launches the same way.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fna/fna.h"

int main(int argc, char** argv) {
  const std::string prob = argc > 1 ? argv[1] : "2d-nat";
  const int n = argc > 2 ? std::atoi(argv[2]) : 100;
  const char* cfg = argc > 3 ? argv[3] : "";
  fna::Problem p;
  std::vector<int64_t> qe;
  if (prob == "2d-nat") {
    p.rank = 2; p.batch = 8; p.shape[0] = p.shape[1] = 128; p.heads = p.heads_kv = 8;
    p.dim = p.dim_v = 64; p.kernel_size[0] = p.kernel_size[1] = 13;
    qe = {8, 128, 128, 8, 64};
  } else {
    p.rank = 3; p.batch = 1; p.shape[0] = 30; p.shape[1] = 48; p.shape[2] = 80;
    p.heads = p.heads_kv = 24; p.dim = p.dim_v = 128;
    p.kernel_size[0] = 18; p.kernel_size[1] = 24; p.kernel_size[2] = 24;
    qe = {1, 30, 48, 80, 24, 128};
  }
  p.dtype = fna::DType::bf16;
  size_t elems = 1;
  for (int64_t e : qe) elems *= size_t(e);
  void* t[4];
  for (auto& x : t)
    if (cudaMalloc(&x, elems * 2) != cudaSuccess) { std::puts("cudaMalloc failed"); return 1; }
  float* lse = nullptr;
  cudaMalloc(&lse, elems / qe.back() * 4);
  fna::ForwardArgs a;
  a.q = fna::dense(t[0], qe); a.k = fna::dense(t[1], qe); a.v = fna::dense(t[2], qe);
  a.o = fna::dense(t[3], qe);
  a.lse = fna::dense(lse, std::vector<int64_t>(qe.begin(), qe.end() - 1));
  fna::Options o;
  o.backend = fna::Backend::cuda_fused; o.device = fna::Device::cuda; o.config = cfg;
  fna::Status st = fna::forward(p, a, o);
  cudaDeviceSynchronize();
  std::printf("%s: status %d %s\n", prob.c_str(), int(st.code), st.message.c_str());
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    cudaDeviceSynchronize();
    auto t0 = std::chrono::steady_clock::now();
    fna::forward(p, a, o);
    auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  cudaDeviceSynchronize();
  std::sort(us.begin(), us.end());
  std::printf("%s config '%s': host time per call (GPU idle before it) median %.1f us, min %.1f, "
              "max %.1f (%d calls)\n", prob.c_str(), cfg, us[n / 2], us[0], us[n - 1], n);
}
