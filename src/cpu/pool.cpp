// The CPU thread pool (see pool.h). One job at a time: the caller that takes the pool publishes
// the job and a ticket (generation, thread count) in one atomic word; workers 1 .. n-1 run it and
// count down `pending_`, the others skip the generation. Idle workers spin briefly for the next
// ticket (back-to-back calls then start without a wake-up), then sleep on a condition variable.
#include "cpu/pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "fna/fna.h"

namespace fna {
namespace cpu {

namespace {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a worker waiting for the next job, and a caller waiting for the workers, spin before
// sleeping: long enough to bridge back-to-back calls without a wake-up (a futex wake and a
// context switch), short enough not to hold a core that another process wants for long. The spin
// is a few pauses, then yields: with more runnable threads than cores (other processes, or more
// workers than cores) the thread being waited for may need this very core. (On this project's
// 2-core VM, shared with other processes, 50 us of pauses made a tiny 2-thread call take ~110 us
// instead of ~13 us: the waiter held the core of the thread it waited for.)
constexpr int kPauses = 64;
constexpr std::chrono::microseconds kSpinNext{50};
constexpr std::chrono::microseconds kSpinDone{50};

// Spins until done() or `budget` has passed (see above); returns done().
template <typename Done>
bool spin(Done&& done, std::chrono::microseconds budget) {
  for (int i = 0; i < kPauses; ++i) {
    if (done()) return true;
    relax();
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (done()) return true;
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() - start > budget) return done();
  }
}

// Set on the pool's workers, and on a caller while it runs a job: a shutdown from such a thread
// must not wait for the job it is part of.
thread_local bool tl_in_job = false;

class Pool {
 public:
  // Runs job(1 .. n-1) on workers and job(0) here; false (nothing run) when the pool is busy or
  // shut down.
  bool try_run(int n, JobRef job) {
    if (busy_.exchange(true, std::memory_order_acquire)) return false;
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false, std::memory_order_release); }
    } release{busy_};
    const uint64_t prev = ticket_.load(std::memory_order_relaxed);
    if (static_cast<size_t>(n - 1) > threads_.size()) grow(n - 1, prev);  // may throw: nothing ran
    job_ = job;
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    pending_.store(n - 1, std::memory_order_relaxed);
    // The job's fields before the ticket (release); seq_cst against sleepers_ (see wait_ticket).
    ticket_.store(((prev >> 16) + 1) << 16 | static_cast<uint64_t>(n), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(m_); }
      wake_.notify_all();
    }
    tl_in_job = true;
    try {
      job.call(job.ctx, 0);
    } catch (...) {
      fail();
    }
    tl_in_job = false;
    wait_done();
    if (failed_.load(std::memory_order_acquire)) {
      const std::exception_ptr error = error_;
      std::rethrow_exception(error);
    }
    return true;
  }

  // Joins the workers once no job runs; later try_run calls answer false. Not from a thread that
  // is part of a job (it would wait for itself): then the workers are left to the process exit.
  void shutdown() {
    if (tl_in_job) return;
    while (busy_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    size_.store(0, std::memory_order_relaxed);
    // busy_ stays set: the pool is closed.
  }

  int size() const { return size_.load(std::memory_order_relaxed); }

 private:
  void fail() {
    if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
  }

  void grow(int workers, uint64_t seen) {
    threads_.reserve(static_cast<size_t>(workers));
    for (int k = static_cast<int>(threads_.size()); k < workers; ++k) {
      threads_.emplace_back([this, k, seen] { loop(k, seen); });
      size_.store(k + 1, std::memory_order_relaxed);
    }
  }

  // Worker k: runs job(k + 1) of every generation whose thread count exceeds k + 1.
  void loop(int k, uint64_t seen) {
    tl_in_job = true;
    for (;;) {
      const uint64_t t = wait_ticket(seen);
      if (t == seen) return;  // stop
      seen = t;
      if (k + 1 >= static_cast<int>(t & 0xffff)) continue;  // not needed this time
      // job_ is the current one: its caller waits for this worker before publishing another.
      try {
        job_.call(job_.ctx, k + 1);
      } catch (...) {
        fail();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        { std::lock_guard<std::mutex> lk(done_m_); }
        done_.notify_one();
      }
    }
  }

  // The next ticket after `seen` (its generation differs), or `seen` once stopped.
  uint64_t wait_ticket(uint64_t seen) {
    uint64_t t = seen;
    if (spin([&] {
          t = ticket_.load(std::memory_order_acquire);
          return (t >> 16) != (seen >> 16);
        }, kSpinNext))
      return t;
    std::unique_lock<std::mutex> lk(m_);
    // Counted before the ticket is read again (seq_cst both sides): a caller that saw no sleeper
    // stored its ticket before this load.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    wake_.wait(lk, [&] {
      t = ticket_.load(std::memory_order_seq_cst);
      return (t >> 16) != (seen >> 16) || stop_;
    });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return (t >> 16) != (seen >> 16) ? t : seen;
  }

  void wait_done() {
    if (spin([&] { return pending_.load(std::memory_order_acquire) == 0; }, kSpinDone)) return;
    std::unique_lock<std::mutex> lk(done_m_);
    done_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }

  std::atomic<bool> busy_{false};        // a caller holds the pool
  std::atomic<uint64_t> ticket_{0};      // generation << 16 | thread count of the current job
  std::atomic<int> pending_{0};          // workers of the current job still running
  std::atomic<int> sleepers_{0};         // workers waiting on wake_
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;             // the first exception of the current job
  JobRef job_{nullptr, nullptr};
  std::vector<std::thread> threads_;     // touched by the caller holding busy_ only
  std::atomic<int> size_{0};             // threads_.size(), for pool_size()
  std::mutex m_;                         // wake_, stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::mutex done_m_;
  std::condition_variable done_;
};

