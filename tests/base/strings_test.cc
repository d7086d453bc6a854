#include "base/strings.h"

#include <string>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

// The number N in "...[N bytes elided]...".
size_t ElidedCount(const std::string& s) {
  const size_t open = s.find("...[");
  const size_t close = s.find(" bytes elided]...");
  size_t n = 0;
  if (open == std::string::npos || close == std::string::npos ||
      !absl::SimpleAtoi(s.substr(open + 4, close - open - 4), &n)) {
    ADD_FAILURE() << "no marker in " << s;
  }
  return n;
}

TEST(ElideTest, ShortValuesAreKeptWhole) {
  EXPECT_EQ(Elide(""), "");
  EXPECT_EQ(Elide("module-1"), "module-1");
  EXPECT_EQ(Elide(std::string(96, 'a')), std::string(96, 'a'));
}

TEST(ElideTest, LongValuesKeepBothEndsAndSayHowMuchIsMissing) {
  const std::string value = "BEGIN" + std::string(10'000, 'x') + "END";
  for (size_t max : {40u, 96u, 512u}) {
    const std::string e = Elide(value, max);
    EXPECT_LE(e.size(), max);
    const size_t open = e.find("...["), close = e.rfind("]...") + 4;
    // Kept bytes plus elided bytes are the whole value.
    EXPECT_EQ(e.size() - (close - open) + ElidedCount(e), value.size()) << e;
    if (max >= 96) {
      EXPECT_THAT(e, StartsWith("BEGINxx"));
      EXPECT_THAT(e, EndsWith("xxEND"));
    }
  }
  EXPECT_EQ(BoundMessage(value).size(), Elide(value, kMaxErrorMessageBytes).size());
  EXPECT_LE(BoundMessage(value).size(), kMaxErrorMessageBytes);
}

TEST(ElideTest, CutsFallBetweenUtf8Characters) {
  // "é" is two bytes (0xc3 0xa9): whatever the bound, no character is split.
  std::string value;
  for (int i = 0; i < 1000; ++i) value += "\xc3\xa9";
  for (size_t max = 40; max < 120; ++max) {
    const std::string e = Elide(value, max);
    const size_t open = e.find("...[");
    const size_t close = e.rfind("]...") + 4;
    EXPECT_EQ(open % 2, 0u) << max;
    EXPECT_EQ((e.size() - close) % 2, 0u) << max;
    EXPECT_EQ(e.size() - (close - open) + ElidedCount(e), value.size());
  }
}

}  // namespace
}  // namespace attnserve
