// Shared-memory mbarriers (sm_80+) and warpgroup register reallocation (setmaxnreg, sm_90a) for
// warp-specialized kernels: producer warps publish a buffer with an arrive on its "full" barrier,
// consumer warps hand it back with an arrive on its "empty" barrier, and each side waits on the
// other's barrier by phase parity.
//
// Phase parity: a barrier starts in phase 0. Waiting for parity P returns once the phase of that
// parity has completed; right after init, waiting for parity 1 returns at once (the phase "before"
// phase 0 counts as completed), which is how a producer's first pass over empty buffers proceeds.
#pragma once

#include <cstdint>

namespace fna {
namespace mbar {

__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// After a thread's inits of barriers that TMA copies complete (their transaction counts are the
// async proxy's), before the CTA barrier that publishes them: the initialized barriers become
// visible to the async proxy too (sm_90; nothing elsewhere, where no TMA runs).
__device__ __forceinline__ void fence_init_for_tma() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Arrive (release semantics at CTA scope): the thread's earlier shared-memory writes are visible
// to threads that observe the phase completing.
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives when all of this thread's earlier cp.async copies have landed (the barrier's count
// must include this thread: .noinc does not add a pending arrival).
__device__ __forceinline__ void arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Blocks until the phase of parity `parity` has completed (acquire semantics at CTA scope).
// On sm_90 try_wait suspends the thread for a while between polls; sm_80 polls with test_wait.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
  } while (!done);
}

// Warpgroup register reallocation (every warp of the warpgroup runs it): a producer gives
// registers back, consumers take them.
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace mbar
}  // namespace fna
