// attnserve-bench's run document: JSON written and read back, errors for files that are not
// reports, and the HTML page drawn from it (every chart present, every text escaped, nothing
// fetched, the same page whether drawn live or from the saved JSON).
#include <string>
#include <vector>

#include "client/bench/report.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

PhaseReport Phase(const std::string& name, double level, double start_s) {
  PhaseReport p;
  p.name = name;
  p.level_kind = "rate";
  p.level = level;
  p.start_s = start_s;
  p.elapsed_s = 2.5;
  p.send_window_s = 2.4;
  p.sent = 250;
  p.ok = 247;
  p.errors = {{"UNAVAILABLE", 2}, {"DEADLINE_EXCEEDED", 1}};
  p.requests_per_s = 98.8;
  p.sent_per_s = 100;
  p.tokens_per_s = 6323.2;
  p.gflops_per_s = 0.2;
  p.latency_ms = {1.5, 3.25, 9.5, 12.125, 13, 2.0};
  p.server_ms = {1.0, 2.0, 5.0, 6.0, 7.0, 1.25};
  p.queued_ms_mean = 0.25;
  p.compute_ms_mean = 0.75;
  p.batch_size_mean = 1.5;
  p.latency_histogram.first_bin = 1;
  p.latency_histogram.counts = {100, 0, 147, 3};
  p.series.t_s = {start_s, start_s + 1};
  p.series.width_s = {1, 1.5};
  p.series.sent = {100, 150};
  p.series.ok = {99, 148};
  p.series.errors = {1, 2};
  p.series.p99_ms = {9.0, 10.5};
  return p;
}

