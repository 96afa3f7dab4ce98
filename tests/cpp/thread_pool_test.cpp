// The CPU backends' persistent thread pool (src/cpu/pool.h) under parallel_for / parallel_ranges:
// workers persist across calls and grow on demand, every task runs exactly once whatever the
// thread counts of successive calls, fixed (deterministic) mode gives the bits of its sequential
// schedule through the pool and through the threads a busy pool's caller starts, concurrent and
// nested callers neither deadlock nor mix up their tasks, a child process after fork gets a pool
// of its own, and the process exits while the pool is in use. Also the process-wide thread count
// (fna::set_num_threads / get_num_threads) and its validation.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "cpu/parallel.h"
#include "cpu/pool.h"
#include "fna/fna.h"
#include "support/problem.h"
#include "support/tensor.h"

namespace {

using fna::cpu::parallel_for;
using fna::cpu::parallel_ranges;
using fna_test::Rng;

// Restores the default process-wide thread count when a test ends (also on failure).
struct DefaultThreadsAtExit {
  ~DefaultThreadsAtExit() { fna::set_num_threads(0); }
};

// Runs `body` on a thread of its own; a body that has not returned after `seconds` (a deadlock)
// fails the test by ending the process, rather than hanging the suite.
template <typename Body>
void within(int seconds, const char* what, Body body) {
  std::packaged_task<void()> task(body);
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  if (done.wait_for(std::chrono::seconds(seconds)) == std::future_status::timeout) {
    std::fprintf(stderr, "FAILED: %s did not finish within %d s (deadlock?)\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
  t.join();
  done.get();  // rethrows a failure of the body
}

#if defined(__linux__)
long tid() { return static_cast<long>(syscall(SYS_gettid)); }

// Runs `child` in a forked process that must exit with status 0 within `seconds` (SIGALRM ends a
// hung child, which fails the test).
template <typename Child>
void in_child(int seconds, Child child) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    alarm(static_cast<unsigned>(seconds));
    child();  // exits
    _exit(90);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) FAIL() << "child killed by signal " << WTERMSIG(status) << " (SIGALRM: hung)";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}
#endif

// One parallel_for / parallel_ranges call: counts of runs per task and the worker of each; true
// when every task ran once (and, fixed, on the worker the rule assigns).
bool check_call(Rng& rng, bool ranges, int threads, int64_t tasks, int64_t chunk, bool fixed,
                std::string* why) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  std::vector<std::atomic<int>> worker(static_cast<size_t>(tasks));
  for (auto& r : runs) r = 0;
  std::atomic<int> bad_worker{0};
  auto note = [&](int64_t i, int w) {
    if (w < 0 || w >= threads) ++bad_worker;
    worker[static_cast<size_t>(i)] = w;
    ++runs[static_cast<size_t>(i)];
  };
  if (ranges) {
    const int64_t unit = rng.range(1, 4);
    parallel_ranges(tasks, threads, [&](int64_t i, int64_t, int w) { note(i, w); }, chunk,
                    rng.range(1, 8), unit, fixed);
  } else {
    parallel_for(tasks, threads, [&](int64_t i, int w) { note(i, w); }, chunk, fixed);
  }
  const std::string call = std::string(ranges ? "parallel_ranges" : "parallel_for") + "(tasks " +
                           std::to_string(tasks) + ", threads " + std::to_string(threads) +
                           ", chunk " + std::to_string(chunk) + (fixed ? ", fixed)" : ")");
  if (bad_worker) return *why = call + ": a worker id out of range", false;
  for (int64_t i = 0; i < tasks; ++i) {
    if (runs[static_cast<size_t>(i)] != 1)
      return *why = call + ": task " + std::to_string(i) + " ran " +
                    std::to_string(runs[static_cast<size_t>(i)].load()) + " times", false;
    if (fixed && worker[static_cast<size_t>(i)] != static_cast<int>((i / chunk) % threads))
      return *why = call + ": task " + std::to_string(i) + " on worker " +
                    std::to_string(worker[static_cast<size_t>(i)].load()), false;
  }
  return true;
}

