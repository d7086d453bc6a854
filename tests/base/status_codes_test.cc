#include "base/status_codes.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(StatusCodesTest, NamesAreAbseilsForEveryCode) {
  for (int code = 0; code < kNumStatusCodes; ++code) {
    EXPECT_EQ(StatusCodeName(code), absl::StatusCodeToString(static_cast<absl::StatusCode>(code)))
        << code;
  }
}

TEST(StatusCodesTest, NumbersOutsideTheRangeHaveNoName) {
  EXPECT_TRUE(StatusCodeName(-1).empty());
  EXPECT_TRUE(StatusCodeName(kNumStatusCodes).empty());
  EXPECT_TRUE(StatusCodeName(1000).empty());
}

}  // namespace
}  // namespace attnserve
