// Host time of bare kernel launches with the GPU idle before each (the CUDA runtime's floor for
// what an fna call costs the CPU): an empty kernel; one taking 200 KB of dynamic shared memory
// with cudaFuncSetAttribute called before every launch, and called once; one with 960 bytes of
// parameters; one taking two TMA descriptors (CUtensorMap) as a __grid_constant__ parameter,
// zeroed and encoded for a 128 MB tensor.
//   nvcc -O2 -std=c++17 -arch=sm_90 tools/experiments/launch_cost.cu -o /tmp/launch_cost && /tmp/launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty_kernel(int x) {
  if (x == 12345) printf("never\n");
}
extern __shared__ char big_smem[];
__global__ void smem_kernel(int x) {
  if (x == 12345) big_smem[threadIdx.x] = 1;
}
struct BigParams {
  long long v[120];
};
__global__ void param_kernel(const __grid_constant__ BigParams p) {
  if (p.v[0] == 12345) printf("never\n");
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct MapParams {
  CUtensorMap k, v;
  int on;
};
__global__ void map_kernel(const __grid_constant__ MapParams p) {
  if (p.on == 12345) printf("never\n");
}

// Median host time of `launch()` with the GPU idle before each call; with `spin` > 0 the GPU first
// runs a kernel of `spin` clock cycles that the host waits for (the host then comes back from a
// longer wait, as after a real kernel).
template <class F>
double launch_us(F&& launch, int n, long long spin = 0) {
  std::vector<double> ls;
  for (int i = 0; i < n; ++i) {
    if (spin > 0) spin_kernel<<<1, 1>>>(spin);
    cudaDeviceSynchronize();
    auto t0 = std::chrono::steady_clock::now();
    launch(i);
    auto t1 = std::chrono::steady_clock::now();
    ls.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  cudaDeviceSynchronize();
  std::sort(ls.begin(), ls.end());
  return ls[n / 2];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 200;
  // Launch floors, timed the same way: an empty kernel; one taking 200 KB of dynamic shared
  // memory with its attribute set before every launch, and set once; one with 960 bytes of
  // parameters.
  cudaFree(nullptr);
  const int big = 200 * 1024;
  std::printf("launch host time (median us): empty %.1f", launch_us([](int i) {
    empty_kernel<<<1024, 128>>>(i); }, n));
  std::printf(", 200 KB smem + cudaFuncSetAttribute each call %.1f", launch_us([&](int i) {
    cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, big);
    smem_kernel<<<1024, 256, big>>>(i); }, n));
  std::printf(", 200 KB smem, attribute set once %.1f", launch_us([&](int i) {
    smem_kernel<<<1024, 256, big>>>(i); }, n));
  BigParams bp{};
  std::printf(", 960-byte parameters %.1f\n", launch_us([&](int i) {
    bp.v[1] = i; param_kernel<<<1024, 128>>>(bp); }, n));
  MapParams mp{};
  std::printf("  two CUtensorMap parameters: zeroed %.1f", launch_us([&](int i) {
    mp.on = i; map_kernel<<<1024, 128>>>(mp); }, n));
  void* buf = nullptr;
  cudaMalloc(&buf, size_t(128) << 20);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                              const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                              const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  cuuint64_t gdim[3] = {64, 16384, 64};
  cuuint64_t gstride[2] = {128, 128 * 16384};
  cuuint32_t bdim[3] = {64, 28, 2};
  cuuint32_t es[3] = {1, 1, 1};
  CUresult r = reinterpret_cast<Encode>(fn)(&mp.k, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, buf, gdim,
                                            gstride, bdim, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  mp.v = mp.k;
  std::printf(", encoded (rc %d) %.1f\n", int(r), launch_us([&](int i) {
    mp.on = i; map_kernel<<<1024, 128>>>(mp); }, n));
  // The empty kernel again, each launch after the host waited for a GPU spin of about 0.5 ms
  // and 40 ms (1 GHz-2 GHz clocks: the cycles are 1e6 and 8e7).
  for (long long spin : {1000000LL, 80000000LL})
    std::printf("  empty kernel after waiting for a %lld-cycle GPU spin: %.1f\n", spin,
                launch_us([](int i) { empty_kernel<<<1024, 128>>>(i); }, spin > 1e7 ? 30 : n,
                          spin));
}
