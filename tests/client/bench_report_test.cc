// attnserve-bench's run document: JSON written and read back, errors for files that are not
// reports, and the HTML page drawn from it (every chart present, every text escaped, nothing
// fetched, the same page whether drawn live or from the saved JSON). Then the page of a
// request-size sweep (--sweep_from): its charts, sentence and table, and the errors that name a
// bad field.
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

TEST(ReportHtmlTest, TheTitleNamesTheKindOfAttention) {
  auto title_of = [](const nlohmann::ordered_json& settings) {
    RunReport r = Sample();
    for (const auto& [key, value] : settings.items()) r.config[key] = value;
    const std::string html = ToHtml(r);
    const size_t at = html.find("<h1>");
    return html.substr(at + 4, html.find("</h1>") - at - 4);
  };
  // A report from before these settings: plain softmax attention.
  EXPECT_EQ(title_of(nlohmann::ordered_json::object()),
            "attnserve-bench: attend (softmax attention), open loop against 127.0.0.1:1");
  EXPECT_EQ(title_of({{"kind", "softmax"},
                      {"feature_map", ""},
                      {"window", "4095,0"},
                      {"softcap", 30},
                      {"alibi", true}}),
            "attnserve-bench: attend (softmax attention, window 4095,0, soft-cap 30, ALiBi), open "
            "loop against 127.0.0.1:1");
  EXPECT_EQ(title_of({{"kind", "softmax"}, {"window", ""}, {"softcap", 0}, {"alibi", false}}),
            "attnserve-bench: attend (softmax attention), open loop against 127.0.0.1:1");
  EXPECT_EQ(title_of({{"kind", "linear"}, {"feature_map", "relu"}}),
            "attnserve-bench: attend (linear attention (relu)), open loop against 127.0.0.1:1");
}

TEST(ReportHtmlTest, NoPhasesStillDrawsEveryChart) {
  RunReport r;
  const std::string html = ToHtml(r);
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 4);
  EXPECT_EQ(Count(html, "no data"), 4);
  EXPECT_THAT(html, HasSubstr("not recorded"));
}

// --- Request-size sweeps ---

using Json = nlohmann::ordered_json;

Json SweepServerJson(int64_t ok, int64_t errors, double req_per_s, double cpu_us, double faults,
                     double p50_ms) {
  return {{"ok", ok},
          {"errors", errors},
          {"req_per_s", req_per_s},
          {"cpu_us_per_call", cpu_us},
          {"faults_per_call", faults},
          {"p50_ms", p50_ms},
          {"p99_ms", 2 * p50_ms}};
}

Json SweepPointJson(const std::string& rpc, const std::string& shape, int64_t request_bytes,
                    int64_t response_bytes, int callers, double backend_cpu_us, Json servers,
                    Json overhead) {
  return {{"rpc", rpc},
          {"shape", shape},
          {"request_bytes", request_bytes},
          {"response_bytes", response_bytes},
          {"callers", callers},
          {"backend_cpu_us", backend_cpu_us},
          {"servers", std::move(servers)},
          {"overhead", std::move(overhead)}};
}

