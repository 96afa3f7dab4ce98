// LD_PRELOAD timer of CUDA runtime calls: wraps the calls fna's host path makes, sums their wall
// time and counts, prints them at exit (to stderr), so host cost can be attributed.
//   gcc -shared -fPIC -O2 tools/experiments/cudart_timer.c -o /tmp/libcudart_timer.so -ldl
//   LD_PRELOAD=/tmp/libcudart_timer.so /tmp/host_cost 2d-nat 100
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

enum { kPtr, kFuncSet, kFuncGet, kLaunch, kAttr, kGetDev, kSetDev, kCount, kEntry, kLast, kLaunch2, kTma, kN };
static const char* names[kN] = {"cudaPointerGetAttributes", "cudaFuncSetAttribute",
                                "cudaFuncGetAttributes", "cudaLaunchKernel",
                                "cudaDeviceGetAttribute", "cudaGetDevice", "cudaSetDevice",
                                "cudaGetDeviceCount", "cudaGetDriverEntryPointByVersion",
                                "cudaGetLastError", "__cudaLaunchKernel",
                                "cuTensorMapEncodeTiled (driver)"};
static double total[kN];
static long calls[kN];

__attribute__((destructor)) static void report(void) {
  for (int i = 0; i < kN; ++i)
    if (calls[i])
      fprintf(stderr, "cudart_timer: %-34s %8ld calls %10.1f us total %8.2f us per call\n",
              names[i], calls[i], total[i], total[i] / calls[i]);
}

#define WRAP(idx, ret, name, params, args)               \
  ret name params {                                      \
    static ret(*real) params = 0;                        \
    if (!real) real = (ret(*) params)dlsym(RTLD_NEXT, #name); \
    double t0 = now_us();                                \
    ret r = real args;                                   \
    total[idx] += now_us() - t0;                         \
    ++calls[idx];                                        \
    return r;                                            \
  }

typedef int cudaError_t;
typedef struct { unsigned x, y, z; } dim3_t;
WRAP(kPtr, cudaError_t, cudaPointerGetAttributes, (void* a, const void* p), (a, p))
WRAP(kFuncSet, cudaError_t, cudaFuncSetAttribute, (const void* f, int a, int v), (f, a, v))
WRAP(kFuncGet, cudaError_t, cudaFuncGetAttributes, (void* a, const void* f), (a, f))
WRAP(kLaunch, cudaError_t, cudaLaunchKernel,
     (const void* f, dim3_t g, dim3_t b, void** a, size_t s, void* st), (f, g, b, a, s, st))
WRAP(kAttr, cudaError_t, cudaDeviceGetAttribute, (int* v, int a, int d), (v, a, d))
WRAP(kGetDev, cudaError_t, cudaGetDevice, (int* d), (d))
WRAP(kSetDev, cudaError_t, cudaSetDevice, (int d), (d))
WRAP(kCount, cudaError_t, cudaGetDeviceCount, (int* n), (n))
WRAP(kLaunch2, cudaError_t, __cudaLaunchKernel,
     (const void* f, dim3_t g, dim3_t b, void** a, size_t s, void* st), (f, g, b, a, s, st))

// cuTensorMapEncodeTiled is reached through the driver entry point: hand out a timed trampoline.
typedef int (*encode_t)(void*, int, unsigned, void*, const void*, const void*, const void*,
                        const void*, int, int, int, int);
static encode_t real_encode;
static int timed_encode(void* m, int dt, unsigned r, void* g, const void* d, const void* s,
                        const void* b, const void* e, int i, int sw, int l2, int oob) {
  double t0 = now_us();
  int res = real_encode(m, dt, r, g, d, s, b, e, i, sw, l2, oob);
  total[kTma] += now_us() - t0;
  ++calls[kTma];
  return res;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* sym, void** f, unsigned v,
                                             unsigned long long fl, void* st) {
  static cudaError_t (*real)(const char*, void**, unsigned, unsigned long long, void*) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "cudaGetDriverEntryPointByVersion");
  double t0 = now_us();
  cudaError_t r = real(sym, f, v, fl, st);
  total[kEntry] += now_us() - t0;
  ++calls[kEntry];
  if (r == 0 && f && *f && sym && !strcmp(sym, "cuTensorMapEncodeTiled")) {
    real_encode = (encode_t)*f;
    *f = (void*)timed_encode;
  }
  return r;
}
WRAP(kLast, cudaError_t, cudaGetLastError, (void), ())
