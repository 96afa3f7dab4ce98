// The fp32 FMA peak of this machine's cores, measured: every thread runs 10 independent chains of
// AVX-512 (or AVX2) FMAs, enough to cover the FMA latency (4 cycles) on two FMA ports. Prints the median
// GFLOP/s over `reps` runs for 1 and N threads. Used with tools/cpu_peak/measure.sh to put the
// cpu backend's forward speed next to the peak of the same minute (the CI VM's speed drifts).
//   g++ -O2 -std=c++17 -pthread fma_peak.cpp -o fma_peak && ./fma_peak [threads] [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

// Ten independent accumulators (zmm/ymm 3..12) per step, written in assembly so that no compiler
// can shorten, contract differently or delete the loop.
#define PEAK_FMA(W, N) "vfmadd231ps %%" W "1, %%" W "2, %%" W #N "\n\t"
#define PEAK_FMA10(W)                                                                      \
  PEAK_FMA(W, 3) PEAK_FMA(W, 4) PEAK_FMA(W, 5) PEAK_FMA(W, 6) PEAK_FMA(W, 7) PEAK_FMA(W, 8) \
  PEAK_FMA(W, 9) PEAK_FMA(W, 10) PEAK_FMA(W, 11) PEAK_FMA(W, 12)
constexpr int kChains = 10;
void run16(long iters) {
  for (long k = 0; k < iters; ++k)
    asm volatile(PEAK_FMA10("zmm") ::: "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                 "xmm10", "xmm11", "xmm12");
}
void run8(long iters) {
  for (long k = 0; k < iters; ++k)
    asm volatile(PEAK_FMA10("ymm") ::: "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                 "xmm10", "xmm11", "xmm12");
}

double gflops(bool avx512, int threads, long iters) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&] { avx512 ? run16(iters) : run8(iters); });
  for (auto& t : ts) t.join();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * kChains * (avx512 ? 16 : 8) * double(iters) * threads / dt / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : int(std::thread::hardware_concurrency());
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) g.push_back(gflops(avx512, threads, 20000000));
  std::sort(g.begin(), g.end());
  std::printf("fma peak: %s, %d threads: median %.1f GFLOP/s (min %.1f, max %.1f, %d runs)\n",
              avx512 ? "avx512" : "avx2", threads, g[g.size() / 2], g.front(), g.back(), reps);
}