// Many calls in a row with varying thread counts (growing and shrinking the share of the pool a
// call uses), both loops, both modes.
void many_calls(uint64_t seed, int calls, int max_threads) {
  Rng rng(seed);
  for (int c = 0; c < calls; ++c) {
    const bool ranges = rng.chance(0.5), fixed = rng.chance(0.3);
    const int threads = static_cast<int>(rng.range(1, max_threads));
    const int64_t tasks = rng.range(0, 300), chunk = rng.range(1, 6);
    std::string why;
    ASSERT_TRUE(check_call(rng, ranges, threads, tasks, chunk, fixed, &why)) << "call " << c << ": " << why;
  }
}

// Sum of x in fixed mode: per-worker float partial sums in task order, added in worker order.
float fixed_sum(const std::vector<float>& x, int threads, int64_t chunk) {
  std::vector<float> part(static_cast<size_t>(threads), 0.f);
  parallel_for(static_cast<int64_t>(x.size()), threads,
               [&](int64_t i, int w) { part[static_cast<size_t>(w)] += x[static_cast<size_t>(i)]; },
               chunk, true);
  float s = 0.f;
  for (float p : part) s += p;
  return s;
}

// The same schedule on one thread: worker w's chunks are c = w, w + threads, ...
float sequential_sum(const std::vector<float>& x, int threads, int64_t chunk) {
  const int64_t n = static_cast<int64_t>(x.size());
  float s = 0.f;
  for (int w = 0; w < threads; ++w) {
    float p = 0.f;
    for (int64_t c0 = w * chunk; c0 < n; c0 += threads * chunk)
      for (int64_t i = c0; i < c0 + chunk && i < n; ++i) p += x[static_cast<size_t>(i)];
    s += p;
  }
  return s;
}

std::vector<float> random_floats(uint64_t seed, size_t n) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>((0.1 + 0.9 * rng.uniform()) * (rng.chance(0.5) ? 1 : -1) *
                                            (rng.chance(0.1) ? 1e4 : 1.0));  // never 0
  return x;
}

// Holds the pool from another host thread until release(): calls made meanwhile find it busy.
class PoolHolder {
 public:
  PoolHolder()
      : t_([this] {
          parallel_for(2, 2, [this](int64_t, int) {
            ++inside_;
            while (!released_) std::this_thread::sleep_for(std::chrono::microseconds(100));
          });
        }) {
    while (inside_ < 2) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ~PoolHolder() { release(); }
  void release() {
    released_ = true;
    if (t_.joinable()) t_.join();
  }

 private:
  std::atomic<int> inside_{0};
  std::atomic<bool> released_{false};
  std::thread t_;
};

// ---- the pool --------------------------------------------------------------------------------

#if defined(__linux__)
// Workers 1 .. n-1 run on the same OS threads call after call (the pool's), and worker 0 on the
// caller; a call asking for more threads adds workers and keeps the old ones.
TEST(ThreadPool, WorkersPersistAcrossCalls) {
  auto worker_tids = [](int threads) {
    std::vector<long> t(static_cast<size_t>(threads), -1);
    parallel_for(threads, threads, [&](int64_t, int w) { t[static_cast<size_t>(w)] = tid(); }, 1, true);
    return t;
  };
  const std::vector<long> first = worker_tids(3);
  EXPECT_EQ(first[0], tid());
  EXPECT_GE(fna::cpu::pool_size(), 2);
  for (int c = 0; c < 20; ++c) EXPECT_EQ(worker_tids(3), first) << "call " << c;
  for (int c = 0; c < 5; ++c) EXPECT_EQ(worker_tids(2)[1], first[1]);
  const std::vector<long> grown = worker_tids(5);
  EXPECT_GE(fna::cpu::pool_size(), 4);
  EXPECT_EQ(grown[1], first[1]);
  EXPECT_EQ(grown[2], first[2]);
  EXPECT_EQ(std::set<long>(grown.begin(), grown.end()).size(), 5u) << "five distinct threads";
  EXPECT_EQ(worker_tids(5), grown);
}
#endif

TEST(ThreadPool, EveryTaskOnceAcrossManyCalls) {
  within(120, "many calls", [] { many_calls(101, 400, 6); });
}

void fixed_mode_sums();

// Fixed mode: the bits of the sequential schedule, through the pool, through a busy pool's
// own threads (another host thread holds it), and from a call nested in a job.
TEST(ThreadPool, FixedModeBitwiseAsSequentialSchedule) {
  within(120, "fixed-mode sums", [] { fixed_mode_sums(); });
}

void fixed_mode_sums() {
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const std::vector<float> x = random_floats(700 + seed, 1000 + 37 * seed);
    for (int threads : {1, 2, 3, 5}) {
      for (int64_t chunk : {1, 7}) {
        const float want = sequential_sum(x, threads, chunk);
        for (int rep = 0; rep < 5; ++rep) ASSERT_EQ(fixed_sum(x, threads, chunk), want);
        float busy = 0.f;
        {
          PoolHolder hold;
          busy = fixed_sum(x, threads, chunk);
        }
        EXPECT_EQ(busy, want) << "threads " << threads << " chunk " << chunk << " (busy pool)";
        float nested = 0.f;
        parallel_for(2, 2, [&](int64_t i, int) {
          if (i == 1) nested = fixed_sum(x, threads, chunk);
        });
        EXPECT_EQ(nested, want) << "threads " << threads << " chunk " << chunk << " (nested)";
      }
    }
  }
}