// The pool, created on first use and never freed (a thread still inside try_run when the process
// exits may hold a pointer to it). After fork the child's pool pointer is cleared: the parent's
// workers do not exist there, and its mutexes may be held by threads that do not either.
std::atomic<Pool*> g_pool{nullptr};
std::atomic<bool> g_closed{false};      // set at exit, before the pool is shut down
std::atomic<int> g_threads{0};          // fna::set_num_threads (0: available_cores())

#if defined(__unix__) || defined(__APPLE__)
void after_fork_child() { g_pool.store(nullptr, std::memory_order_relaxed); }
#endif

Pool* pool() {
  if (g_closed.load(std::memory_order_acquire)) return nullptr;
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return p;
#if defined(__unix__) || defined(__APPLE__)
  static std::atomic<bool> registered{false};
  if (!registered.exchange(true)) pthread_atfork(nullptr, nullptr, &after_fork_child);
#endif
  Pool* fresh = new Pool();
  if (!g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return p;
  }
  return fresh;
}

// Joins the workers at exit (static destruction of this file's objects, after those constructed
// later, e.g. the user's, are gone).
struct Closer {
  ~Closer() {
    g_closed.store(true, std::memory_order_release);
    if (Pool* p = g_pool.load(std::memory_order_acquire)) p->shutdown();
  }
} g_closer;

// Without the pool: threads of this call's own.
void run_spawned(int n, JobRef job) {
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  auto run = [&](int id) {
    try {
      job.call(job.ctx, id);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n - 1));
  try {
    for (int id = 1; id < n; ++id) threads.emplace_back(run, id);
  } catch (...) {
    for (std::thread& t : threads) t.join();
    throw;
  }
  run(0);
  for (std::thread& t : threads) t.join();
  if (failed.load()) std::rethrow_exception(error);
}

}  // namespace

void run_job(int n, JobRef job) {
  if (n <= 1) {
    job.call(job.ctx, 0);
    return;
  }
  if (n > 0xffff) {  // more than a ticket holds (the API allows at most kMaxThreads)
    run_spawned(n, job);
    return;
  }
  if (Pool* p = pool())
    if (p->try_run(n, job)) return;
  run_spawned(n, job);
}

int available_cores() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    n = CPU_COUNT(&set);
  } else {
    // More CPUs than a cpu_set_t holds: a larger set.
    for (int cpus = 2 * CPU_SETSIZE; n == 0 && cpus <= (1 << 16); cpus *= 2) {
      cpu_set_t* big = CPU_ALLOC(cpus);
      if (big == nullptr) break;
      const size_t bytes = CPU_ALLOC_SIZE(cpus);
      if (sched_getaffinity(0, bytes, big) == 0) n = CPU_COUNT_S(bytes, big);
      CPU_FREE(big);
    }
  }
#endif
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::min(std::max(n, 1), kMaxThreads);
}

int default_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : available_cores();
}

void set_default_threads(int n) { g_threads.store(n, std::memory_order_relaxed); }

int pool_size() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  return p == nullptr ? 0 : p->size();
}

}  // namespace cpu
}  // namespace fna
