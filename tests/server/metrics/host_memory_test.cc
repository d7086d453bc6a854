#include "server/metrics/host_memory.h"

#include "base/cgroup.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::metrics {
namespace {

using ::testing::Eq;
using ::testing::Optional;

TEST(HostMemoryTest, StatmResidentIsTheSecondFieldInPages) {
  EXPECT_THAT(ParseStatmResidentBytes("765 438 410 5 0 123 0\n", 4096), Optional(438 * 4096));
  EXPECT_EQ(ParseStatmResidentBytes("765", 4096), std::nullopt);
  EXPECT_EQ(ParseStatmResidentBytes("765 x 1", 4096), std::nullopt);
  EXPECT_EQ(ParseStatmResidentBytes("", 4096), std::nullopt);
}

TEST(HostMemoryTest, MeminfoTotal) {
  EXPECT_THAT(ParseMeminfoTotalBytes("MemTotal:       24683652 kB\nMemFree: 1 kB\n"),
              Optional(int64_t{24683652} * 1024));
  EXPECT_THAT(ParseMeminfoTotalBytes("Other: 1 kB\nMemTotal: 2 kB\n"), Optional(2048));
  EXPECT_EQ(ParseMeminfoTotalBytes("SwapMemTotal: 2 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMeminfoTotalBytes("MemTotal: 2 MB\n"), std::nullopt);
}

TEST(HostMemoryTest, CgroupLimit) {
  EXPECT_EQ(ParseCgroupLimitBytes("max\n"), std::nullopt);
  EXPECT_THAT(ParseCgroupLimitBytes("1073741824\n"), Optional(int64_t{1} << 30));
  EXPECT_THAT(ParseCgroupLimitBytes("9223372036854771712\n"),
              Optional(int64_t{9223372036854771712}));
  EXPECT_EQ(ParseCgroupLimitBytes("garbage"), std::nullopt);
}

TEST(HostMemoryTest, CgroupV2Path) {
  EXPECT_THAT(CgroupV2Path("0::/system.slice/attnserve.service\n"),
              Optional(Eq("/system.slice/attnserve.service")));
  EXPECT_THAT(CgroupV2Path("4:memory:/x\n1:cpu:/\n0::/\n"), Optional(Eq("/")));
  EXPECT_EQ(CgroupV2Path("4:memory:/x\n1:cpu:/\n"), std::nullopt);
}

TEST(HostMemoryTest, ReadsThisProcess) {
  const int64_t rss = ReadResidentBytes();
  EXPECT_GT(rss, 0);
  EXPECT_GE(ReadMemoryLimitBytes(), rss);
}

}  // namespace
}  // namespace attnserve::metrics