// Several host threads calling at once: whoever holds the pool, every call's tasks run once.
TEST(ThreadPool, ConcurrentCallers) {
  within(180, "concurrent callers", [] {
    std::vector<std::thread> callers;
    std::vector<std::string> failures(4);
    for (int h = 0; h < 4; ++h)
      callers.emplace_back([h, &failures] {
        Rng rng(900 + h);
        for (int c = 0; c < 150 && failures[h].empty(); ++c) {
          std::string why;
          if (!check_call(rng, rng.chance(0.5), static_cast<int>(rng.range(1, 4)), rng.range(0, 200),
                          rng.range(1, 4), rng.chance(0.3), &why))
            failures[h] = "caller " + std::to_string(h) + " call " + std::to_string(c) + ": " + why;
        }
      });
    for (std::thread& t : callers) t.join();
    for (const std::string& f : failures) EXPECT_TRUE(f.empty()) << f;
  });
}

// A job that calls parallel_for again (on the caller and on a worker) finishes: the inner calls
// find the pool busy and start threads of their own.
TEST(ThreadPool, NestedCallsDoNotDeadlock) {
  within(60, "nested calls", [] {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::atomic<int>> inner(3 * 50);
      for (auto& r : inner) r = 0;
      parallel_for(3, 3, [&](int64_t i, int) {
        parallel_for(50, 2, [&](int64_t j, int) { ++inner[static_cast<size_t>(i * 50 + j)]; });
      }, 1, rep % 2 == 0);
      for (size_t k = 0; k < inner.size(); ++k) ASSERT_EQ(inner[k], 1) << "rep " << rep << " task " << k;
    }
  });
}

// An exception in a task (on the caller or on a worker) reaches the caller once every worker has
// returned; the pool goes on working.
TEST(ThreadPool, ExceptionsReachTheCaller) {
  for (int thrower : {0, 1, 2}) {
    std::atomic<int> ran{0};
    EXPECT_THROW(parallel_for(30, 3, [&](int64_t i, int) {
                   ++ran;
                   if (i == thrower) throw std::runtime_error("task " + std::to_string(i));
                 }, 1, true),
                 std::runtime_error)
        << "thrower " << thrower;
    EXPECT_LE(ran.load(), 30);
    within(60, "calls after an exception", [] { many_calls(300, 50, 4); });
  }
}

