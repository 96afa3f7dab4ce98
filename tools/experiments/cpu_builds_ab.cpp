// Two builds of the library in one process, calls alternating (see cpu_builds_ab.sh).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" double run_a(float* const* t, int mode);
extern "C" double run_b(float* const* t, int mode);

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const int mode = argc > 2 ? std::atoi(argv[2]) : 0;  // 0 forward, 1 backward
  const size_t big = size_t(128) * 128 * 4 * 64, small = size_t(128) * 128 * 4;
  // Like fna-bench's buffers (std::vector, malloc): 16 bytes past a page, not 64-byte aligned.
  const size_t offset = std::getenv("AB_ALIGN") ? 0 : 16;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  float* t[9];
  for (int i = 0; i < 9; ++i) {
    const size_t count = i == 4 ? small : big;
    char* raw = static_cast<char*>(std::aligned_alloc(4096, (count * 4 + offset + 4095) / 4096 * 4096));
    t[i] = reinterpret_cast<float*>(raw + offset);
    for (size_t e = 0; e < count; ++e) t[i][e] = u(rng);
  }
  run_a(t, 0);  // O and LSE for the backward; warm-up
  run_b(t, 0);
  std::vector<double> ta, tb, r;
  for (int i = 0; i < n + 2; ++i) {
    const double x = run_a(t, mode), y = run_b(t, mode);
    if (i < 2) continue;
    ta.push_back(x);
    tb.push_back(y);
    r.push_back(y / x);
  }
  std::sort(r.begin(), r.end());
  std::printf("%s: A %.2f ms  B %.2f ms (medians of %d)  B/A %.3f (quartiles %.3f, %.3f)\n",
              mode ? "backward" : "forward", median(ta), median(tb), n, r[n / 2], r[n / 4], r[3 * n / 4]);
}
