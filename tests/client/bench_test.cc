// attnserve-bench's pieces that need no server: parsing the workload flags, the FLOP counts,
// the percentiles and the report renderings.
#include <cmath>
#include <random>

#include "client/bench/load.h"
#include "client/bench/stats.h"
#include "client/bench/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::bench {
namespace {

using ::testing::HasSubstr;

TEST(ParseShapesTest, FixedAndWeighted) {
  auto s = ParseShapes("1,8,128,64@3; 2,4,512,32", 4).value();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].batch, 1);
  EXPECT_EQ(s[0].heads, 8);
  EXPECT_EQ(s[0].seq_len, 128);
  EXPECT_EQ(s[0].head_dim, 64);
  EXPECT_EQ(s[0].weight, 3);
  EXPECT_EQ(s[1].weight, 1);
  auto m = ParseShapes("4,256", 2).value();
  EXPECT_EQ(m[0].batch, 4);
  EXPECT_EQ(m[0].seq_len, 256);
}

TEST(ParseShapesTest, ErrorsNameTheEntry) {
  EXPECT_THAT(ParseShapes("1,8,128", 4).status().message(), HasSubstr("'1,8,128'"));
  EXPECT_THAT(ParseShapes("1,0", 2).status().message(), HasSubstr("'0'"));
  EXPECT_THAT(ParseShapes("1,2@-1", 2).status().message(), HasSubstr("positive"));
  EXPECT_FALSE(ParseShapes("", 2).ok());
}

TEST(SeqLenTest, Distributions) {
  std::mt19937_64 rng(1);
  EXPECT_EQ(ParseSeqLen("").value().Draw(77, rng), 77);
  auto u = ParseSeqLen("uniform:10:20").value();
  auto ln = ParseSeqLen("lognormal:100:0.5:300").value();
  auto c = ParseSeqLen("choice:3,5").value();
  for (int i = 0; i < 1000; ++i) {
    const int64_t a = u.Draw(1, rng), b = ln.Draw(1, rng), x = c.Draw(1, rng);
    EXPECT_GE(a, 10);
    EXPECT_LE(a, 20);
    EXPECT_GE(b, 1);
    EXPECT_LE(b, 300);
    EXPECT_TRUE(x == 3 || x == 5);
  }
  EXPECT_FALSE(ParseSeqLen("uniform:20:10").ok());
  EXPECT_FALSE(ParseSeqLen("gamma:1").ok());
}

TEST(WorkloadTest, FlopsTokensAndWeights) {
  WorkloadOptions o;
  o.shapes = ParseShapes("1,2,16,8@3;2,2,32,8@1", 4).value();
  Workload w = Workload::Create(o).value();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w.at(0).tokens, 16);
  EXPECT_EQ(w.at(1).tokens, 64);
  EXPECT_DOUBLE_EQ(w.at(0).flops, 2.0 * 1 * 2 * 16 * 16 * (8 + 8));
  EXPECT_DOUBLE_EQ(w.mean_tokens(), (3 * 16 + 64) / 4.0);
  std::mt19937_64 rng(3);
  int first = 0;
  for (int i = 0; i < 4000; ++i) first += w.Draw(rng) == 0;
  EXPECT_NEAR(first / 4000.0, 0.75, 0.03);
  EXPECT_EQ(w.at(0).attend->query().shape_size(), 4);
}

TEST(WorkloadTest, MultiHeadFlopsCountProjections) {
  // d_model 4, Lq = Lk = 2, B 1: projections 2*(2*2+2*2)*16 = 256, attention 2*2*2*8 = 64.
  EXPECT_DOUBLE_EQ(MultiHeadFlops(1, 2, 2, 4), 256 + 64);
  WorkloadOptions o;
  o.multi_head = true;
  o.d_model = 64;
  o.shapes = ParseShapes("1,10", 2).value();
  o.seq_len = ParseSeqLen("uniform:5:9").value();
  o.pool_size = 8;
  Workload w = Workload::Create(o).value();
  EXPECT_EQ(w.size(), 8u);
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(w.at(i).mha != nullptr);
    EXPECT_GE(w.at(i).mha->query().shape(1), 5);
    EXPECT_LE(w.at(i).mha->query().shape(1), 9);
  }
  o.d_model = 0;
  EXPECT_FALSE(Workload::Create(o).ok());
}

TEST(StatsTest, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1; i <= 1000; ++i) v.push_back(i);
  std::shuffle(v.begin(), v.end(), std::mt19937(1));
  Distribution d = Summarise(v);
  EXPECT_EQ(d.p50, 500);
  EXPECT_EQ(d.p90, 900);
  EXPECT_EQ(d.p99, 990);
  EXPECT_EQ(d.p999, 999);
  EXPECT_EQ(d.max, 1000);
  EXPECT_DOUBLE_EQ(d.mean, 500.5);
  EXPECT_EQ(Summarise({}).max, 0);
  EXPECT_EQ(Summarise({7}).p50, 7);
}

TEST(StatsTest, PhaseSummaryCountsErrorsAndWork) {
  std::vector<Sample> s(10);
  for (int i = 0; i < 10; ++i) {
    s[i].latency_us = 1000 * (i + 1);
    s[i].server_us = 500;
    s[i].queued_us = 100;
    s[i].compute_us = 300;
    s[i].batch_size = 2;
    s[i].item = i % 2;
  }
  s[3].code = 14;
  s[4].code = 14;
  s[5].code = 4;
  PhaseReport r = Summarise(s, {10, 20}, {1e9, 2e9}, 2.0, 1.5);
  EXPECT_EQ(r.sent, 10);
  EXPECT_EQ(r.ok, 7);
  EXPECT_EQ(r.errors["UNAVAILABLE"], 2);
  EXPECT_EQ(r.errors["DEADLINE_EXCEEDED"], 1);
  EXPECT_DOUBLE_EQ(r.requests_per_s, 3.5);
  EXPECT_DOUBLE_EQ(r.latency_ms.max, 10);
  EXPECT_DOUBLE_EQ(r.queued_ms_mean, 0.1);
  EXPECT_DOUBLE_EQ(r.batch_size_mean, 2);
  r.name = "step1";
  r.level_kind = "rate";
  r.level = 5;
  const std::string csv = ToCsv({r});
  EXPECT_THAT(csv, HasSubstr("phase,level_kind,level"));
  EXPECT_THAT(csv, HasSubstr("step1,rate,5,"));
  EXPECT_THAT(ToText({r}), HasSubstr("UNAVAILABLE=2"));
}

TEST(ScheduleTest, RampLevels) {
  EXPECT_THAT(RampLevels(10, 40, 4), ::testing::ElementsAre(10, 20, 30, 40));
  EXPECT_THAT(RampLevels(10, 40, 1), ::testing::ElementsAre(40));
}

}  // namespace
}  // namespace attnserve::bench
