#include "client/float_codec.h"

#include <cstring>

namespace attnserve::codec {

void Pack(FloatFormat format, const float* src, size_t n, void* dst) {
  auto* bytes = static_cast<unsigned char*>(dst);
  if (format == FloatFormat::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));  // the wire is little-endian, like x86 and arm64
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h =
        format == FloatFormat::kFloat16 ? FloatToHalf(src[i]) : FloatToBFloat16(src[i]);
    bytes[2 * i] = static_cast<unsigned char>(h & 0xff);
    bytes[2 * i + 1] = static_cast<unsigned char>(h >> 8);
  }
}

void Unpack(FloatFormat format, const void* src, size_t n, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  if (format == FloatFormat::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    dst[i] = format == FloatFormat::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
  }
}

}  // namespace attnserve::codec
