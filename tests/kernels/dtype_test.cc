#include "kernels/dtype.h"

#include <cstring>

#include "gtest/gtest.h"

namespace attnserve::kernels {
namespace {

// Found by fuzz_safetensors: an empty tensor's buffers may be null, and memcpy(nullptr, _, 0) is
// undefined behaviour (UBSan's nonnull-attribute check, in the sanitizer and clang legs).
TEST(DTypeTest, EmptyConversionsTouchNoPointer) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kBool}) {
    ToFloat32(t, nullptr, 0, nullptr);
    FromFloat32(t, nullptr, 0, nullptr);
  }
}

TEST(DTypeTest, PackedConversionsAreLittleEndian) {
  const unsigned char half_bytes[4] = {0x00, 0x3c, 0x00, 0xc0};  // 1.0, -2.0
  float out[2];
  ToFloat32(DType::kFloat16, half_bytes, 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  unsigned char back[4];
  FromFloat32(DType::kFloat16, out, 2, back);
  EXPECT_EQ(std::memcmp(back, half_bytes, 4), 0);
  FromFloat32(DType::kBFloat16, out, 2, back);
  const unsigned char bf16_bytes[4] = {0x80, 0x3f, 0x00, 0xc0};
  EXPECT_EQ(std::memcmp(back, bf16_bytes, 4), 0);
}

}  // namespace
}  // namespace attnserve::kernels
