// The numbers behind attnserve-bench's charts, against values worked out by hand: log-scale
// histogram bins, per-second buckets, axis ranges and ticks, pixel positions, and the escaping of
// text into HTML and SVG.
#include <cmath>
#include <string>
#include <vector>

#include "client/bench/chart.h"
#include "client/bench/stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(HtmlEscapeTest, EveryMarkupCharacter) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">Tom & 'Jerry'</a>"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain 1,8,128,64 µs"), "plain 1,8,128,64 µs");
  EXPECT_EQ(HtmlEscape("&amp;"), "&amp;amp;");
  EXPECT_EQ(HtmlEscape(""), "");
}

TEST(LogBinTest, BinsOfATenthOfADecade) {
  // Bin k holds [10^(k/10), 10^((k+1)/10)) ms.
  EXPECT_EQ(LogBin(1.0, 10), 0);     // [1, 1.2589)
  EXPECT_EQ(LogBin(0.999, 10), -1);  // [0.7943, 1)
  EXPECT_EQ(LogBin(1.2589, 10), 0);  // 10^0.1 = 1.258925...
  EXPECT_EQ(LogBin(1.26, 10), 1);
  EXPECT_EQ(LogBin(10.0, 10), 10);
  EXPECT_EQ(LogBin(0.1, 10), -10);
  EXPECT_EQ(LogBin(0.05, 10), -14);  // [0.0398, 0.0501)
  EXPECT_EQ(LogBin(3.0, 10), 4);     // [2.512, 3.162)
  // Exactly on a computed edge: the value belongs to the bin it opens.
  EXPECT_EQ(LogBin(std::pow(10.0, 0.3), 10), 3);
  EXPECT_EQ(LogBin(std::pow(10.0, 0.7), 10), 7);
  // One bin per decade.
  EXPECT_EQ(LogBin(3.0, 1), 0);
  EXPECT_EQ(LogBin(30.0, 1), 1);
  EXPECT_EQ(LogBin(0.3, 1), -1);
  // Zero counts as 1 ns (1e-6 ms): bin -60.
  EXPECT_EQ(LogBin(0.0, 10), -60);
}

TEST(LogBinTest, HistogramKeepsFirstToLastNonEmptyBin) {
  const LogHistogram h = MakeLogHistogram({0.5, 1, 1.1, 3, 3});
  // 0.5 -> bin -4 ([0.398, 0.501)), 1 and 1.1 -> 0, 3 -> 4.
  EXPECT_EQ(h.bins_per_decade, 10);
  EXPECT_EQ(h.first_bin, -4);
  EXPECT_THAT(h.counts, ElementsAre(1, 0, 0, 0, 2, 0, 0, 0, 2));
  EXPECT_EQ(h.Total(), 5);
  EXPECT_DOUBLE_EQ(h.LowerMs(0), std::pow(10.0, -0.4));
  EXPECT_DOUBLE_EQ(h.UpperMs(8), std::pow(10.0, 0.5));
  EXPECT_DOUBLE_EQ(h.UpperMs(3), h.LowerMs(4));
  EXPECT_TRUE(MakeLogHistogram({}).counts.empty());
  EXPECT_EQ(MakeLogHistogram({}).Total(), 0);
}

Sample At(double intended_s, double completed_s, int code = 0) {
  Sample s;
  s.intended_ns = static_cast<int64_t>(intended_s * 1e9);
  s.completed_ns = static_cast<int64_t>(completed_s * 1e9);
  s.latency_us = (completed_s - intended_s) * 1e6;
  s.code = code;
  return s;
}

