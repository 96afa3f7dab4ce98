// core/dtype.h: float16 / bfloat16 <-> float32, checked against brute-force round-to-nearest-even
// computed in float64 (and against the compiler's _Float16 where it exists): every 16-bit
// pattern, every tie between neighbors, subnormals, overflow, inf and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "support/problem.h"

namespace fna_test {
namespace {

using fna::detail::bf16_to_float;
using fna::detail::f16_to_float;
using fna::detail::float_to_bf16;
using fna::detail::float_to_f16;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The value of an f16 pattern from the IEEE definition.
double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(m, -24);
  else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

// Round-to-nearest-even of a finite or infinite float to f16, by search over the positive values.
uint16_t f16_brute(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a) || a >= 65520.0) return sign | 0x7c00;  // 65520 = max + half ulp: ties to inf (even)
  uint16_t lo = 0, hi = 0x7bff;  // largest pattern with value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (f16_value(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | lo;  // a in [65504, 65520)
  const double dl = a - f16_value(lo), dh = f16_value(static_cast<uint16_t>(lo + 1)) - a;
  uint16_t r = lo;
  if (dh < dl || (dh == dl && (lo & 1))) r = static_cast<uint16_t>(lo + 1);
  return sign | r;
}

uint16_t bf16_brute(float f) {
  const uint32_t u = bits(f);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // toward zero / away from zero
  const double a = std::fabs(static_cast<double>(f));
  const double dl = a - std::fabs(static_cast<double>(from_bits(lo)));
  // Rounding past the largest finite value goes to inf, which counts as 2^128 for the distance.
  const bool hi_inf = (hi & 0x7fffffffu) == 0x7f800000u;
  const double dh = (hi_inf ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(from_bits(hi)))) - a;
  if (dh < dl || (dh == dl && ((lo >> 16) & 1))) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(lo >> 16);
}

TEST(DType, F16ToFloatEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    if (f16_is_nan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
#ifdef __FLT16_MAX__
    _Float16 c;
    const uint16_t hh = static_cast<uint16_t>(h);
    std::memcpy(&c, &hh, 2);
    ASSERT_EQ(f, static_cast<float>(c)) << std::hex << h;
#endif
  }
}

TEST(DType, F16RoundTripEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t r = float_to_f16(f16_to_float(static_cast<uint16_t>(h)));
    if (f16_is_nan(static_cast<uint16_t>(h))) ASSERT_TRUE(f16_is_nan(r)) << std::hex << h;
    else ASSERT_EQ(r, h) << std::hex << h;
  }
}

void expect_f16(float f) {
  const uint16_t got = float_to_f16(f);
  ASSERT_EQ(got, f16_brute(f)) << "f=" << f << std::hex << " bits=" << bits(f);
#ifdef __FLT16_MAX__
  const _Float16 c = static_cast<_Float16>(f);
  uint16_t cb;
  std::memcpy(&cb, &c, 2);
  ASSERT_EQ(got, cb) << "f=" << f;
#endif
}

TEST(DType, FloatToF16TiesSubnormalsOverflow) {
  // Every midpoint between neighboring f16 values (the ties), and one float ulp either side.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double mid = (f16_value(static_cast<uint16_t>(h)) + f16_value(static_cast<uint16_t>(h + 1))) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // exactly representable in float
    for (float f : {m, std::nextafter(m, 0.f), std::nextafter(m, 1e9f)}) {
      expect_f16(f);
      expect_f16(-f);
    }
  }
  for (float f : {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 65536.f, 1e30f, std::ldexp(1.f, -24),
                  std::ldexp(1.f, -25), std::ldexp(1.5f, -25), std::ldexp(1.f, -26), 1e-30f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity()})
    expect_f16(f);
  EXPECT_TRUE(f16_is_nan(float_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(f16_is_nan(float_to_f16(from_bits(0x7f800001u))));  // signalling NaN stays NaN
}

TEST(DType, FloatToF16Random) {
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    // Uniform exponents over the f16 range and around it.
    const float f = std::ldexp(static_cast<float>(rng.uniform() * 2 - 1), static_cast<int>(rng.range(-30, 18)));
    expect_f16(f);
  }
}

TEST(DType, BF16EveryPatternAndRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(bits(f), h << 16);
    const uint16_t r = float_to_bf16(f);
    if (std::isnan(f)) ASSERT_TRUE(std::isnan(bf16_to_float(r))) << std::hex << h;
    else ASSERT_EQ(r, h) << std::hex << h;
  }
}

TEST(DType, FloatToBF16RoundingAndSpecials) {
  Rng rng(2);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng.next());
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = from_bits(u);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << u;
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), bf16_brute(f)) << std::hex << u;
  }
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));  // not inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie to even (up)
}

// load / store through the dtype switch.
TEST(DType, LoadStore) {
  std::vector<uint16_t> h(3);
  fna::detail::store_from_float(h.data(), 1, fna::DType::f16, 1.0009765625f);
  EXPECT_EQ(h[1], 0x3c01);
  EXPECT_EQ(fna::detail::load_as_float(h.data(), 1, fna::DType::f16), 1.0009765625f);
  fna::detail::store_from_float(h.data(), 2, fna::DType::bf16, -2.f);
  EXPECT_EQ(h[2], 0xc000);
  EXPECT_EQ(fna::detail::load_as_float(h.data(), 2, fna::DType::bf16), -2.f);
  float f[2] = {0, 0};
  fna::detail::store_from_float(f, 1, fna::DType::f32, 3.25f);
  EXPECT_EQ(fna::detail::load_as_float(f, 1, fna::DType::f32), 3.25f);
}

}  // namespace
}  // namespace fna_test
