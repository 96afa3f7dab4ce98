// Division by a run-time divisor as a multiply and a shift (Granlund and Montgomery's "round up"
// method), for the kernels' per-CTA index arithmetic: a CTA of a small problem otherwise spends a
// third of its instructions on the ~15 integer divisions that place it (fwd_tile, Group::of).
//
// For a divisor d >= 1 let l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 (< 2^32). Then
// for every 0 <= n < 2^31, n / d == (umulhi(n, m) + n) >> l: the 33-bit multiplier 2^32 + m is
// 2^(32+l) / d rounded up, and its error times n stays below one unit of the quotient. d = 1 gives
// m = 1, l = 0 (umulhi is 0). Exactness over the whole range is checked by fast_div_test.cpp.
#pragma once

#include <cstdint>

#include "core/neighborhood.h"  // FNA_HD

namespace fna {
namespace fused {

struct FastDiv {
  uint32_t d = 1;    // the divisor
  uint32_t mul = 1;  // m
  uint32_t shr = 0;  // l

  FastDiv() = default;
  // d must be >= 1 and < 2^31 (the host builds these from validated sizes).
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < divisor) ++l;
    shr = l;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << l) - divisor)) / divisor + 1);
  }
  // n / d for 0 <= n < 2^31.
  FNA_HD int div(int n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(uint32_t(n), mul);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(n)) * mul) >> 32);
#endif
    return int((hi + uint32_t(n)) >> shr);
  }
  // n % d, with the quotient in q.
  FNA_HD int divmod(int n, int& q) const {
    q = div(n);
    return n - q * int(d);
  }
};

}  // namespace fused
}  // namespace fna