RunReport Sample() {
  RunReport r;
  r.config = {{"target", "127.0.0.1:1"},
              {"rpc", "attend"},
              {"mode", "open"},
              {"levels", {100, 200}},
              {"shapes", "1,8,128,64"}};
  r.server = {
      {"version", "0.1.0"},
      {"backends", {{{"name", "cpu"}, {"active", true}, {"devices", {{{"name", "avx512"}}}}}}},
      {"batching", {{"enabled", true}, {"max_batch_requests", 32}}}};
  r.machine = {{"cpu_model", "Xeon"}, {"logical_cores", 2}};
  r.phases = {Phase("step1", 100, 0), Phase("step2", 200, 2.6)};
  return r;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ReportJsonTest, RoundTrip) {
  const RunReport r = Sample();
  const std::string json = ToJson(r);
  EXPECT_THAT(json, HasSubstr("\"UNAVAILABLE\":2"));
  const RunReport back = ParseJsonReport(json).value();
  EXPECT_EQ(back.config, r.config);
  EXPECT_EQ(back.server, r.server);
  EXPECT_EQ(back.machine, r.machine);
  ASSERT_EQ(back.phases.size(), 2u);
  const PhaseReport& p = back.phases[1];
  EXPECT_EQ(p.name, "step2");
  EXPECT_EQ(p.level_kind, "rate");
  EXPECT_EQ(p.level, 200);
  EXPECT_EQ(p.start_s, 2.6);
  EXPECT_EQ(p.sent, 250);
  EXPECT_EQ(p.ok, 247);
  EXPECT_EQ(p.errors.at("UNAVAILABLE"), 2);
  EXPECT_EQ(p.errors.at("DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(p.requests_per_s, 98.8);
  EXPECT_EQ(p.latency_ms.p999, 12.125);
  EXPECT_EQ(p.server_ms.mean, 1.25);
  EXPECT_EQ(p.queued_ms_mean, 0.25);
  EXPECT_EQ(p.batch_size_mean, 1.5);
  EXPECT_EQ(p.latency_histogram.bins_per_decade, 10);
  EXPECT_EQ(p.latency_histogram.first_bin, 1);
  EXPECT_THAT(p.latency_histogram.counts, ElementsAre(100, 0, 147, 3));
  EXPECT_THAT(p.series.t_s, ElementsAre(2.6, 3.6));
  EXPECT_THAT(p.series.width_s, ElementsAre(1, 1.5));
  EXPECT_THAT(p.series.sent, ElementsAre(100, 150));
  EXPECT_THAT(p.series.ok, ElementsAre(99, 148));
  EXPECT_THAT(p.series.errors, ElementsAre(1, 2));
  EXPECT_THAT(p.series.p99_ms, ElementsAre(9.0, 10.5));
  // Written again, the document is the same text.
  EXPECT_EQ(ToJson(back), json);
}

TEST(ReportJsonTest, NumbersKeepSixSignificantDigits) {
  RunReport r;
  r.phases = {Phase("step1", 1.0 / 3, 0)};
  r.phases[0].requests_per_s = 123.456789;
  const std::string json = ToJson(r);
  EXPECT_THAT(json, HasSubstr("\"level\":0.333333,"));
  EXPECT_THAT(json, HasSubstr("\"requests_per_s\":123.457,"));
}

TEST(ReportJsonTest, ErrorsForWhatIsNotAReport) {
  EXPECT_EQ(ParseJsonReport("{\"phases\": [").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ParseJsonReport("not json").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseJsonReport("[1]").status().message(), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseJsonReport("{\"config\": {}}").status().message(),
              HasSubstr("no \"phases\" array"));
  EXPECT_THAT(ParseJsonReport("{\"phases\": [{}, 3]}").status().message(),
              HasSubstr("phases[1] is not an object"));
}

TEST(ReportJsonTest, OlderAndOddFilesReadLeniently) {
  // A report from before histograms and series, with a field of the wrong type and series
  // arrays of different lengths: missing or wrong fields read as zero, arrays are cut to the
  // shortest.
  const RunReport r =
      ParseJsonReport(
          "{\"config\": {\"rpc\": \"attend\"}, \"phases\": [{\"name\": \"step1\", \"sent\": "
          "\"many\", \"ok\": 5, \"latency_ms\": {\"p50\": 1.5}, \"series\": {\"t_s\": [0, 1], "
          "\"width_s\": [1, 1], \"sent\": [1], \"ok\": [1, 2], \"errors\": [0, 0], \"p99_ms\": "
          "[1, 1]}}]}")
          .value();
  ASSERT_EQ(r.phases.size(), 1u);
  EXPECT_EQ(r.phases[0].sent, 0);
  EXPECT_EQ(r.phases[0].ok, 5);
  EXPECT_EQ(r.phases[0].latency_ms.p50, 1.5);
  EXPECT_TRUE(r.phases[0].latency_histogram.counts.empty());
  EXPECT_EQ(r.phases[0].series.size(), 1u);
  EXPECT_TRUE(r.server.is_object());
  // Its page still draws, saying where data is missing.
  EXPECT_THAT(ToHtml(r), HasSubstr("no data"));
}

TEST(ReportHtmlTest, EveryChartAndTable) {
  const std::string html = ToHtml(Sample());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // Knee, split, one histogram per phase, rates over time, p99 over time.
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 2 + 2 + 2);
  EXPECT_EQ(Count(html, "</svg>"), 6);
  EXPECT_THAT(html, HasSubstr("aria-label=\"Latency percentiles against achieved throughput\""));
  EXPECT_THAT(html, HasSubstr("aria-label=\"Latency histogram of step2\""));
  // The knee chart: four percentiles for each of the two phases.
  const size_t knee = html.find("<svg");
  const std::string knee_svg = html.substr(knee, html.find("</svg>", knee) - knee);
  EXPECT_EQ(Count(knee_svg, "<circle"), 8);
  EXPECT_THAT(knee_svg, HasSubstr(">200/s</text>"));
  EXPECT_THAT(knee_svg, HasSubstr(">p99.9</text>"));
  // Tables: phases with their errors, settings, GetServerInfo flattened, the machine.
  EXPECT_THAT(html, HasSubstr("DEADLINE_EXCEEDED 1, UNAVAILABLE 2"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">backends[0].devices[0].name</td>"
                              "<td class=\"key\">avx512</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">batching.max_batch_requests</td>"
                              "<td class=\"key\">32</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">levels</td><td class=\"key\">100, 200</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">cpu_model</td><td class=\"key\">Xeon</td>"));
  // Self-contained: nothing to fetch, nothing to run.
  EXPECT_THAT(html, Not(HasSubstr("http")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, HasSubstr("<script type=\"application/json\" id=\"attnserve-bench-data\">"));
}

TEST(ReportHtmlTest, TextFromTheRunIsEscaped) {
  RunReport r = Sample();
  r.config["target"] = "<script>alert('x')</script>&";
  r.phases[0].name = "<b>step</b>";
  r.phases[0].errors = {{"CODE_<99>", 1}};
  const std::string html = ToHtml(r);
  EXPECT_THAT(html, Not(HasSubstr("<script>alert")));
  EXPECT_THAT(html, Not(HasSubstr("<b>")));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;"));
  EXPECT_THAT(html, HasSubstr("&lt;b&gt;step&lt;/b&gt;"));
  EXPECT_THAT(html, HasSubstr("CODE_&lt;99&gt; 1"));
  // Inside the embedded JSON every "<" is \u003c, so no "</script>" can end the element early.
  const size_t data = html.find("id=\"attnserve-bench-data\">");
  ASSERT_NE(data, std::string::npos);
  const std::string tail = html.substr(data);
  EXPECT_EQ(Count(tail, "</script>"), 1);
  EXPECT_THAT(tail, HasSubstr("\\u003cscript>alert('x')\\u003c/script>&"));
  // And that JSON reads back as the run.
  const size_t open = tail.find('>') + 1;
  const std::string json = tail.substr(open, tail.find("</script>") - open);
  EXPECT_EQ(ParseJsonReport(json).value().config["target"], "<script>alert('x')</script>&");
}

TEST(ReportJsonTest, BytesThatAreNotUtf8AreReplaced) {
  RunReport r;
  r.config["target"] = "host\xff:1";
  const std::string json = ToJson(r);
  EXPECT_THAT(json, HasSubstr("\"host\xef\xbf\xbd:1\""));  // U+FFFD
  EXPECT_EQ(ParseJsonReport(json).value().config["target"], "host\xef\xbf\xbd:1");
  EXPECT_THAT(ToHtml(r), HasSubstr("host\xef\xbf\xbd:1"));
}

TEST(ReportHtmlTest, RedrawnFromSavedJsonIsTheSamePage) {
  // attnserve-bench draws the live page from its JSON text; --html_from draws a saved one.
  const RunReport live = ParseJsonReport(ToJson(Sample())).value();
  const RunReport saved = ParseJsonReport(ToJson(live)).value();
  EXPECT_EQ(ToHtml(saved), ToHtml(live));
}

TEST(ReportHtmlTest, NoPhasesStillDrawsEveryChart) {
  RunReport r;
  const std::string html = ToHtml(r);
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 4);
  EXPECT_EQ(Count(html, "no data"), 4);
  EXPECT_THAT(html, HasSubstr("not recorded"));
}

TEST(MachineTest, DescribesThisMachine) {
  const nlohmann::ordered_json m = DescribeMachine();
  ASSERT_TRUE(m.contains("logical_cores"));
  EXPECT_GE(m["logical_cores"].get<int>(), 1);
  EXPECT_TRUE(m.contains("os"));
}

}  // namespace
}  // namespace attnserve::bench
