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
