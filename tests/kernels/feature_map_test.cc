// kernels/feature_map.h: FeatureExp against exp in float64 rounded to float (within 1 ulp, on a
// sample of every float below 0 and on the edges), elu + 1 and relu by their definitions, and
// linear_state's vectorised ApplyFeatureMap (the CPU's widest clone) bit for bit the scalar
// function the CUDA kernel calls.
#include "kernels/feature_map.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/linear_state.h"

namespace attnserve::kernels {
namespace {

using feature_map::EluPlusOne;
using feature_map::FeatureExp;

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}
uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

// Distance in ulps between two finite floats of the same sign (or zero).
int64_t UlpDistance(float a, float b) {
  return std::llabs(static_cast<int64_t>(Bits(a) & 0x7fffffffu) -
                    static_cast<int64_t>(Bits(b) & 0x7fffffffu));
}

float Exp64(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

// Every 241st float from -0 down to -inf: 8.9 million inputs, every binade, subnormal results
// included. (An exhaustive run over all 2^31 of them, once, found at most 1 ulp as well, and
// 9,477,924 results not correctly rounded.)
TEST(FeatureExpTest, WithinOneUlpOfExpBelowZero) {
  int64_t worst = 0;
  float worst_x = 0;
  int64_t inexact = 0, count = 0;
  for (uint64_t bits = 0x80000000u; bits <= 0xff800000u; bits += 241) {
    const float x = FromBits(static_cast<uint32_t>(bits));
    const float got = FeatureExp(x), want = Exp64(x);
    ASSERT_TRUE(std::isfinite(got)) << x;
    const int64_t d = UlpDistance(got, want);
    if (d > worst) worst = d, worst_x = x;
    inexact += d != 0;
    ++count;
  }
  EXPECT_LE(worst, 1) << "at x = " << worst_x;
  EXPECT_LT(inexact, count / 100);  // mostly correctly rounded
}

TEST(FeatureExpTest, Edges) {
  EXPECT_EQ(FeatureExp(0.0f), 1.0f);
  EXPECT_EQ(FeatureExp(-0.0f), 1.0f);
  EXPECT_EQ(Bits(FeatureExp(-std::numeric_limits<float>::infinity())), 0u);  // +0
  EXPECT_EQ(Bits(FeatureExp(-110.0f)), 0u);
  EXPECT_EQ(Bits(FeatureExp(-1000.0f)), 0u);
  // The smallest normal and subnormal results, rounded once.
  for (const float x : {-87.0f, -87.33654f, -87.5f, -90.0f, -100.0f, -103.0f, -103.9f, -104.0f}) {
    EXPECT_LE(UlpDistance(FeatureExp(x), Exp64(x)), 1) << x;
  }
  EXPECT_LE(UlpDistance(FeatureExp(-1e-30f), 1.0f), 1);
  EXPECT_EQ(FeatureExp(-std::numeric_limits<float>::denorm_min()), 1.0f);
}

TEST(FeatureMapTest, EluPlusOneByDefinition) {
  EXPECT_EQ(EluPlusOne(2.5f), 3.5f);
  EXPECT_EQ(EluPlusOne(1e-8f), 1.0f + 1e-8f);
  EXPECT_EQ(EluPlusOne(0.0f), 1.0f);
  EXPECT_EQ(EluPlusOne(-0.0f), 1.0f);
  EXPECT_EQ(EluPlusOne(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(EluPlusOne(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(EluPlusOne(std::nanf(""))));
  EXPECT_TRUE(std::isnan(EluPlusOne(-std::nanf(""))));
  for (const float x : {-0.5f, -1.0f, -3.25f, -20.0f}) {
    EXPECT_LE(UlpDistance(EluPlusOne(x), Exp64(x)), 1) << x;
  }
}

// ApplyFeatureMap (linear_state.cc, the clone this CPU picks) against the scalar inline
// functions, element by element, bit for bit: lengths that leave a vector remainder, values of
// both signs, every binade of exp's range, zeros, infinities and NaN.
TEST(FeatureMapTest, VectorLoopHasTheScalarBits) {
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 65537) {
    x.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  for (const float e : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::nanf(""), -1e-40f}) {
    x.push_back(e);
  }
  for (const int n : {static_cast<int>(x.size()), 1, 7, 17, 63}) {
    for (const FeatureMap map :
         {FeatureMap::kEluPlusOne, FeatureMap::kRelu, FeatureMap::kIdentity}) {
      std::vector<float> y(x.begin(), x.begin() + n);
      ApplyFeatureMap(map, y.data(), n);
      for (int i = 0; i < n; ++i) {
        const float want = feature_map::Feature(map, x[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(y[i])) << "map " << static_cast<int>(map) << " x " << x[i];
        } else {
          ASSERT_EQ(Bits(y[i]), Bits(want)) << "map " << static_cast<int>(map) << " x " << x[i];
        }
      }
    }
  }
  // relu by definition
  float r[4] = {-1.0f, 0.0f, 2.0f, -0.0f};
  ApplyFeatureMap(FeatureMap::kRelu, r, 4);
  EXPECT_EQ(r[0], 0.0f);
  EXPECT_EQ(r[2], 2.0f);
  EXPECT_EQ(Bits(r[3]), 0u);
}

}  // namespace
}  // namespace attnserve::kernels
