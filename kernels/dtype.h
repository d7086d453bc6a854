// Element types on the wire and their conversions to and from float32, the type every kernel
// computes in on the CPU. FLOAT16 and BFLOAT16 are converted at the edges of a request.
#ifndef ATTNSERVE_KERNELS_DTYPE_H_
#define ATTNSERVE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace attnserve::kernels {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kBool };

// Bytes per element: 4, 2, 2, 1.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType t);

// IEEE 754 binary16 <-> binary32. Exact for every half value (subnormals, infinities and NaN
// included); float -> half rounds to nearest even.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// bfloat16 is the top half of a float32: widening is exact; narrowing rounds to nearest even
// and keeps NaN a (quiet) NaN.
inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Converts n packed little-endian elements of `type` (FLOAT32, FLOAT16 or BFLOAT16) at `src` to
// float32, and back. `src`/`dst` need no alignment.
void ToFloat32(DType type, const void* src, size_t n, float* dst);
void FromFloat32(DType type, const float* src, size_t n, void* dst);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_DTYPE_H_