// Three groups, in the file out of the page's order: mha/1; attend/1 at two sizes, larger
// first, the baseline missing at the small one; attend/8 without the echo server (no overhead).
Json SweepDoc() {
  Json doc = {
      {"kind", "attnserve-serving-sweep"},
      {"title", "Serving overhead across request sizes"},
      {"command", "python3 tests/bench/serving_sweep.py --duration_s=4"},
      {"machine", {{"cpu", "Intel(R) Xeon(R) Processor"}, {"cores", 2}}},
      {"settings", {{"duration_s", 4}, {"allocator", "jemalloc"}, {"target_overhead", 1.25}}},
      {"servers", {"attnserve", "echo", "a0c8747"}}};
  doc["points"] = Json::array();
  // 900 / (500 + 200) = 1.29
  doc["points"].push_back(
      SweepPointJson("mha", "1,128", 262144, 262144, 1, 500,
                     {{"attnserve", SweepServerJson(5000, 0, 1000, 900, 0.2, 0.9)},
                      {"echo", SweepServerJson(9000, 0, 4000, 200, 0.1, 0.3)},
                      {"a0c8747", SweepServerJson(5000, 0, 1000, 850, 0.2, 0.9)}},
                     1.29));
  // 1100.2 / (290.1 + 480) = 1.43; the baseline's 1000 / 770.1 = 1.30.
  doc["points"].push_back(
      SweepPointJson("attend", "1,8,128,64", 786432, 262144, 1, 290.1,
                     {{"attnserve", SweepServerJson(4000, 0, 800.5, 1100.2, 0.7, 1.1)},
                      {"echo", SweepServerJson(6000, 0, 1300, 480, 0.5, 0.7)},
                      {"a0c8747", SweepServerJson(3900, 2, 790, 1000, 0.6, 1.2)}},
                     1.43));
  // 150 / (40 + 90) = 1.15
  doc["points"].push_back(
      SweepPointJson("attend", "1,8,16,64", 98304, 32768, 1, 40,
                     {{"attnserve", SweepServerJson(9000, 0, 3000, 150, 0.05, 0.3)},
                      {"echo", SweepServerJson(9500, 0, 6000, 90, 0.04, 0.2)},
                      {"a0c8747", nullptr}},
                     1.15));
  doc["points"].push_back(
      SweepPointJson("attend", "1,8,128,64", 786432, 262144, 8, 290.1,
                     {{"attnserve", SweepServerJson(8000, 0, 1800, 1000, 0.7, 4.0)},
                      {"a0c8747", SweepServerJson(8000, 0, 1700, 990, 0.6, 4.2)}},
                     nullptr));
  return doc;
}

std::string SweepPage(const Json& doc) { return SweepToHtml(ParseSweep(doc.dump()).value()); }

// The n-th <svg> element of the page (0-based).
std::string NthSvg(const std::string& html, int n) {
  size_t at = html.find("<svg");
  for (int i = 0; i < n && at != std::string::npos; ++i) at = html.find("<svg", at + 1);
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</svg>", at) - at);
}

TEST(SweepTest, ReadsEveryField) {
  const Sweep s = ParseSweep(SweepDoc().dump()).value();
  EXPECT_EQ(s.title, "Serving overhead across request sizes");
  EXPECT_EQ(s.target_overhead, 1.25);
  EXPECT_THAT(s.servers, ElementsAre("attnserve", "echo", "a0c8747"));
  ASSERT_EQ(s.points.size(), 4u);
  const SweepPoint& p = s.points[1];
  EXPECT_EQ(p.rpc, "attend");
  EXPECT_EQ(p.shape, "1,8,128,64");
  EXPECT_EQ(p.request_bytes, 786432);
  EXPECT_EQ(p.response_bytes, 262144);
  EXPECT_EQ(p.callers, 1);
  EXPECT_EQ(p.backend_cpu_us, 290.1);
  EXPECT_EQ(p.overhead, 1.43);
  ASSERT_EQ(p.servers.size(), 3u);
  const SweepServer& b = p.servers.at("a0c8747");
  EXPECT_EQ(b.ok, 3900);
  EXPECT_EQ(b.errors, 2);
  EXPECT_EQ(b.req_per_s, 790);
  EXPECT_EQ(b.cpu_us_per_call, 1000);
  EXPECT_EQ(b.faults_per_call, 0.6);
  EXPECT_EQ(b.p50_ms, 1.2);
  EXPECT_EQ(b.p99_ms, 2.4);
  // A null entry is a server not measured there; a missing overhead is none.
  EXPECT_EQ(s.points[2].servers.count("a0c8747"), 0u);
  EXPECT_EQ(s.points[3].servers.count("echo"), 0u);
  EXPECT_FALSE(s.points[3].overhead.has_value());
  EXPECT_FALSE(p.overhead_range.has_value());  // one round: no range
  // A measured value may be null (no call succeeded).
  Json doc = SweepDoc();
  doc["points"][0]["servers"]["echo"]["p50_ms"] = nullptr;
  EXPECT_FALSE(ParseSweep(doc.dump()).value().points[0].servers.at("echo").p50_ms.has_value());
}

