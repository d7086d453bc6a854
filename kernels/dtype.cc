#include "kernels/dtype.h"

namespace attnserve::kernels {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "FLOAT32";
    case DType::kFloat16:
      return "FLOAT16";
    case DType::kBFloat16:
      return "BFLOAT16";
    case DType::kBool:
      return "BOOL";
  }
  return "UNKNOWN";
}

float HalfToFloat(uint16_t h) {
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
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
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

void ToFloat32(DType type, const void* src, size_t n, float* dst) {
  if (n == 0) return;  // an empty tensor's pointers may be null, which memcpy must not see
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (type) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = HalfToFloat(static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
      }
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = BFloat16ToFloat(static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
      }
      return;
    case DType::kBool:
      for (size_t i = 0; i < n; ++i) dst[i] = bytes[i] != 0 ? 1.0f : 0.0f;
      return;
  }
}

void FromFloat32(DType type, const float* src, size_t n, void* dst) {
  if (n == 0) return;  // as in ToFloat32
  auto* bytes = static_cast<unsigned char*>(dst);
  switch (type) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16:
    case DType::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = type == DType::kFloat16 ? FloatToHalf(src[i]) : FloatToBFloat16(src[i]);
        bytes[2 * i] = static_cast<unsigned char>(h & 0xff);
        bytes[2 * i + 1] = static_cast<unsigned char>(h >> 8);
      }
      return;
    case DType::kBool:
      for (size_t i = 0; i < n; ++i) bytes[i] = src[i] != 0.0f ? 1 : 0;
      return;
  }
}

}  // namespace attnserve::kernels
