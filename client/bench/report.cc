#include "client/bench/report.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/bench/chart.h"

namespace attnserve::bench {

using Json = nlohmann::ordered_json;

namespace {

// 6 significant digits, as the CSV and the text table print them.
double R(double v) {
  if (!std::isfinite(v)) return 0;
  return std::strtod(absl::StrFormat("%.6g", v).c_str(), nullptr);
}

Json DistributionJson(const Distribution& d) {
  return Json{{"p50", R(d.p50)},   {"p90", R(d.p90)}, {"p99", R(d.p99)},
              {"p999", R(d.p999)}, {"max", R(d.max)}, {"mean", R(d.mean)}};
}

Json Rounded(const std::vector<double>& v) {
  Json a = Json::array();
  for (double x : v) a.push_back(R(x));
  return a;
}

Json PhaseJson(const PhaseReport& p) {
  Json errors = Json::object();
  for (const auto& [code, n] : p.errors) errors[code] = n;
  Json j = {{"name", p.name},
            {"level_kind", p.level_kind},
            {"level", R(p.level)},
            {"start_s", R(p.start_s)},
            {"elapsed_s", R(p.elapsed_s)},
            {"send_window_s", R(p.send_window_s)},
            {"sent", p.sent},
            {"ok", p.ok},
            {"errors", errors},
            {"requests_per_s", R(p.requests_per_s)},
            {"sent_per_s", R(p.sent_per_s)},
            {"tokens_per_s", R(p.tokens_per_s)},
            {"gflops_per_s", R(p.gflops_per_s)},
            {"latency_ms", DistributionJson(p.latency_ms)},
            {"server_ms", DistributionJson(p.server_ms)},
            {"queued_ms_mean", R(p.queued_ms_mean)},
            {"compute_ms_mean", R(p.compute_ms_mean)},
            {"batch_size_mean", R(p.batch_size_mean)}};
  j["latency_histogram"] = {{"bins_per_decade", p.latency_histogram.bins_per_decade},
                            {"first_bin", p.latency_histogram.first_bin},
                            {"counts", p.latency_histogram.counts}};
  const TimeSeries& s = p.series;
  j["series"] = {{"t_s", Rounded(s.t_s)}, {"width_s", Rounded(s.width_s)},
                 {"sent", s.sent},        {"ok", s.ok},
                 {"errors", s.errors},    {"p99_ms", Rounded(s.p99_ms)}};
  return j;
}

// Compact JSON. Bytes that are not UTF-8 (a flag can hold anything) become U+FFFD instead of
// making dump() throw.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Readers that never throw: a missing field or one of another type reads as zero or empty.
double Num(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

int64_t Int(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->is_number_integer() ? it->get<int64_t>() : std::llround(it->get<double>());
}

std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

const Json& Obj(const Json& j, const char* key) {
  static const Json* const kEmpty = new Json(Json::object());
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : *kEmpty;
}

template <typename T>
std::vector<T> Array(const Json& j, const char* key) {
  std::vector<T> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const Json& v : *it) {
    if (!v.is_number()) return {};
    out.push_back(static_cast<T>(v.get<double>()));
  }
  return out;
}

Distribution DistributionFrom(const Json& j) {
  Distribution d;
  d.p50 = Num(j, "p50");
  d.p90 = Num(j, "p90");
  d.p99 = Num(j, "p99");
  d.p999 = Num(j, "p999");
  d.max = Num(j, "max");
  d.mean = Num(j, "mean");
  return d;
}

PhaseReport PhaseFrom(const Json& j) {
  PhaseReport p;
  p.name = Str(j, "name");
  p.level_kind = Str(j, "level_kind");
  p.level = Num(j, "level");
  p.start_s = Num(j, "start_s");
  p.elapsed_s = Num(j, "elapsed_s");
  p.send_window_s = Num(j, "send_window_s");
  p.sent = Int(j, "sent");
  p.ok = Int(j, "ok");
  for (const auto& [code, n] : Obj(j, "errors").items()) {
    if (n.is_number()) p.errors[code] = n.get<int64_t>();
  }
  p.requests_per_s = Num(j, "requests_per_s");
  p.sent_per_s = Num(j, "sent_per_s");
  p.tokens_per_s = Num(j, "tokens_per_s");
  p.gflops_per_s = Num(j, "gflops_per_s");
  p.latency_ms = DistributionFrom(Obj(j, "latency_ms"));
  p.server_ms = DistributionFrom(Obj(j, "server_ms"));
  p.queued_ms_mean = Num(j, "queued_ms_mean");
  p.compute_ms_mean = Num(j, "compute_ms_mean");
  p.batch_size_mean = Num(j, "batch_size_mean");
  const Json& h = Obj(j, "latency_histogram");
  p.latency_histogram.bins_per_decade = static_cast<int>(Int(h, "bins_per_decade"));
  if (p.latency_histogram.bins_per_decade <= 0) p.latency_histogram.bins_per_decade = 10;
  p.latency_histogram.first_bin = static_cast<int>(Int(h, "first_bin"));
  p.latency_histogram.counts = Array<int64_t>(h, "counts");
  const Json& s = Obj(j, "series");
  TimeSeries& t = p.series;
  t.t_s = Array<double>(s, "t_s");
  t.width_s = Array<double>(s, "width_s");
  t.sent = Array<int64_t>(s, "sent");
  t.ok = Array<int64_t>(s, "ok");
  t.errors = Array<int64_t>(s, "errors");
  t.p99_ms = Array<double>(s, "p99_ms");
  // Parallel arrays of different lengths would misalign: keep only what all of them cover.
  const size_t n = std::min({t.t_s.size(), t.width_s.size(), t.sent.size(), t.ok.size(),
                             t.errors.size(), t.p99_ms.size()});
  t.t_s.resize(n);
  t.width_s.resize(n);
  t.sent.resize(n);
  t.ok.resize(n);
  t.errors.resize(n);
  t.p99_ms.resize(n);
  return p;
}

}  // namespace

std::string ToJson(const RunReport& report) {
  std::vector<std::string> phases;
  for (const PhaseReport& p : report.phases) phases.push_back(Dump(PhaseJson(p)));
  return absl::StrCat("{\"config\": ", Dump(report.config), ",\n \"server\": ", Dump(report.server),
                      ",\n \"machine\": ", Dump(report.machine), ",\n \"phases\": [\n  ",
                      absl::StrJoin(phases, ",\n  "), "\n]}\n");
}

absl::StatusOr<RunReport> ParseJsonReport(absl::string_view text) {
  const Json j = Json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                             /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the report is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the report is not a JSON object");
  auto phases = j.find("phases");
  if (phases == j.end() || !phases->is_array()) {
    return absl::InvalidArgumentError("the report has no \"phases\" array");
  }
  RunReport r;
  r.config = Obj(j, "config");
  r.server = Obj(j, "server");
  r.machine = Obj(j, "machine");
  for (size_t i = 0; i < phases->size(); ++i) {
    if (!(*phases)[i].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("phases[", i, "] is not an object"));
    }
    r.phases.push_back(PhaseFrom((*phases)[i]));
  }
  return r;
}

