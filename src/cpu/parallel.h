// A minimal fork-join loop for the CPU backends: `threads` workers pull task indices from an
// atomic counter (tasks have uneven cost near borders, so static splitting would idle cores).
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
// `chunk` consecutive tasks at a time (a chunk's tasks share data in the worker's cache).
template <typename Fn>
void parallel_for(int64_t tasks, int threads, Fn&& fn, int64_t chunk = 1) {
  if (threads <= 1) {
    for (int64_t i = 0; i < tasks; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&](int id) {
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