#if defined(__linux__)
// After fork the child has none of the parent's workers: its calls start a fresh pool (a stale
// one would wait forever for workers that do not exist: SIGALRM).
TEST(ThreadPool, ForkedChildGetsAPoolOfItsOwn) {
  many_calls(400, 20, 4);  // the parent's pool exists
  ASSERT_GE(fna::cpu::pool_size(), 1);
  in_child(30, [] {
    Rng rng(401);
    for (int c = 0; c < 50; ++c) {
      std::string why;
      if (!check_call(rng, c % 2 == 0, 3, 100, 2, c % 3 == 0, &why)) {
        std::fprintf(stderr, "child: %s\n", why.c_str());
        _exit(1);
      }
    }
    _exit(fna::cpu::pool_size() >= 2 ? 0 : 2);
  });
  many_calls(402, 20, 4);  // and the parent's still works
}

// exit() joins the workers (static destruction) without hanging: after use, and while another
// thread is inside a call (its job finishes first; its later calls start threads of their own).
TEST(ThreadPool, ProcessExitsWithThePoolInUse) {
  in_child(30, [] {
    many_calls(500, 20, 4);
    std::exit(0);
  });
  in_child(30, [] {
    std::atomic<bool> started{false};
    std::thread busy([&] {
      for (;;) {
        parallel_for(64, 3, [&](int64_t, int) {
          started = true;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        });
      }
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    busy.detach();
    std::exit(0);
  });
}
#endif

// ---- the thread count ------------------------------------------------------------------------

TEST(NumThreads, SetGetRoundTrip) {
  DefaultThreadsAtExit restore;
  const int dflt = fna::get_num_threads();
  EXPECT_GE(dflt, 1);
  for (int n : {1, 3, 7, 1, fna::kMaxThreads}) {
    const fna::Status st = fna::set_num_threads(n);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(fna::get_num_threads(), n);
    EXPECT_EQ(fna::cpu::resolve_threads(0, 1 << 20), n) << "Options::num_threads = 0 follows it";
    EXPECT_EQ(fna::cpu::resolve_threads(2, 1 << 20), 2) << "Options::num_threads wins";
    EXPECT_EQ(fna::cpu::resolve_threads(0, 1), 1) << "at most one thread per task";
  }
  ASSERT_TRUE(fna::set_num_threads(0).ok());
  EXPECT_EQ(fna::get_num_threads(), dflt);
}

TEST(NumThreads, BadValuesNamed) {
  DefaultThreadsAtExit restore;
  ASSERT_TRUE(fna::set_num_threads(3).ok());
  for (int n : {-1, -1000, fna::kMaxThreads + 1, 1 << 30}) {
    const fna::Status st = fna::set_num_threads(n);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << n;
    EXPECT_NE(st.message.find("num_threads=" + std::to_string(n) + " must be in [0, 1024]"),
              std::string::npos)
        << st.message;
    EXPECT_EQ(fna::get_num_threads(), 3) << "a rejected value changes nothing";
  }
  // Options::num_threads at the API boundary.
  const fna_test::Case c = fna_test::random_case(31, 1, 1);
  fna_test::ProblemTensors t(c);
  for (int n : {-2, fna::kMaxThreads + 1}) {
    fna::Options o = fna_test::options_for(c, fna::Backend::cpu, n);
    const fna::Status st = fna::forward(c.p, t.forward_args(), o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument);
    EXPECT_NE(st.message.find("num_threads=" + std::to_string(n)), std::string::npos) << st.message;
  }
}

#if defined(__linux__)
// The default is the cores the process may run on (its affinity mask), not the machine's.
TEST(NumThreads, DefaultFollowsAffinity) {
  cpu_set_t old;
  ASSERT_EQ(sched_getaffinity(0, sizeof(old), &old), 0);
  EXPECT_EQ(fna::get_num_threads(), std::min(CPU_COUNT(&old), fna::kMaxThreads));
  if (CPU_COUNT(&old) < 2) GTEST_SKIP() << "one CPU available: nothing to restrict";
  int first = 0;
  while (!CPU_ISSET(first, &old)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int restricted = fna::get_num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof(old), &old), 0);
  EXPECT_EQ(restricted, 1);
}
#endif

// ---- through the backend ----------------------------------------------------------------------

std::vector<unsigned char> bytes_of(const fna_test::HostTensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.data());
  return {b, b + t.bytes()};
}

