// The CPU backends' workers: a persistent thread pool (created on first use, grown when a call
// asks for more threads, reused by every later call), and the process-wide thread count.
//
// run_workers(n, job) calls job(id) for id in [0, n) concurrently: id 0 on the calling thread,
// the others on pool workers, and returns when all have returned. The pool runs one call at a
// time; a call that finds it busy (another host thread's call, or a call from inside a job)
// starts threads of its own for that call instead, so callers never wait on each other and
// nested calls cannot deadlock. After fork the child starts a fresh pool (pthread_atfork); at
// process exit the workers are joined once no call is running (static destruction), and a call
// made after that (from a later static destructor) starts threads of its own.
#pragma once

#include <cstdint>

namespace fna {
namespace cpu {

// A reference to a callable taking the worker id (no allocation; the callable outlives the call).
struct JobRef {
  void (*call)(void* ctx, int id);
  void* ctx;
};

// job(0 .. n-1) as described above. An exception thrown by a job is rethrown here (the first one)
// once every job has returned.
void run_job(int n, JobRef job);

template <typename F>
void run_workers(int n, F& f) {
  run_job(n, JobRef{[](void* ctx, int id) { (*static_cast<F*>(ctx))(id); }, &f});
}

// The CPU cores this process may run on: its affinity mask (sched_getaffinity) on Linux, else
// std::thread::hardware_concurrency; at least 1, at most fna::kMaxThreads.
int available_cores();

// The threads a call with Options::num_threads = 0 uses: fna::set_num_threads's value, or
// available_cores() when it is 0 (the default).
int default_threads();

// Process-wide setting behind fna::set_num_threads (0 = available_cores()); the value is checked
// by the caller.
void set_default_threads(int n);

// Workers the pool holds now (for tests: it grows on demand and never shrinks).
int pool_size();

}  // namespace cpu
}  // namespace fna
