// fused::FastDiv (src/cuda/fused/kernel/common/fast_div.h), the multiply-and-shift division the
// fused kernels place their CTAs with, against the hardware's division: every divisor up to 2^12
// over dense and random dividends, large divisors, and the edges of the range (n < 2^31); and the
// Group::of overload that uses it against the one that divides.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/fused/kernel/common/fast_div.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace {

using fna::fused::FastDiv;

void check(uint32_t d, int n) {
  const FastDiv f(d);
  int q = -1;
  const int r = f.divmod(n, q);
  ASSERT_EQ(q, n / int(d)) << "n=" << n << " d=" << d;
  ASSERT_EQ(r, n % int(d)) << "n=" << n << " d=" << d;
}

TEST(FastDiv, SmallDivisorsDenseAndRandom) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> any(0, 0x7fffffff);
  for (uint32_t d = 1; d <= 4096; ++d) {
    for (int n = 0; n < 3 * int(d) + 70; ++n) check(d, n);
    for (int i = 0; i < 200; ++i) check(d, any(rng));
    // Around multiples of d near the top of the range, where the rounding error is largest.
    const int top = 0x7fffffff / int(d) * int(d);
    for (int n = top - 2; n <= top + int(d) - 1 && n >= 0; ++n) {
      if (uint32_t(n) > 0x7fffffffu) break;
      check(d, n);
    }
    check(d, 0x7fffffff);
  }
}

TEST(FastDiv, LargeDivisors) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> div(4097, 0x7fffffffu);
  std::uniform_int_distribution<int> any(0, 0x7fffffff);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t d = div(rng);
    check(d, any(rng));
    check(d, int(d) - 1);
    check(d, int(d));
    check(d, 0x7fffffff);
  }
  for (uint32_t s = 12; s < 31; ++s) {  // powers of two and their neighbors
    for (uint32_t d : {(1u << s) - 1, 1u << s, (1u << s) + 1}) {
      for (int i = 0; i < 200; ++i) check(d, any(rng));
      check(d, 0x7fffffff);
    }
  }
}

TEST(FastDiv, GroupOfMatchesDivision) {
  using fna::fused::Geometry;
  using fna::fused::Group;
  using fna::fused::kAxes;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    int64_t len[3], ker[3], dil[3], str[3];
    bool causal[3] = {false, false, false};
    for (int a = 0; a < 3; ++a) {
      dil[a] = 1 + int(rng() % 9);
      ker[a] = 1 + int(rng() % 5);
      len[a] = ker[a] * dil[a] + int(rng() % 40);
      str[a] = 1;
    }
    const Geometry geo = Geometry::lift(3, len, ker, dil, str, causal);
    FastDiv fd[kAxes];
    for (int a = 0; a < kAxes; ++a) fd[a] = FastDiv(uint32_t(geo.axis[a].dilation));
    for (int flat = 0; flat < geo.num_groups(); ++flat) {
      const Group a = Group::of(geo, flat), b = Group::of(geo, flat, fd);
      for (int ax = 0; ax < kAxes; ++ax) {
        ASSERT_EQ(a.g[ax], b.g[ax]) << "trial " << trial << " group " << flat;
        ASSERT_EQ(a.len[ax], b.len[ax]) << "trial " << trial << " group " << flat;
      }
    }
  }
}

}  // namespace
