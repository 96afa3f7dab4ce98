// A minimal fork-join loop for the CPU backends: `threads` workers pull task indices from an
// atomic counter, or take a fixed share of them (deterministic mode). The workers are the
// persistent pool's (cpu/pool.h): worker 0 is the calling thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "cpu/pool.h"

namespace fna {
namespace cpu {

// The threads a call runs with: Options::num_threads, or (0) the process-wide count
// (fna::set_num_threads, default: the cores available to the process), at most one per task.
inline int resolve_threads(int requested, int64_t tasks) {
  int n = requested > 0 ? requested : default_threads();
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
  run_workers(threads, worker);
}

// Calls fn(i, end, worker) for every task i in [0, tasks) once: worker w starts on the w-th of
// `threads` contiguous ranges (whole `unit`s of tasks) and runs its tasks in increasing order;
// end is where its current range ends (a later call may see a smaller end: a thief took the
// rest). A worker whose range runs out steals the upper half of the largest remaining one, in
// whole units, while that holds at least 2 * `least` tasks (a range start costs the ring its
// box again). With a fixed share per worker, one of this VM's two, slowed by the host, left the
// other idle for ~10% of the forward (two chunks per worker, dynamically, as parallel_for).
// `fixed`: parallel_for's deterministic mode (chunks of `chunk` tasks, chunk c on worker
// c % threads).
template <typename Fn>
void parallel_ranges(int64_t tasks, int threads, Fn&& fn, int64_t chunk, int64_t least, int64_t unit,
                     bool fixed = false) {
  unit = std::max<int64_t>(unit, 1);
  if (threads <= 1 || fixed || tasks >= (int64_t(1) << 31)) {
    chunk = std::max<int64_t>(fixed ? chunk : (tasks + 2 * threads - 1) / (2 * threads), 1);
    parallel_for(
        (tasks + chunk - 1) / chunk, threads,
        [&](int64_t c, int w) {
          const int64_t e = std::min(tasks, (c + 1) * chunk);
          for (int64_t i = c * chunk; i < e; ++i) fn(i, e, w);
        },
        1, fixed);
    return;
  }
  least = std::max<int64_t>((least + unit - 1) / unit * unit, unit);
  // Per worker, its range [next, end) packed in one word (next in the low half).
  auto pack = [](int64_t next, int64_t end) { return static_cast<uint64_t>(next) | (static_cast<uint64_t>(end) << 32); };
  std::vector<std::atomic<uint64_t>> range(static_cast<size_t>(threads));
  const int64_t units = (tasks + unit - 1) / unit;
  for (int w = 0; w < threads; ++w)
    range[static_cast<size_t>(w)] = pack(std::min(tasks, units * w / threads * unit),
                                         std::min(tasks, units * (w + 1) / threads * unit));
  auto worker = [&](int id) {
    std::atomic<uint64_t>& mine = range[static_cast<size_t>(id)];
    for (;;) {
      uint64_t r = mine.load();
      const int64_t next = static_cast<int64_t>(r & 0xffffffffu), end = static_cast<int64_t>(r >> 32);
      if (next < end) {
        if (mine.compare_exchange_weak(r, pack(next + 1, end))) fn(next, end, id);
        continue;
      }
      // Steal: the upper half of the largest range left, if it is worth a range start.
      int victim = -1;
      int64_t most = 0;
      for (int w = 0; w < threads; ++w) {
        const uint64_t v = range[static_cast<size_t>(w)].load();
        const int64_t left = static_cast<int64_t>(v >> 32) - static_cast<int64_t>(v & 0xffffffffu);
        if (w != id && left > most) most = left, victim = w;
      }
      if (victim < 0 || most < 2 * least) return;  // (what is left, its owners finish)
      std::atomic<uint64_t>& theirs = range[static_cast<size_t>(victim)];
      uint64_t v = theirs.load();
      const int64_t vn = static_cast<int64_t>(v & 0xffffffffu), ve = static_cast<int64_t>(v >> 32);
      const int64_t mid = (vn + (ve - vn) / 2 + unit - 1) / unit * unit;
      if (ve - vn < 2 * least || mid <= vn || mid >= ve) continue;
      if (theirs.compare_exchange_strong(v, pack(vn, mid))) mine = pack(mid, ve);
    }
  };
  run_workers(threads, worker);
}

}  // namespace cpu
}  // namespace fna
