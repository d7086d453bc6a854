// The client's float16/bfloat16 packing of tensors. The element codec is base/float16.h, the one
// the kernels use too (installed with the client), so the installed client library needs only
// the proto and base/, not the server's kernels library.
#ifndef ATTNSERVE_CLIENT_FLOAT_CODEC_H_
#define ATTNSERVE_CLIENT_FLOAT_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "base/float16.h"

namespace attnserve::codec {

// The element codec, as base/float16.h spells it (codec::HalfToFloat and so on).
using ::attnserve::BFloat16ToFloat;
using ::attnserve::FloatToBFloat16;
using ::attnserve::FloatToHalf;
using ::attnserve::HalfToFloat;

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
