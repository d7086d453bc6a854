#include "base/float16.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(Float16Test, EveryHalfRoundTripsExactly) {
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

TEST(Float16Test, HalfKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(Float16Test, FloatToHalfRoundsToNearestEven) {
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

TEST(Float16Test, BFloat16RoundsToNearestEvenAndKeepsNaN) {
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

#ifdef __FLT16_MAX__
// The compiler's own _Float16 (libgcc's or compiler-rt's conversions) as an independent reference:
// every half widens to the same float, and floats across the whole range (random bit patterns,
// then every float around the subnormal and overflow edges) narrow to the same half.
uint16_t CompilerHalf(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

TEST(Float16Test, MatchesTheCompilersFloat16) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    _Float16 x;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&x, &bits, sizeof bits);
    const float want = static_cast<float>(x);
    const float got = HalfToFloat(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0) << h;
    }
  }
  auto check = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    if (std::isnan(f)) return ::testing::AssertionSuccess();  // payloads may differ; covered above
    if (FloatToHalf(f) == CompilerHalf(f)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "float bits 0x" << std::hex << bits;
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) ASSERT_TRUE(check(rng()));
  for (uint32_t bits = 0x33000000u - 64; bits < 0x38800000u + 4096; bits += 7) {
    ASSERT_TRUE(check(bits));
    ASSERT_TRUE(check(bits | 0x80000000u));
  }
  for (uint32_t bits = 0x477fe000u; bits < 0x47800100u; ++bits) ASSERT_TRUE(check(bits));
}
#endif  // __FLT16_MAX__

}  // namespace
}  // namespace attnserve