// The cpu forward gives the same bits on 1 .. 4 threads (each output row is one worker's), and
// through the process-wide count; the deterministic backward repeats its bits for one thread
// count through the pool and through a busy pool's own threads.
TEST(ThreadPool, BackendBitsAcrossThreadCountsAndPaths) {
  DefaultThreadsAtExit restore;
  for (uint64_t i = 0; i < 6; ++i) {
    const fna_test::Case c = fna_test::random_case(5200 + i, 1 + static_cast<int>(i % 3), 1);
    SCOPED_TRACE(c.str());
    fna_test::ProblemTensors t(c);
    t.c.with_lse = true;
    std::vector<unsigned char> out1;
    for (int threads : {1, 2, 3, 4}) {
      t.poison_outputs();
      fna::Options o = fna_test::options_for(c, fna::Backend::cpu, threads);
      ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
      if (threads == 1) out1 = bytes_of(t.o);
      else EXPECT_EQ(bytes_of(t.o), out1) << "forward on " << threads << " threads";
    }
    ASSERT_TRUE(fna::set_num_threads(3).ok());
    t.poison_outputs();
    ASSERT_TRUE(fna::forward(c.p, t.forward_args(), fna_test::options_for(c, fna::Backend::cpu, 0)).ok());
    EXPECT_EQ(bytes_of(t.o), out1) << "forward on the process-wide 3 threads";
    ASSERT_TRUE(fna::set_num_threads(0).ok());
    for (int threads : {2, 3}) {
      fna::Options o = fna_test::options_for(c, fna::Backend::cpu, threads);
      o.deterministic = true;
      std::vector<std::vector<unsigned char>> first;
      for (int run = 0; run < 3; ++run) {
        t.poison_outputs();
        ASSERT_TRUE(fna::forward(c.p, t.forward_args(), o).ok());
        fna::Status st;
        if (run == 2) {
          PoolHolder hold;  // this run's workers are threads of its own
          st = fna::backward(c.p, t.backward_args(), o);
        } else {
          st = fna::backward(c.p, t.backward_args(), o);
        }
        ASSERT_TRUE(st.ok()) << st.message;
        std::vector<std::vector<unsigned char>> got = {bytes_of(t.dq), bytes_of(t.dk), bytes_of(t.dv)};
        if (run == 0) first = got;
        else EXPECT_EQ(got, first) << threads << " threads, run " << run << (run == 2 ? " (busy pool)" : "");
      }
    }
  }
}

// fna::forward from several host threads at once (each on 2 threads: one caller holds the pool,
// the others start their own): every result has the bits of the same call made alone.
TEST(ThreadPool, ConcurrentForwardCalls) {
  std::vector<fna_test::Case> cases;
  std::vector<fna_test::ProblemTensors> tensors;
  std::vector<std::vector<unsigned char>> want;
  for (uint64_t i = 0; i < 4; ++i) {
    cases.push_back(fna_test::random_case(5300 + i, 2, 1));
    tensors.emplace_back(cases.back());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    tensors[i].poison_outputs();
    ASSERT_TRUE(fna::forward(cases[i].p, tensors[i].forward_args(),
                             fna_test::options_for(cases[i], fna::Backend::cpu, 2)).ok());
    want.push_back(bytes_of(tensors[i].o));
  }
  within(180, "concurrent forward calls", [&] {
    std::vector<std::string> failures(cases.size());
    std::vector<std::thread> callers;
    for (size_t i = 0; i < cases.size(); ++i)
      callers.emplace_back([&, i] {
        fna_test::ProblemTensors t(cases[i]);
        for (int rep = 0; rep < 25 && failures[i].empty(); ++rep) {
          t.poison_outputs();
          const fna::Status st =
              fna::forward(cases[i].p, t.forward_args(), fna_test::options_for(cases[i], fna::Backend::cpu, 2));
          if (!st.ok()) failures[i] = st.message;
          else if (bytes_of(t.o) != want[i]) failures[i] = "case " + std::to_string(i) + " rep " +
                                                           std::to_string(rep) + ": other bits";
        }
      });
    for (std::thread& t : callers) t.join();
    for (const std::string& f : failures) EXPECT_TRUE(f.empty()) << f;
  });
}

}  // namespace