std::string UtcTimestamp() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

Json DescribeMachine() {
  Json m = Json::object();
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        m["cpu_model"] = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
      break;
    }
  }
  m["logical_cores"] = std::thread::hardware_concurrency();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib;
    if (f.size() >= 2 && f[0] == "MemTotal:" && absl::SimpleAtoi(f[1], &kib)) {
      m["memory_bytes"] = kib * 1024;
      break;
    }
  }
  struct utsname u;
  if (uname(&u) == 0) m["os"] = absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
  return m;
}

// --- HTML ---

namespace {

constexpr const char* kStyle = R"css(
body { font-family: sans-serif; margin: 24px auto; max-width: 1000px; padding: 0 16px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; }
p.note { color: #555; font-size: 13px; max-width: 760px; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
.wide { overflow-x: auto; }
th { background: #f2f2f2; } td.key, th.key { text-align: left; }
figure { margin: 8px 0 16px; } figcaption { font-size: 13px; color: #444; }
svg.chart { max-width: 100%; height: auto; }
.small { display: flex; flex-wrap: wrap; gap: 4px 16px; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
)css";

const char* const kPercentileColors[] = {"#1f77b4", "#2ca02c", "#ff7f0e", "#d62728"};

std::string LevelText(const PhaseReport& p) {
  if (p.level_kind == "rate") return absl::StrFormat("%g/s", p.level);
  return absl::StrFormat("%g caller%s", p.level, p.level == 1 ? "" : "s");
}

std::string Cell(double v, int decimals = 3) {
  return absl::StrFormat("<td>%.*f</td>", decimals, v);
}

std::string ErrorsText(const PhaseReport& p) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : p.errors) parts.push_back(absl::StrCat(code, " ", n));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

std::string PhaseTable(const std::vector<PhaseReport>& phases) {
  std::string s =
      "<table><tr><th class=\"key\">phase</th><th>level</th><th>sent</th><th>OK</th>"
      "<th class=\"key\">errors</th><th>OK/s</th><th>sent/s</th><th>p50 ms</th><th>p90 ms</th>"
      "<th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>queue ms</th><th>compute ms</th>"
      "<th>batch</th></tr>\n";
  for (const PhaseReport& p : phases) {
    absl::StrAppend(&s, "<tr><td class=\"key\">", HtmlEscape(p.name), "</td><td>",
                    HtmlEscape(LevelText(p)), "</td><td>", p.sent, "</td><td>", p.ok,
                    "</td><td class=\"key\">", HtmlEscape(ErrorsText(p)), "</td>",
                    Cell(p.requests_per_s, 1), Cell(p.sent_per_s, 1), Cell(p.latency_ms.p50),
                    Cell(p.latency_ms.p90), Cell(p.latency_ms.p99), Cell(p.latency_ms.p999),
                    Cell(p.latency_ms.max), Cell(p.queued_ms_mean), Cell(p.compute_ms_mean),
                    Cell(p.batch_size_mean, 2), "</tr>\n");
  }
  return s + "</table>\n";
}

// Nested JSON flattened to "a.b[0].c" rows.
void Flatten(const Json& j, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>* rows) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) Flatten(v, prefix.empty() ? k : prefix + "." + k, rows);
  } else if (j.is_array()) {
    bool scalars = true;
    for (const Json& v : j) scalars = scalars && !v.is_structured();
    if (scalars) {
      std::vector<std::string> parts;
      for (const Json& v : j) parts.push_back(v.is_string() ? v.get<std::string>() : Dump(v));
      rows->emplace_back(prefix, absl::StrJoin(parts, ", "));
      return;
    }
    for (size_t i = 0; i < j.size(); ++i) Flatten(j[i], absl::StrCat(prefix, "[", i, "]"), rows);
  } else {
    rows->emplace_back(prefix, j.is_string() ? j.get<std::string>() : Dump(j));
  }
}

