// The client's own float16/bfloat16 packing, so that the installed client library needs only
// the proto (not the server's kernels library). Bit-for-bit the same conversions as
// kernels/dtype.h (tests/client/float_codec_test.cc checks every half and bfloat16 value).
#ifndef ATTNSERVE_CLIENT_FLOAT_CODEC_H_
#define ATTNSERVE_CLIENT_FLOAT_CODEC_H_

#include <cstddef>
#include <cstdint>

namespace attnserve::codec {

// IEEE 754 binary16 <-> binary32. Widening is exact for every value; narrowing rounds to
// nearest even, overflows to infinity and keeps NaN a quiet NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// bfloat16 (the top half of a binary32) <-> binary32; narrowing rounds to nearest even and keeps
// NaN a quiet NaN.
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// Element formats of attnserve.v1.Dtype that carry floats.
enum class FloatFormat { kFloat32, kFloat16, kBFloat16 };

// Bytes per element: 4, 2, 2.
constexpr size_t FormatSize(FloatFormat f) { return f == FloatFormat::kFloat32 ? 4 : 2; }

// Packs n floats as little-endian elements of `format` into dst (n * FormatSize bytes, no
// alignment needed), and back.
void Pack(FloatFormat format, const float* src, size_t n, void* dst);
void Unpack(FloatFormat format, const void* src, size_t n, float* dst);

}  // namespace attnserve::codec

#endif  // ATTNSERVE_CLIENT_FLOAT_CODEC_H_
