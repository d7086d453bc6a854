#include "base/flags_usage.h"

#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, flags_usage_test_flag, 7, "a flag defined in this file");

namespace attnserve {
namespace {

TEST(FlagsUsageTest, MainFileMatchesItsFlagsHoweverThePathIsSpelled) {
  // Abseil hands the filter the normalized name; main passes its raw __FILE__, which a plain
  // build spells as an absolute path (the --help tests failed in CI for exactly that).
  EXPECT_TRUE(IsFlagOfFile("/check/attnserve/server/main.cc", "check/attnserve/server/main.cc"));
  EXPECT_TRUE(IsFlagOfFile("/check/attnserve/server/main.cc", "/check/attnserve/server/main.cc"));
  EXPECT_TRUE(IsFlagOfFile("../server/main.cc", "../server/main.cc"));
  EXPECT_FALSE(IsFlagOfFile("/src/server/main.cc", "src/server/other.cc"));
  EXPECT_FALSE(IsFlagOfFile("/src/server/main.cc", "other/src/server/main.cc"));
  EXPECT_FALSE(IsFlagOfFile("/src/server/main.cc", "/usr/include/absl/flags/parse.cc"));
}

TEST(FlagsUsageTest, NormalizeDropsOnlyLeadingSlashes) {
  EXPECT_EQ(NormalizeFlagFilename("/a/b.cc"), "a/b.cc");
  EXPECT_EQ(NormalizeFlagFilename("//a/b.cc"), "a/b.cc");
  EXPECT_EQ(NormalizeFlagFilename("a/b.cc"), "a/b.cc");
  EXPECT_EQ(NormalizeFlagFilename("/"), "");
  EXPECT_EQ(NormalizeFlagFilename(""), "");
}

TEST(FlagsUsageTest, AFlagDefinedHereIsShownForThisFileInBothSpellings) {
  ShowFlagsOfFileInHelp(__FILE__);
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag("flags_usage_test_flag");
  ASSERT_NE(flag, nullptr);
  // Filename() is what --help groups and filters by.
  EXPECT_TRUE(IsFlagOfFile(__FILE__, flag->Filename())) << flag->Filename();
  EXPECT_TRUE(IsFlagOfFile(std::string("/") + __FILE__, flag->Filename())) << flag->Filename();
  EXPECT_EQ(flag->Filename(), NormalizeFlagFilename(__FILE__));
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_usage_test_flag), 7);
}

}  // namespace
}  // namespace attnserve
