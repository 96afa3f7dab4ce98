// A minimal fork-join loop for the CPU backends: `threads` workers pull task indices from an
// atomic counter, or take a fixed share of them (deterministic mode).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace fna {
namespace cpu {

inline int resolve_threads(int requested, int64_t tasks) {
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  if (n < 1) n = 1;
  return static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(tasks, 1)));
}

// Calls fn(task, worker) for every task in [0, tasks); worker is in [0, threads). Workers take
// `chunk` consecutive tasks at a time (a chunk's tasks share data in the worker's cache), each
// worker its tasks in increasing order. With `fixed` (Options::deterministic) chunk c goes to
// worker c % threads whatever the timing, so per-worker partial sums, and their sum in worker
// order, are the same run after run (for one thread count); otherwise workers pull the next chunk
// as they finish one (tasks have uneven cost near borders, so static splitting can idle a core).
template <typename Fn>
void parallel_for(int64_t tasks, int threads, Fn&& fn, int64_t chunk = 1, bool fixed = false) {
  if (threads <= 1) {
    for (int64_t i = 0; i < tasks; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&](int id) {
    if (fixed) {
      for (int64_t i0 = int64_t(id) * chunk; i0 < tasks; i0 += int64_t(threads) * chunk)
        for (int64_t i = i0; i < i0 + chunk && i < tasks; ++i) fn(i, id);
      return;
    }
    for (int64_t i0 = next.fetch_add(chunk); i0 < tasks; i0 = next.fetch_add(chunk))
      for (int64_t i = i0; i < i0 + chunk && i < tasks; ++i) fn(i, id);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int id = 1; id < threads; ++id) pool.emplace_back(worker, id);
  worker(0);
  for (auto& t : pool) t.join();
}

}  // namespace cpu
}  // namespace fna