TEST(SweepHtmlTest, ChartsSentenceAndTable) {
  const std::string html = SweepPage(SweepDoc());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(html, HasSubstr("<h1>Serving overhead across request sizes</h1>"));
  // CPU, overhead and faults charts for each of the three groups, in attend/1, attend/8, mha/1
  // order whatever the file's.
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 9);
  EXPECT_EQ(Count(html, "</svg>"), 9);
  const size_t a1 = html.find("<h2>attend, 1 caller</h2>");
  const size_t a8 = html.find("<h2>attend, 8 callers</h2>");
  const size_t m1 = html.find("<h2>mha, 1 caller</h2>");
  ASSERT_NE(a1, std::string::npos);
  ASSERT_NE(a8, std::string::npos);
  ASSERT_NE(m1, std::string::npos);
  EXPECT_LT(a1, a8);
  EXPECT_LT(a8, m1);
  EXPECT_THAT(html, HasSubstr("aria-label=\"CPU per call against request size: attend, 1 "
                              "caller\""));
  // The worst point over every group, and how many are over the target (3 have a ratio).
  EXPECT_THAT(html, HasSubstr("<p class=\"worst\">Worst overhead 1.43 at attend [1,8,128,64] "
                              "(768 KiB), 1 caller; 2 of 3 points above the target 1.25.</p>"));
  // attend/1, CPU: attnserve, echo, backend and backend + echo at both sizes, the baseline at
  // one.
  const std::string cpu = NthSvg(html, 0);
  EXPECT_EQ(Count(cpu, "<circle"), 2 + 2 + 1 + 2 + 2);
  EXPECT_EQ(Count(cpu, "stroke-dasharray"), 1);  // backend + echo
  EXPECT_THAT(cpu, HasSubstr(">backend + echo</text>"));
  EXPECT_THAT(cpu, HasSubstr(">a0c8747</text>"));
  // attend/1, overhead: the sweep's ratios labelled, the baseline's worked out, the target line.
  const std::string overhead = NthSvg(html, 1);
  EXPECT_EQ(Count(overhead, "<circle"), 2 + 1 + 2);
  EXPECT_THAT(overhead, HasSubstr(">1.15</text>"));
  EXPECT_THAT(overhead, HasSubstr(">1.43</text>"));
  EXPECT_THAT(overhead, HasSubstr(">a0c8747 / (backend + echo)</text>"));
  EXPECT_THAT(overhead, HasSubstr(">target 1.25</text>"));
  EXPECT_EQ(Count(overhead, "stroke-dasharray"), 1);
  // Faults between 0.04 and 0.7: a linear axis from 0.
  EXPECT_THAT(html, HasSubstr("for the call); linear scale.</figcaption>"));
  // The table: every server's figures, the errors and the ratios over the target marked.
  EXPECT_THAT(html,
              HasSubstr("<tr><td class=\"key\">1,8,128,64</td><td>768 KiB</td><td>256 KiB</td>"
                        "<td>800.5</td><td>1100.2</td><td>0.70</td><td>1.100</td><td>0</td>"
                        "<td>1300.0</td><td>480.0</td><td>0.50</td><td>0.700</td><td>0</td>"
                        "<td>790.0</td><td>1000.0</td><td>0.60</td><td>1.200</td>"
                        "<td class=\"over\">2</td><td>290.1</td><td class=\"over\">1.43</td>"
                        "<td class=\"over\">1.30</td></tr>"));
  EXPECT_THAT(html,
              HasSubstr("<tr><td class=\"key\">1,8,16,64</td><td>96 KiB</td><td>32 KiB</td>"
                        "<td>3000.0</td><td>150.0</td><td>0.05</td><td>0.300</td><td>0</td>"));
  EXPECT_THAT(html, HasSubstr("<td colspan=\"5\" class=\"missing\">not measured</td>"
                              "<td>40.0</td><td>1.15</td><td>n/a</td></tr>"));
  // The machine, the command, the settings.
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">cpu</td><td class=\"key\">Intel(R) Xeon(R) "
                              "Processor</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">target_overhead</td><td class=\"key\">1.25</td>"));
  EXPECT_THAT(html, HasSubstr("<pre class=\"command\">python3 tests/bench/serving_sweep.py "
                              "--duration_s=4</pre>"));
  // Self-contained: nothing to fetch, nothing to run.
  EXPECT_THAT(html, Not(HasSubstr("http")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, HasSubstr("<script type=\"application/json\" id=\"attnserve-sweep-data\">"));
}