std::string KeyValueTable(const std::string& heading, const Json& j) {
  std::vector<std::pair<std::string, std::string>> rows;
  Flatten(j, "", &rows);
  std::string s = absl::StrCat("<div><h3>", HtmlEscape(heading), "</h3><table>\n");
  if (rows.empty()) absl::StrAppend(&s, "<tr><td class=\"key\">not recorded</td></tr>\n");
  for (const auto& [k, v] : rows) {
    absl::StrAppend(&s, "<tr><td class=\"key\">", HtmlEscape(k), "</td><td class=\"key\">",
                    HtmlEscape(v), "</td></tr>\n");
  }
  return s + "</table></div>\n";
}

std::string Figure(const std::string& svg, const std::string& caption) {
  return absl::StrCat("<figure>\n", svg, "<figcaption>", HtmlEscape(caption),
                      "</figcaption></figure>\n");
}

// Latency percentiles against achieved throughput, one point per phase.
std::string KneeChart(const std::vector<PhaseReport>& phases) {
  static const char* const kNames[] = {"p50", "p90", "p99", "p99.9"};
  std::vector<Series> series(4);
  double lo = 0, hi = 0, max_x = 0;
  for (int k = 0; k < 4; ++k) {
    series[k].name = kNames[k];
    series[k].color = kPercentileColors[k];
  }
  for (const PhaseReport& p : phases) {
    const double v[] = {p.latency_ms.p50, p.latency_ms.p90, p.latency_ms.p99, p.latency_ms.p999};
    for (int k = 0; k < 4; ++k) {
      series[k].x.push_back(p.requests_per_s);
      series[k].y.push_back(v[k]);
      series[k].labels.push_back(k == 3 ? LevelText(p) : "");
      if (v[k] > 0) {
        lo = lo == 0 ? v[k] : std::min(lo, v[k]);
        hi = std::max(hi, v[k]);
      }
    }
    max_x = std::max(max_x, p.requests_per_s);
  }
  Frame f;
  f.height = 360;
  f.title = "Latency percentiles against achieved throughput";
  f.x_title = "achieved throughput (OK responses per second)";
  f.y_title = "latency (ms, log scale)";
  return LineChart(f, LinearAxis(max_x * 1.05), lo > 0 ? LogAxis(lo, hi) : LogAxis(1, 10), series);
}

