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

// parallel_ranges: each task once, a range's start (a steal) on a multiple of `unit`, `end` past
// the task; a slow worker's range is shared.
struct RangeRun {
  std::vector<int> worker_of;
  std::vector<int64_t> count_of;  // tasks per worker
};

RangeRun run_ranges(int64_t tasks, int threads, int64_t chunk, int64_t least, int64_t unit, bool fixed,
                    int slow_worker, unsigned seed) {
  RangeRun out;
  out.worker_of.assign(static_cast<size_t>(tasks), -1);
  out.count_of.assign(static_cast<size_t>(threads), 0);
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  for (auto& r : runs) r = 0;
  std::vector<unsigned> delay(static_cast<size_t>(tasks));
  std::mt19937 rng(seed);
  for (auto& d : delay) d = rng() % 100;
  std::vector<int64_t> last(static_cast<size_t>(threads), -1);
  std::atomic<int> bad{0};
  fna::cpu::parallel_ranges(
      tasks, threads,
      [&](int64_t i, int64_t end, int w) {
        const unsigned us = delay[static_cast<size_t>(i)] * (w == slow_worker ? 20u : 1u);
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        if (end <= i || end > tasks) ++bad;
        int64_t& prev = last[static_cast<size_t>(w)];
        if (prev >= 0 && i != prev + 1 && i % unit != 0) ++bad;  // a new range (a steal) starts a unit
        prev = i;
        out.worker_of[static_cast<size_t>(i)] = w;
        ++out.count_of[static_cast<size_t>(w)];
        ++runs[static_cast<size_t>(i)];
      },
      chunk, least, unit, fixed);
  EXPECT_EQ(bad.load(), 0);
  for (int64_t i = 0; i < tasks; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)], 1) << "task " << i;
  return out;
}

TEST(ParallelRanges, EveryTaskOnceInOrder) {
  for (int threads : {1, 2, 3})
    for (int64_t unit : {1, 4})
      for (int64_t tasks : {1, 37, 120}) {
        run_ranges(tasks, threads, 16, 8, unit, false, -1, 3u + threads);
        run_ranges(tasks, threads, 16, 8, unit, false, 0, 5u + threads);
        run_ranges(tasks, threads, 16, 8, unit, true, -1, 7u + threads);
      }
}

TEST(ParallelRanges, FastWorkerStealsFromSlowOne) {
  // Worker 1 is 20x slower: worker 0 finishes its half, then takes halves of worker 1's rest.
  const RangeRun r = run_ranges(160, 2, 40, 4, 4, false, 1, 11u);
  EXPECT_GT(r.count_of[0], 100) << "worker 0 ran " << r.count_of[0] << " of 160";
  // Starts: worker w on the w-th half.
  EXPECT_EQ(r.worker_of[0], 0);
  EXPECT_EQ(r.worker_of[80], 1);
}

TEST(ParallelRanges, FixedAssignmentIgnoresTiming) {
  for (unsigned seed : {1u, 2u}) {
    const RangeRun r = run_ranges(41, 3, 3, 1, 1, true, 0, seed);
    for (int64_t i = 0; i < 41; ++i)
      EXPECT_EQ(r.worker_of[static_cast<size_t>(i)], static_cast<int>((i / 3) % 3)) << "task " << i;
  }
}

}  // namespace
