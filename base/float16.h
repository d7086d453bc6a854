// The float16 and bfloat16 codec: one element at a time, to and from float32. The one copy in the
// tree: the kernels (kernels/dtype.h), the safetensors reader (model/) and the client's packing
// (client/float_codec.h) all call these, and the client package installs this header with them.
//
// Thread-safety: pure functions.
#ifndef ATTNSERVE_BASE_FLOAT16_H_
#define ATTNSERVE_BASE_FLOAT16_H_

#include <cstdint>

#include "absl/base/casts.h"

namespace attnserve {

// IEEE 754 binary16 -> binary32. Exact for every half value (subnormals, infinities and NaN
// included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / NaN
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return absl::bit_cast<float>(bits);
}

// binary32 -> binary16, rounding to nearest even; overflows to infinity and keeps NaN a quiet
// NaN.
inline uint16_t FloatToHalf(float f) {
  uint32_t bits = absl::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN stays a quiet NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs >= 0x38800000u) {                       // normal half
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal: zero
  // Subnormal half: shift the full mantissa right, rounding to nearest even.
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t half = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

// bfloat16 is the top half of a float32: widening is exact.
inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  return absl::bit_cast<float>(bits);
}

// Narrowing rounds to nearest even and keeps NaN a (quiet) NaN.
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits = absl::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_FLOAT16_H_