// serving_sweep.py --rounds=N: the overhead is the rounds' median, overhead_range their lowest
// and highest, and each server's entry keeps its rounds (a field the page does not read).
TEST(SweepTest, RoundsGiveTheOverheadsRange) {
  Json doc = SweepDoc();
  doc["settings"]["rounds"] = 3;
  doc["points"][1]["overhead_range"] = {1.38, 1.52};
  doc["points"][1]["servers"]["attnserve"]["rounds"] = {
      SweepServerJson(3900, 0, 790, 1080, 0.7, 1.1),
      SweepServerJson(4000, 0, 800.5, 1100.2, 0.7, 1.1),
      SweepServerJson(4100, 0, 810, 1150, 0.7, 1.1)};
  const Sweep s = ParseSweep(doc.dump()).value();
  ASSERT_TRUE(s.points[1].overhead_range.has_value());
  EXPECT_EQ(s.points[1].overhead_range->first, 1.38);
  EXPECT_EQ(s.points[1].overhead_range->second, 1.52);
  EXPECT_FALSE(s.points[0].overhead_range.has_value());
  // In the table, after the median; the other points' cells as without rounds.
  const std::string html = SweepToHtml(s);
  EXPECT_THAT(html, HasSubstr("<td>290.1</td><td class=\"over\">1.43 (1.38-1.52)</td>"
                              "<td class=\"over\">1.30</td></tr>"));
  EXPECT_THAT(html, HasSubstr("<td>40.0</td><td>1.15</td><td>n/a</td></tr>"));
  doc["points"][2]["overhead_range"] = {1.1, 1.2};
  EXPECT_THAT(SweepToHtml(ParseSweep(doc.dump()).value()),
              HasSubstr("<td>40.0</td><td>1.15 (1.10-1.20)</td><td>n/a</td></tr>"));
}

TEST(SweepHtmlTest, SaysWhatIsMissing) {
  const std::string html = SweepPage(SweepDoc());
  EXPECT_THAT(html, HasSubstr("Not measured: a0c8747 at [1,8,16,64] (96 KiB).</p>"));
  EXPECT_THAT(html, HasSubstr("Not measured: echo at any size.</p>"));
  // attend/8 has no echo server: no backend + echo line, no overhead, the baseline's ratio
  // neither.
  const std::string cpu = NthSvg(html, 3);
  EXPECT_EQ(Count(cpu, "<circle"), 3);
  EXPECT_THAT(cpu, Not(HasSubstr("backend + echo")));
  const std::string overhead = NthSvg(html, 4);
  EXPECT_EQ(Count(overhead, "<circle"), 2);  // the target line's ends only
  EXPECT_THAT(html, HasSubstr("<td>290.1</td><td>n/a</td><td>n/a</td></tr>"));
  // No point with a ratio at all.
  Json doc = SweepDoc();
  for (Json& p : doc["points"]) p["overhead"] = nullptr;
  EXPECT_THAT(SweepPage(doc), HasSubstr("<p class=\"worst\">No overhead ratio: attnserve and the "
                                        "echo server were not both measured at any point"));
}

