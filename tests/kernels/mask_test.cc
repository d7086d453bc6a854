#include "kernels/mask.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::kernels {
namespace {

using ::testing::HasSubstr;

TEST(MaskTest, KeyPaddingMaskBroadcastsOverHeadsAndRows) {
  // [B=2, 1, 1, Lk=3]
  std::vector<uint8_t> m = {1, 1, 0, 1, 0, 0};
  auto v = BroadcastMask(m.data(), {2, 1, 1, 3}, 2, 4, 5, 3);
  ASSERT_TRUE(v.ok()) << v.status();
  for (int h = 0; h < 4; ++h) {
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(v->at(0, h, i, 2), 0);
      EXPECT_EQ(v->at(0, h, i, 1), 1);
      EXPECT_EQ(v->at(1, h, i, 0), 1);
      EXPECT_EQ(v->at(1, h, i, 1), 0);
    }
  }
}

TEST(MaskTest, TwoDimensionalMaskAlignsToTheRight) {
  // [Lq=2, Lk=2] lower triangle, shared by every batch item and head.
  std::vector<uint8_t> m = {1, 0, 1, 1};
  auto v = BroadcastMask(m.data(), {2, 2}, 3, 2, 2, 2);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->at(2, 1, 0, 1), 0);
  EXPECT_EQ(v->at(2, 1, 1, 0), 1);
  EXPECT_EQ(v->batch_stride, 0);
  EXPECT_EQ(v->head_stride, 0);
}

TEST(MaskTest, RejectsShapesThatDoNotBroadcast) {
  std::vector<uint8_t> m(6, 1);
  auto v = BroadcastMask(m.data(), {2, 3}, 1, 1, 2, 4);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("dimension 1 is 3; must be 1 or Lk (4)"));
  EXPECT_FALSE(BroadcastMask(m.data(), {1, 1, 1, 1, 6}, 1, 1, 1, 6).ok());
  EXPECT_FALSE(BroadcastMask(m.data(), {}, 1, 1, 1, 6).ok());
}

}  // namespace
}  // namespace attnserve::kernels
