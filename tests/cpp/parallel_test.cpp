// The CPU fork-join loop: every task runs exactly once, and in fixed (deterministic) mode each
// chunk runs on the worker the rule assigns, whatever the timing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace {

void run(int64_t tasks, int threads, int64_t chunk, bool fixed, std::vector<int>* worker_of,
         unsigned seed) {
  worker_of->assign(static_cast<size_t>(tasks), -1);
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  for (auto& r : runs) r = 0;
  std::vector<unsigned> delay(static_cast<size_t>(tasks));
  std::mt19937 rng(seed);
  for (auto& d : delay) d = rng() % 300;  // microseconds: perturbs which worker is free first
  fna::cpu::parallel_for(
      tasks, threads,
      [&](int64_t i, int w) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay[static_cast<size_t>(i)]));
        (*worker_of)[static_cast<size_t>(i)] = w;
        ++runs[static_cast<size_t>(i)];
      },
      chunk, fixed);
  for (int64_t i = 0; i < tasks; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)], 1) << "task " << i;
}

TEST(ParallelFor, EveryTaskOnce) {
  std::vector<int> w;
  for (bool fixed : {false, true})
    for (int threads : {1, 2, 3})
      for (int64_t chunk : {1, 4}) run(37, threads, chunk, fixed, &w, 7u + threads);
}

TEST(ParallelFor, FixedAssignmentIgnoresTiming) {
  for (int threads : {2, 3}) {
    for (int64_t chunk : {1, 3}) {
      for (unsigned seed : {1u, 2u, 3u}) {
        std::vector<int> w;
        run(41, threads, chunk, true, &w, seed);
        for (int64_t i = 0; i < 41; ++i)
          EXPECT_EQ(w[static_cast<size_t>(i)], static_cast<int>((i / chunk) % threads))
              << "task " << i << " threads " << threads << " chunk " << chunk;
      }
    }
  }
}

}  // namespace
