#include "base/log_throttle.h"

#include <cstdint>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

// The first event of a key gets its line; the others within the period are counted, and the
// count comes with the first line after it. Keys are throttled apart.
TEST(LogThrottleTest, OneLineAKeyAPeriodWithTheCountLeftOut) {
  LogThrottle throttle(absl::Seconds(10));
  int64_t left_out = -1;
  ASSERT_TRUE(throttle.Admit("bob", kStart, &left_out));
  EXPECT_EQ(left_out, 0);
  for (int i = 1; i <= 5; ++i) {
    EXPECT_FALSE(throttle.Admit("bob", kStart + absl::Seconds(i), &left_out)) << i;
  }
  // Another key is not held back by bob's lines.
  ASSERT_TRUE(throttle.Admit("carol", kStart + absl::Seconds(5), &left_out));
  EXPECT_EQ(left_out, 0);
  // Just before the period ends: still held back; at its end, the line and the 6 left out.
  EXPECT_FALSE(throttle.Admit("bob", kStart + absl::Seconds(10) - absl::Nanoseconds(1), &left_out));
  ASSERT_TRUE(throttle.Admit("bob", kStart + absl::Seconds(10), &left_out));
  EXPECT_EQ(left_out, 6);
  // The count starts again from that line.
  EXPECT_FALSE(throttle.Admit("bob", kStart + absl::Seconds(11), &left_out));
  ASSERT_TRUE(throttle.Admit("bob", kStart + absl::Seconds(25), &left_out));
  EXPECT_EQ(left_out, 1);
  ASSERT_TRUE(throttle.Admit("bob", kStart + absl::Seconds(60), &left_out));
  EXPECT_EQ(left_out, 0);
}

TEST(LogThrottleTest, AZeroPeriodLetsEveryLineThrough) {
  LogThrottle throttle(absl::ZeroDuration());
  int64_t left_out = -1;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(throttle.Admit("bob", kStart, &left_out));
    EXPECT_EQ(left_out, 0);
  }
}

}  // namespace
}  // namespace attnserve