TEST(SweepHtmlTest, FaultsOverDecadesOnALogAxisWithoutZeros) {
  Json doc = SweepDoc();
  doc["points"][1]["servers"]["attnserve"]["faults_per_call"] = 300;
  doc["points"][2]["servers"]["attnserve"]["faults_per_call"] = 0;
  const std::string html = SweepPage(doc);
  const std::string faults = NthSvg(html, 2);
  // attnserve's 0 left out: its 300, echo's 0.04 and 0.5, the baseline's 0.6.
  EXPECT_EQ(Count(faults, "<circle"), 4);
  EXPECT_THAT(faults, HasSubstr(">faults per call (log scale)</text>"));
  EXPECT_THAT(html, HasSubstr("for the call); log scale: points at 0 are not drawn."));
}

TEST(SweepHtmlTest, TextFromTheFileIsEscaped) {
  Json doc = SweepDoc();
  doc["title"] = "<script>alert('x')</script>&";
  doc["servers"][2] = "<i>base</i>";
  for (Json& p : doc["points"]) {
    if (p["servers"].contains("a0c8747")) {
      p["servers"]["<i>base</i>"] = p["servers"]["a0c8747"];
      p["servers"].erase("a0c8747");
    }
  }
  doc["points"][0]["shape"] = "<b>1</b>";
  const std::string html = SweepPage(doc);
  EXPECT_THAT(html, Not(HasSubstr("<script>alert")));
  EXPECT_THAT(html, Not(HasSubstr("<i>")));
  EXPECT_THAT(html, Not(HasSubstr("<b>")));
  EXPECT_THAT(html,
              HasSubstr("<title>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;</title>"));
  EXPECT_THAT(html, HasSubstr("<h1>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;</h1>"));
  EXPECT_THAT(html, HasSubstr("<th colspan=\"5\">&lt;i&gt;base&lt;/i&gt;</th>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"key\">&lt;b&gt;1&lt;/b&gt;</td>"));
  // The embedded document: every "<" as \u003c, one "</script>", and it reads back.
  const size_t data = html.find("id=\"attnserve-sweep-data\">");
  ASSERT_NE(data, std::string::npos);
  const std::string tail = html.substr(data);
  EXPECT_EQ(Count(tail, "</script>"), 1);
  EXPECT_THAT(tail, HasSubstr("\\u003cscript>alert('x')\\u003c/script>&"));
  const size_t open = tail.find('>') + 1;
  const Sweep back = ParseSweep(tail.substr(open, tail.find("</script>") - open)).value();
  EXPECT_EQ(back.title, "<script>alert('x')</script>&");
  EXPECT_EQ(back.points.size(), 4u);
  EXPECT_EQ(back.document, ParseSweep(doc.dump()).value().document);
}