// Mean latency split into queue, compute, the rest of the server's time and the rest, as shares
// of the mean (an overloaded phase would flatten every other bar on a common ms scale), with
// the mean in ms under each bar.
std::string SplitChart(const std::vector<PhaseReport>& phases) {
  std::vector<std::string> categories, totals;
  std::vector<std::vector<double>> values(4);
  for (const PhaseReport& p : phases) {
    categories.push_back(absl::StrCat(p.name, " (", LevelText(p), ")"));
    const double queue = p.queued_ms_mean, compute = p.compute_ms_mean;
    const double server_rest = std::max(0.0, p.server_ms.mean - queue - compute);
    const double client_rest = std::max(0.0, p.latency_ms.mean - p.server_ms.mean);
    const double total = queue + compute + server_rest + client_rest;
    const double scale = total > 0 ? 100 / total : 0;
    values[0].push_back(queue * scale);
    values[1].push_back(compute * scale);
    values[2].push_back(server_rest * scale);
    values[3].push_back(client_rest * scale);
    totals.push_back(total >= 100 ? absl::StrFormat("mean %.0f ms", total)
                                  : absl::StrFormat("mean %.3g ms", total));
  }
  Frame f;
  f.title = "Mean latency split per phase";
  f.x_title = "";
  f.y_title = "share of the mean latency (%)";
  return StackedBarChart(f, LinearAxis(100), categories,
                         {"server queue", "compute", "rest of server", "network + client"},
                         {"#ff7f0e", "#1f77b4", "#9467bd", "#bbbbbb"}, values, totals);
}

// One histogram per phase, all over the same log axis.
std::string Histograms(const std::vector<PhaseReport>& phases) {
  double lo = 0, hi = 0;
  for (const PhaseReport& p : phases) {
    const LogHistogram& h = p.latency_histogram;
    if (h.counts.empty()) continue;
    const double a = h.LowerMs(0), b = h.UpperMs(static_cast<int>(h.counts.size()) - 1);
    lo = lo == 0 ? a : std::min(lo, a);
    hi = std::max(hi, b);
  }
  const Axis x = lo > 0 ? LogAxis(lo, hi) : LogAxis(1, 10);
  std::string s = "<div class=\"small\">\n";
  for (const PhaseReport& p : phases) {
    const LogHistogram& h = p.latency_histogram;
    const double total = static_cast<double>(std::max<int64_t>(1, h.Total()));
    std::vector<double> edges, heights;
    double max_share = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
      edges.push_back(h.LowerMs(static_cast<int>(i)));
      heights.push_back(100.0 * h.counts[i] / total);
      max_share = std::max(max_share, heights.back());
    }
    if (!h.counts.empty()) edges.push_back(h.UpperMs(static_cast<int>(h.counts.size()) - 1));
    Frame f;
    f.width = 470;
    f.height = 250;
    f.title = absl::StrCat("Latency histogram of ", p.name);
    f.x_title = "latency (ms, log scale)";
    f.y_title = "share of requests (%)";
    std::vector<Marker> markers;
    if (!h.counts.empty()) {
      markers = {{p.latency_ms.p50, "p50"}, {p.latency_ms.p99, "p99"}};
    }
    absl::StrAppend(
        &s, Figure(HistogramChart(f, x, LinearAxis(max_share), edges, heights, "#1f77b4", markers),
                   absl::StrFormat("%s (%s): %d requests, %d bins per decade", p.name, LevelText(p),
                                   h.Total(), h.bins_per_decade)));
  }
  return s + "</div>\n";
}

Series Line(const std::string& name, const std::string& color) {
  Series s;
  s.name = name;
  s.color = color;
  return s;
}