TEST(BucketizeTest, SecondsWithAShortRemainderFoldedIntoTheLast) {
  const std::vector<Sample> s = {At(0.2, 0.5), At(0.9, 1.2, 14), At(2.5, 3.25)};
  // 3.3 s: two whole seconds and a last bucket of 1.3 s (0.3 s is less than half a bucket).
  const TimeSeries t = Bucketize(s, 0, 3'300'000'000);
  EXPECT_THAT(t.t_s, ElementsAre(0, 1, 2));
  ASSERT_EQ(t.width_s.size(), 3u);
  EXPECT_DOUBLE_EQ(t.width_s[0], 1);
  EXPECT_DOUBLE_EQ(t.width_s[1], 1);
  EXPECT_NEAR(t.width_s[2], 1.3, 1e-9);
  EXPECT_THAT(t.sent, ElementsAre(2, 0, 1));    // by intended send time (0.2, 0.9, 2.5)
  EXPECT_THAT(t.ok, ElementsAre(1, 0, 1));      // by completion time
  EXPECT_THAT(t.errors, ElementsAre(0, 1, 0));  // 14 = UNAVAILABLE
  EXPECT_NEAR(t.p99_ms[0], 300, 1e-6);
  EXPECT_NEAR(t.p99_ms[1], 300, 1e-6);
  EXPECT_NEAR(t.p99_ms[2], 750, 1e-6);
}

TEST(BucketizeTest, ARemainderOfHalfABucketStandsAlone) {
  const TimeSeries t = Bucketize({At(3.1, 3.55)}, 0, 3'600'000'000);
  EXPECT_THAT(t.t_s, ElementsAre(0, 1, 2, 3));
  EXPECT_NEAR(t.width_s[3], 0.6, 1e-9);
  EXPECT_THAT(t.sent, ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(t.p99_ms, ElementsAre(0, 0, 0, ::testing::DoubleNear(450, 1e-6)));
}

TEST(BucketizeTest, OffsetStartShortPhaseAndP99PerBucket) {
  // A phase from 10 s to 10.4 s: one bucket as long as the phase.
  const TimeSeries shortp = Bucketize({At(10.1, 10.2)}, 10'000'000'000, 10'400'000'000);
  EXPECT_THAT(shortp.t_s, ElementsAre(0));
  EXPECT_NEAR(shortp.width_s[0], 0.4, 1e-9);
  // 100 completions in the second bucket with latencies 1..100 ms: nearest-rank p99 is 99 ms.
  std::vector<Sample> s;
  for (int i = 1; i <= 100; ++i) s.push_back(At(1.5 - i / 1000.0, 1.5));
  const TimeSeries t = Bucketize(s, 0, 2'000'000'000);
  EXPECT_THAT(t.ok, ElementsAre(0, 100));
  EXPECT_NEAR(t.p99_ms[1], 99, 1e-6);
  // Times past the end count in the last bucket, before the start in the first.
  const TimeSeries edge = Bucketize({At(-0.5, 2.0)}, 0, 2'000'000'000);
  EXPECT_THAT(edge.sent, ElementsAre(1, 0));
  EXPECT_THAT(edge.ok, ElementsAre(0, 1));
}

TEST(AxisTest, LinearRangesAndTicks) {
  Axis a = LinearAxis(37);
  EXPECT_FALSE(a.log);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 40);
  EXPECT_THAT(a.ticks, ElementsAre(0, 10, 20, 30, 40));
  EXPECT_THAT(LinearAxis(100).ticks, ElementsAre(0, 20, 40, 60, 80, 100));
  EXPECT_THAT(LinearAxis(1234).ticks, ElementsAre(0, 500, 1000, 1500));
  EXPECT_THAT(LinearAxis(103.7).ticks, ElementsAre(0, 20, 40, 60, 80, 100, 120));
  EXPECT_THAT(LinearAxis(4).ticks, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(LinearAxis(16.5).ticks, ElementsAre(0, 5, 10, 15, 20));
  a = LinearAxis(0.9);
  EXPECT_NEAR(a.hi, 1, 1e-12);
  ASSERT_EQ(a.ticks.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(a.ticks[i], 0.2 * i, 1e-12);
  a = LinearAxis(0);
  EXPECT_EQ(a.hi, 1);
  EXPECT_EQ(a.ticks.size(), 6u);
  EXPECT_EQ(LinearAxis(NAN).hi, 1);
}

TEST(AxisTest, LogRangesAndTicks) {
  Axis a = LogAxis(0.37, 12);  // three decades: powers of ten only
  EXPECT_TRUE(a.log);
  EXPECT_DOUBLE_EQ(a.lo, 0.1);
  EXPECT_DOUBLE_EQ(a.hi, 100);
  EXPECT_THAT(a.ticks, ElementsAre(0.1, 1, 10, 100));
  a = LogAxis(1, 100);  // two decades, ends exactly on powers of ten: 1-2-5 ticks
  EXPECT_EQ(a.lo, 1);
  EXPECT_EQ(a.hi, 100);
  EXPECT_THAT(a.ticks, ElementsAre(1, 2, 5, 10, 20, 50, 100));
  a = LogAxis(5, 5);  // one value: one decade around it
  EXPECT_EQ(a.lo, 1);
  EXPECT_EQ(a.hi, 10);
  EXPECT_THAT(a.ticks, ElementsAre(1, 2, 5, 10));
  a = LogAxis(0.001, 0.001);
  EXPECT_DOUBLE_EQ(a.lo, 0.001);
  EXPECT_DOUBLE_EQ(a.hi, 0.01);
  a = LogAxis(0.05, 20000);
  EXPECT_DOUBLE_EQ(a.lo, 0.01);
  EXPECT_DOUBLE_EQ(a.hi, 100000);
  EXPECT_EQ(a.ticks.size(), 8u);
}

TEST(AxisTest, MapToPixels) {
  const Axis lin = LinearAxis(37);  // [0, 40]
  EXPECT_DOUBLE_EQ(lin.Map(10, 0, 400), 100);
  EXPECT_DOUBLE_EQ(lin.Map(40, 300, 100), 100);  // y grows upwards: from bottom to top
  const Axis log = LogAxis(0.37, 12);            // [0.1, 100]: three decades
  EXPECT_NEAR(log.Map(1, 0, 300), 100, 1e-9);
  EXPECT_NEAR(log.Map(100, 0, 300), 300, 1e-9);
  EXPECT_NEAR(log.Map(std::sqrt(10.0), 0, 300), 150, 1e-9);
  EXPECT_EQ(log.Map(0, 7, 300), 7);
}

TEST(AxisTest, TickLabels) {
  EXPECT_EQ(FormatTick(0), "0");
  EXPECT_EQ(FormatTick(0.005), "0.005");
  EXPECT_EQ(FormatTick(0.1), "0.1");
  EXPECT_EQ(FormatTick(0.6000000000000001), "0.6");
  EXPECT_EQ(FormatTick(250), "250");
  EXPECT_EQ(FormatTick(12000), "12000");
  EXPECT_EQ(FormatTick(2.5e6), "2.5e+06");
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LineChartTest, PointsLandWhereTheAxesSay) {
  // The default frame is 960 x 320 with the plot at x 72..936, y 268 (bottom)..44 (top).
  Frame f;
  f.title = "t";
  f.x_title = "x <units>";
  f.y_title = "y";
  Series s;
  s.name = "p99 & more";
  s.color = "#d62728";
  s.x = {10, 20};
  s.y = {100, 0};  // 0 cannot be drawn on a log axis: left out
  s.labels = {"rate=<5>", ""};
  const std::string svg = LineChart(f, LinearAxis(37), LogAxis(10, 1000), {s}, {{0, 20, "step1"}});
  // x: 72 + 10/40 * 864 = 288; y: 268 - log10(100/10)/log10(1000/10) * 224 = 156.
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"288.0\" cy=\"156.0\" r=\"3\"/>"));
  EXPECT_EQ(Count(svg, "<circle"), 1);
  // The band spans x 72..504.
  EXPECT_THAT(svg, HasSubstr("<rect x=\"72.0\" y=\"44.0\" width=\"432.0\" height=\"224.0\""));
  EXPECT_THAT(svg, HasSubstr(">step1</text>"));
  // Tick labels: 0..40 on x, 10, 100, 1000 on y (two decades: with 20, 50, 200, 500).
  EXPECT_THAT(svg, HasSubstr(">40</text>"));
  EXPECT_THAT(svg, HasSubstr(">500</text>"));
  // Every text escaped: legend, point labels, axis titles.
  EXPECT_THAT(svg, HasSubstr(">p99 &amp; more</text>"));
  EXPECT_THAT(svg, HasSubstr(">rate=&lt;5&gt;</text>"));
  EXPECT_THAT(svg, HasSubstr(">x &lt;units&gt;</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("no data")));
  EXPECT_THAT(LineChart(f, LinearAxis(1), LogAxis(1, 10), {}), HasSubstr("no data"));
}

TEST(HistogramChartTest, BarsSpanTheirBins) {
  Frame f;
  f.width = 472;  // plot x 72..448: 376 px for two decades
  f.height = 268;
  const Axis x = LogAxis(1, 100), y = LinearAxis(50);  // y [0, 50]
  const std::string svg = HistogramChart(f, x, y, {1, 10, 100}, {25, 50}, "#1f77b4", {{10, "p50"}});
  // Bar 0: x 72..260 (0.5 px gap), height 25/50 of the 172 px plot.
  EXPECT_THAT(svg, HasSubstr("<rect x=\"72.0\" y=\"130.0\" width=\"187.5\" height=\"86.0\"/>"));
  EXPECT_THAT(svg, HasSubstr("<rect x=\"260.0\" y=\"44.0\" width=\"187.5\" height=\"172.0\"/>"));
  EXPECT_THAT(svg, HasSubstr("<line x1=\"260.0\" y1=\"44.0\" x2=\"260.0\" y2=\"216.0\""));
  EXPECT_THAT(svg, HasSubstr(">p50</text>"));
}

TEST(StackedBarChartTest, SegmentsStackAndNegativesCountAsZero) {
  Frame f;  // plot x 72..936, y 268..44 (224 px)
  const std::string svg = StackedBarChart(f, LinearAxis(4), {"a", "b"}, {"queue", "compute"},
                                          {"#f00", "#00f"}, {{1, 2}, {3, -1}});
  // Category slots of 432 px, bars 60 px wide centred at 288 and 720; y [0, 4]: 56 px per ms.
  EXPECT_THAT(svg, HasSubstr("<rect x=\"258.0\" y=\"212.0\" width=\"60.0\" height=\"56.0\" "
                             "fill=\"#f00\"/>"));
  EXPECT_THAT(svg, HasSubstr("<rect x=\"258.0\" y=\"44.0\" width=\"60.0\" height=\"168.0\" "
                             "fill=\"#00f\"/>"));
  EXPECT_THAT(svg, HasSubstr("<rect x=\"690.0\" y=\"156.0\" width=\"60.0\" height=\"0.0\" "
                             "fill=\"#00f\"/>"));
  EXPECT_THAT(svg, HasSubstr(">queue</text>"));
}

}  // namespace
}  // namespace attnserve::bench
