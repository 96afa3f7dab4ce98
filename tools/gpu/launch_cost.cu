// Host time of bare kernel launches with the GPU idle before each (the CUDA runtime's floor for
// what an fna call costs the CPU): an empty kernel; one taking 200 KB of dynamic shared memory
// with cudaFuncSetAttribute called before every launch, and called once; one with 960 bytes of
// parameters.
//   nvcc -O2 -std=c++17 -arch=sm_90 tools/gpu/launch_cost.cu -o /tmp/launch_cost && /tmp/launch_cost
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

// Median host time of `launch()` with the GPU idle before each call.
template <class F>
double launch_us(F&& launch, int n) {
  std::vector<double> ls;
  for (int i = 0; i < n; ++i) {
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
}
