#include "kernels/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace attnserve::kernels {
namespace {

TEST(DTypeTest, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h << " -> " << f;
    }
  }
}

TEST(DTypeTest, HalfKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, FloatToHalfRoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties to even gives 1.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);          // rounds to infinity
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);          // largest finite
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0);  // tie with 0 and 2^-24: even is 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 1);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(DTypeTest, BFloat16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToBFloat16(f), b);
    }
  }
}

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
