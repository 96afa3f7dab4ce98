// Per-call cost of a tiny cpu forward (1-D, length L = 16, D = 8, kernel 3, float32, B = 1, H
// heads): what the call itself costs (validation, plan, starting and joining the workers), not the
// math. With H = 1 the call has one work item, so it runs on one thread whatever num_threads says
// (resolve_threads caps the count at the items); H = 4 gives two items, one per thread at 2.
// Prints, per thread count, the median over rounds of the mean time per call of a round.
// Build against a CPU-only build's library (any tree, e.g. main's for a before / after):
//   g++ -O2 -std=c++17 -Iinclude tools/experiments/cpu_call_overhead.cpp build/me/libfna.a -pthread -o /tmp/fna_call_overhead
//   /tmp/fna_call_overhead [calls per round = 2000] [rounds = 15] [L = 16] [H = 4] [threads = 1 2]
// (a thread count of 0: Options::num_threads = 0, the process-wide default)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fna/fna.h"

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  const int64_t L = argc > 3 ? std::atoi(argv[3]) : 16;
  const int64_t H = argc > 4 ? std::atoi(argv[4]) : 4;
  std::vector<int> counts;
  for (int i = 5; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {1, 2};

  fna::Problem p;
  p.rank = 1;
  p.shape[0] = L;
  p.kernel_size[0] = 3;
  p.heads = p.heads_kv = H;
  p.dim = p.dim_v = 8;
  const int64_t n = L * H * 8;
  std::vector<float> q(n), k(n), v(n), o(n);
  unsigned s = 12345;
  for (std::vector<float>* t : {&q, &k, &v})
    for (float& x : *t) x = static_cast<float>((s = s * 1103515245u + 12345u) >> 9) / 8388608.f - 0.99f;
  fna::ForwardArgs a;
  a.q = fna::dense(q.data(), {1, L, H, 8});
  a.k = fna::dense(k.data(), {1, L, H, 8});
  a.v = fna::dense(v.data(), {1, L, H, 8});
  a.o = fna::dense(o.data(), {1, L, H, 8});
  fna::Options opt;
  opt.backend = fna::Backend::cpu;

  std::printf("tiny cpu forward (1-D L=%lld, H=%lld, D=8, K=3, fp32): %d calls x %d rounds\n",
              static_cast<long long>(L), static_cast<long long>(H), calls, rounds);
  for (int threads : counts) {
    opt.num_threads = threads;
    for (int w = 0; w < calls / 4; ++w) fna::forward(p, a, opt);  // warm-up (and the pool)
    std::vector<double> us;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) {
        const fna::Status st = fna::forward(p, a, opt);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.message.c_str());
          return 1;
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
    }
    std::sort(us.begin(), us.end());
    std::printf("  threads %d: median %.2f us/call (min %.2f, max %.2f over rounds)\n", threads,
                us[us.size() / 2], us.front(), us.back());
  }
  return 0;
}