// Rates and p99 second by second, with the phases shaded.
std::string TimeCharts(const std::vector<PhaseReport>& phases) {
  Series sent = Line("sent/s", "#7f7f7f"), ok = Line("OK/s", "#2ca02c");
  Series errors = Line("errors/s", "#d62728"), p99 = Line("p99", kPercentileColors[2]);
  sent.dashed = true;
  std::vector<Band> bands;
  double max_t = 0, max_rate = 0, lo = 0, hi = 0;
  for (const PhaseReport& p : phases) {
    bands.push_back({p.start_s, p.start_s + p.elapsed_s, p.name});
    max_t = std::max(max_t, p.start_s + p.elapsed_s);
    const TimeSeries& t = p.series;
    for (size_t i = 0; i < t.size(); ++i) {
      const double mid = t.t_s[i] + t.width_s[i] / 2, w = std::max(t.width_s[i], 1e-9);
      sent.x.push_back(mid);
      sent.y.push_back(t.sent[i] / w);
      ok.x.push_back(mid);
      ok.y.push_back(t.ok[i] / w);
      errors.x.push_back(mid);
      errors.y.push_back(t.errors[i] / w);
      max_rate = std::max({max_rate, sent.y.back(), ok.y.back(), errors.y.back()});
      max_t = std::max(max_t, t.t_s[i] + t.width_s[i]);
      if (t.p99_ms[i] > 0) {
        p99.x.push_back(mid);
        p99.y.push_back(t.p99_ms[i]);
        lo = lo == 0 ? t.p99_ms[i] : std::min(lo, t.p99_ms[i]);
        hi = std::max(hi, t.p99_ms[i]);
      }
    }
  }
  const Axis x = LinearAxis(max_t);
  Frame f;
  f.height = 300;
  f.title = "Requests per second over time";
  f.x_title = "time since the first phase began (s)";
  f.y_title = "requests per second";
  std::string s = Figure(LineChart(f, x, LinearAxis(max_rate * 1.05), {sent, ok, errors}, bands),
                         "Sent (by intended send time), OK and failed (by completion time) "
                         "requests in each second; the last bucket of a phase may be longer.");
  f.title = "p99 latency over time";
  f.y_title = "p99 latency (ms, log scale)";
  absl::StrAppend(&s,
                  Figure(LineChart(f, x, lo > 0 ? LogAxis(lo, hi) : LogAxis(1, 10), {p99}, bands),
                         "p99 latency of the requests completed in each second."));
  return s;
}

std::string ConfigText(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "?";
  return it->is_string() ? it->get<std::string>() : Dump(*it);
}

}  // namespace

std::string ToHtml(const RunReport& report) {
  const Json& c = report.config;
  const std::string title =
      absl::StrCat("attnserve-bench: ", ConfigText(c, "rpc"), ", ", ConfigText(c, "mode"),
                   " loop against ", ConfigText(c, "target"));
  // The JSON rides along for whoever wants the numbers; "<" escaped so that no "</script>"
  // inside a string can end the element.
  const std::string data = absl::StrReplaceAll(ToJson(report), {{"<", "\\u003c"}});
  std::string s = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      HtmlEscape(title), "</title>\n<style>", kStyle, "</style>\n</head>\n<body>\n<h1>",
      HtmlEscape(title), "</h1>\n<p class=\"note\">",
      HtmlEscape(absl::StrCat(
          "Started ", ConfigText(c, "started_utc"), "; shapes ", ConfigText(c, "shapes"),
          ", dtype ", ConfigText(c, "dtype"), "; server attnserve ",
          ConfigText(c, "server_version"), " on backend ", ConfigText(c, "server_backend"),
          ". Latency runs from the intended send time to the response (open loop: the "
          "schedule's time, so a late client or a stalled server shows in the latency).")),
      "</p>\n<h2>Phases</h2>\n<div class=\"wide\">", PhaseTable(report.phases), "</div>\n");
  absl::StrAppend(
      &s, "<h2>Latency against throughput</h2>\n",
      Figure(KneeChart(report.phases),
             "Each point is one phase (labelled with its offered level); where the "
             "throughput stops growing while latency climbs is the knee."),
      Figure(SplitChart(report.phases),
             "Where the mean latency of each phase goes: the server's queue and compute "
             "time (from each OK response's Timing), the rest of its time, and what is "
             "left for the network and the client."));
  absl::StrAppend(&s, "<h2>Latency distribution per phase</h2>\n", Histograms(report.phases));
  absl::StrAppend(&s, "<h2>Over time</h2>\n", TimeCharts(report.phases));
  absl::StrAppend(&s, "<h2>Settings, server and machine</h2>\n<div class=\"tables\">\n",
                  KeyValueTable("Run settings", report.config),
                  KeyValueTable("Server (GetServerInfo)", report.server),
                  KeyValueTable("Client machine", report.machine), "</div>\n");
  absl::StrAppend(&s, "<script type=\"application/json\" id=\"attnserve-bench-data\">\n", data,
                  "</script>\n</body>\n</html>\n");
  return s;
}

}  // namespace attnserve::bench
