// Host-side float16 / bfloat16 <-> float conversions (round to nearest even), for the CPU backends.
#pragma once

#include <cstdint>
#include <cstring>

#include "fna/fna.h"

namespace fna {
namespace detail {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_to_float(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | man << 13);
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | man << 13);
  return bits_to_float(sign | (exp + 127 - 15) << 23 | man << 13);
}

inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;          // overflow (incl. rounding up) -> inf
  if (a < 0x38800000u) {                                // subnormal or zero in f16
    if (a < 0x33000000u) return sign;                   // rounds to zero
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                     // 14 + (112 - e) + 0
    // value = m * 2^(e-150); f16 subnormal unit = 2^-24 -> result = m >> (126 - e) rounded
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = a - 0x38000000u;                         // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

inline float load_as_float(const void* base, int64_t offset, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[offset];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[offset]);
    default: return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
  }
}

inline void store_from_float(void* base, int64_t offset, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[offset] = v; break;
    case DType::f16: static_cast<uint16_t*>(base)[offset] = float_to_f16(v); break;
    default: static_cast<uint16_t*>(base)[offset] = float_to_bf16(v); break;
  }
}

}  // namespace detail
}  // namespace fna