TEST(SweepTest, BadFilesNameTheField) {
  auto error = [](const Json& doc) {
    const absl::StatusOr<Sweep> s = ParseSweep(doc.dump());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  Json doc = SweepDoc();
  doc["points"][1]["servers"]["echo"].erase("cpu_us_per_call");
  EXPECT_EQ(error(doc), "points[1].servers.echo.cpu_us_per_call: missing");
  doc = SweepDoc();
  doc["kind"] = "attnserve-bench-run";
  EXPECT_EQ(error(doc), "kind: expected \"attnserve-serving-sweep\", got \"attnserve-bench-run\"");
  doc = SweepDoc();
  doc.erase("kind");
  EXPECT_EQ(error(doc), "kind: missing");
  doc = SweepDoc();
  doc["points"] = Json::array();
  EXPECT_EQ(error(doc), "points: empty: nothing was measured");
  doc = SweepDoc();
  doc.erase("points");
  EXPECT_EQ(error(doc), "points: missing");
  doc = SweepDoc();
  doc["points"][2]["callers"] = 0;
  EXPECT_EQ(error(doc), "points[2].callers: must be at least 1; got 0");
  doc = SweepDoc();
  doc["points"][0]["request_bytes"] = "256 KiB";
  EXPECT_EQ(error(doc), "points[0].request_bytes: expected an integer, got a string");
  doc = SweepDoc();
  doc["points"][0]["request_bytes"] = 1.5;
  EXPECT_EQ(error(doc), "points[0].request_bytes: expected an integer, got 1.5");
  doc = SweepDoc();
  doc["points"][3]["backend_cpu_us"] = -1;
  EXPECT_EQ(error(doc), "points[3].backend_cpu_us: must be at least 0; got -1");
  doc = SweepDoc();
  doc["points"][1]["servers"]["mystery"] = doc["points"][1]["servers"]["echo"];
  EXPECT_EQ(error(doc), "points[1].servers.mystery: not one of the top-level \"servers\"");
  doc = SweepDoc();
  doc["points"][1]["servers"]["echo"] = 3;
  EXPECT_EQ(error(doc), "points[1].servers.echo: expected an object (or null), got a number");
  doc = SweepDoc();
  doc["points"][1]["overhead"] = "high";
  EXPECT_EQ(error(doc), "points[1].overhead: expected a number, got a string");
  doc = SweepDoc();
  doc["points"][1]["overhead_range"] = "wide";
  EXPECT_EQ(error(doc), "points[1].overhead_range: expected [lowest, highest], got a string");
  doc["points"][1]["overhead_range"] = {1.4};
  EXPECT_EQ(error(doc), "points[1].overhead_range: expected [lowest, highest], got [1.4]");
  doc["points"][1]["overhead_range"] = {"low", 1.5};
  EXPECT_EQ(error(doc), "points[1].overhead_range[0]: expected a number, got a string");
  doc["points"][1]["overhead_range"] = {1.5, 1.4};
  EXPECT_EQ(error(doc),
            "points[1].overhead_range: must hold the overhead (1.43) between its lowest and "
            "highest; got [1.5,1.4]");
  doc["points"][1]["overhead_range"] = {1.44, 1.5};  // the median outside its rounds
  EXPECT_EQ(error(doc),
            "points[1].overhead_range: must hold the overhead (1.43) between its lowest and "
            "highest; got [1.44,1.5]");
  doc = SweepDoc();
  doc["points"][3]["overhead_range"] = {1.0, 1.1};  // a range without an overhead
  EXPECT_EQ(error(doc),
            "points[3].overhead_range: must hold the overhead (none) between its lowest and "
            "highest; got [1.0,1.1]");
  doc = SweepDoc();
  doc["points"][1] = 7;
  EXPECT_EQ(error(doc), "points[1]: expected an object, got a number");
  doc = SweepDoc();
  doc["settings"].erase("target_overhead");
  EXPECT_EQ(error(doc), "settings.target_overhead: missing");
  doc = SweepDoc();
  doc["servers"] = Json::array();
  EXPECT_EQ(error(doc), "servers: empty (the first entry is the server under test)");
  doc = SweepDoc();
  doc["servers"][2] = "echo";
  EXPECT_EQ(error(doc), "servers[2]: \"echo\" listed twice");
  doc = SweepDoc();
  doc["points"][0]["servers"]["echo"]["p99_ms"] = 1e-300;
  EXPECT_EQ(error(doc), "points[0].servers.echo.p99_ms: out of range (0 or 1e-9 to 1e12): 1e-300");
  doc = SweepDoc();
  doc["title"] = 5;
  EXPECT_EQ(error(doc), "title: expected a string, got a number");
  // Not a sweep at all.
  EXPECT_THAT(ParseSweep("{\"kind\": ").status().message(), HasSubstr("not valid JSON (at byte"));
  EXPECT_EQ(ParseSweep("[1]").status().message(), "the sweep is not a JSON object (got an array)");
  EXPECT_THAT(ParseSweep(ToJson(Sample())).status().message(),
              "kind: missing (a run of attnserve-bench? redraw that with --html_from)");
}

TEST(MachineTest, DescribesThisMachine) {
  const nlohmann::ordered_json m = DescribeMachine();
  ASSERT_TRUE(m.contains("logical_cores"));
  EXPECT_GE(m["logical_cores"].get<int>(), 1);
  EXPECT_TRUE(m.contains("os"));
}

}  // namespace
}  // namespace attnserve::bench
