#include "client/bench/report.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

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

// Distribution's fields by their JSON names, in the order written; read by the same table.
constexpr std::pair<const char*, double Distribution::*> kDistributionFields[] = {
    {"p50", &Distribution::p50},   {"p90", &Distribution::p90}, {"p99", &Distribution::p99},
    {"p999", &Distribution::p999}, {"max", &Distribution::max}, {"mean", &Distribution::mean}};

Json DistributionJson(const Distribution& d) {
  Json j = Json::object();
  for (const auto& [name, field] : kDistributionFields) j[name] = R(d.*field);
  return j;
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
  for (const auto& [name, field] : kDistributionFields) d.*field = Num(j, name);
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

// The kind of attention the run asked for, from its settings: "softmax attention" with its score
// modifications ("window 4095,0", "soft-cap 30", "ALiBi"), or "linear attention (relu)".
// Reports from before these settings say "softmax attention".
std::string AttentionText(const Json& config) {
  if (ConfigText(config, "kind") == "linear") {
    const std::string map = ConfigText(config, "feature_map");
    return absl::StrCat("linear attention (", map == "?" || map.empty() ? "elu_plus_one" : map,
                        ")");
  }
  std::vector<std::string> mods;
  if (const std::string w = ConfigText(config, "window"); w != "?" && !w.empty()) {
    mods.push_back(absl::StrCat("window ", w));
  }
  if (auto it = config.find("softcap");
      it != config.end() && it->is_number() && it->get<double>() > 0) {
    mods.push_back(absl::StrCat("soft-cap ", Dump(*it)));
  }
  if (auto it = config.find("alibi"); it != config.end() && it->is_boolean() && it->get<bool>()) {
    mods.push_back("ALiBi");
  }
  return mods.empty() ? "softmax attention"
                      : absl::StrCat("softmax attention, ", absl::StrJoin(mods, ", "));
}

}  // namespace

std::string ToHtml(const RunReport& report) {
  const Json& c = report.config;
  const std::string title =
      absl::StrCat("attnserve-bench: ", ConfigText(c, "rpc"), " (", AttentionText(c), "), ",
                   ConfigText(c, "mode"), " loop against ", ConfigText(c, "target"));
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

// --- Request-size sweeps ---

namespace {

constexpr const char* kSweepKind = "attnserve-serving-sweep";
constexpr const char* kEcho = "echo";

std::string FieldPath(const std::string& at, absl::string_view key) {
  return at.empty() ? std::string(key) : absl::StrCat(at, ".", key);
}

std::string TypeName(const Json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

// Reads fields of a sweep document, keeping the first problem as "path: what is wrong". After a
// problem every reader still returns a harmless value (zero, empty), so a caller may read on and
// check ok() once in a while.
class SweepReader {
 public:
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  void Fail(const std::string& path, const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(path, ": ", what);
  }

  // The field, or null after recording "missing".
  const Json* Need(const Json& obj, const std::string& at, const char* key) {
    auto it = obj.find(key);
    if (it != obj.end()) return &*it;
    Fail(FieldPath(at, key), "missing");
    return nullptr;
  }

  std::string Text(const Json& obj, const std::string& at, const char* key, bool required,
                   bool non_empty) {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) Fail(FieldPath(at, key), "missing");
      return "";
    }
    if (!it->is_string()) {
      Fail(FieldPath(at, key), absl::StrCat("expected a string, got ", TypeName(*it)));
      return "";
    }
    if (non_empty && it->get_ref<const std::string&>().empty()) {
      Fail(FieldPath(at, key), "empty");
    }
    return it->get<std::string>();
  }

  double Number(const Json& j, const std::string& path, double min) {
    if (!j.is_number()) {
      Fail(path, absl::StrCat("expected a number, got ", TypeName(j)));
      return 0;
    }
    const double v = j.get<double>();
    if (!(v >= min)) {
      Fail(path, absl::StrCat("must be at least ", min, "; got ", Dump(j)));
      return 0;
    }
    // No figure of a sweep comes near these bounds (11 days of CPU per call; a fault in a
    // billion calls); within them the charts' axes, sums and ratios stay finite and sensible.
    if (v > 1e12 || (v > 0 && v < 1e-9)) {
      Fail(path, absl::StrCat("out of range (0 or 1e-9 to 1e12): ", Dump(j)));
      return 0;
    }
    return v;
  }

  double Number(const Json& obj, const std::string& at, const char* key, double min) {
    const Json* j = Need(obj, at, key);
    return j == nullptr ? 0 : Number(*j, FieldPath(at, key), min);
  }

  // A number, or nullopt for null.
  std::optional<double> Measured(const Json& obj, const std::string& at, const char* key) {
    const Json* j = Need(obj, at, key);
    if (j == nullptr || j->is_null()) return std::nullopt;
    return Number(*j, FieldPath(at, key), 0);
  }

  int64_t Integer(const Json& obj, const std::string& at, const char* key, int64_t min) {
    const Json* j = Need(obj, at, key);
    if (j == nullptr) return 0;
    const std::string path = FieldPath(at, key);
    // 4000.0 counts as 4000 (a Python float); 4000.5 does not.
    if (!j->is_number() ||
        (j->is_number_float() && (j->get<double>() != std::floor(j->get<double>()) ||
                                  std::fabs(j->get<double>()) > 9e15))) {
      Fail(path,
           absl::StrCat("expected an integer, got ", j->is_number() ? Dump(*j) : TypeName(*j)));
      return 0;
    }
    const int64_t v = j->is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(j->get<uint64_t>(), INT64_MAX))
                      : j->is_number_integer() ? j->get<int64_t>()
                                               : static_cast<int64_t>(j->get<double>());
    if (v < min) {
      Fail(path, absl::StrCat("must be at least ", min, "; got ", v));
      return 0;
    }
    return v;
  }

 private:
  std::string error_;
};

SweepServer ReadSweepServer(SweepReader& r, const Json& j, const std::string& at) {
  SweepServer s;
  if (!j.is_object()) {
    r.Fail(at, absl::StrCat("expected an object (or null), got ", TypeName(j)));
    return s;
  }
  s.ok = r.Integer(j, at, "ok", 0);
  s.errors = r.Integer(j, at, "errors", 0);
  s.req_per_s = r.Measured(j, at, "req_per_s");
  s.cpu_us_per_call = r.Measured(j, at, "cpu_us_per_call");
  s.faults_per_call = r.Measured(j, at, "faults_per_call");
  s.p50_ms = r.Measured(j, at, "p50_ms");
  s.p99_ms = r.Measured(j, at, "p99_ms");
  return s;
}

SweepPoint ReadSweepPoint(SweepReader& r, const Json& j, const std::string& at,
                          const std::vector<std::string>& names) {
  SweepPoint p;
  if (!j.is_object()) {
    r.Fail(at, absl::StrCat("expected an object, got ", TypeName(j)));
    return p;
  }
  p.rpc = r.Text(j, at, "rpc", /*required=*/true, /*non_empty=*/true);
  p.shape = r.Text(j, at, "shape", /*required=*/true, /*non_empty=*/false);
  p.request_bytes = r.Integer(j, at, "request_bytes", 1);
  p.response_bytes = r.Integer(j, at, "response_bytes", 0);
  p.callers = r.Integer(j, at, "callers", 1);
  p.backend_cpu_us = r.Number(j, at, "backend_cpu_us", 0);
  if (const Json* servers = r.Need(j, at, "servers"); servers != nullptr) {
    const std::string sat = FieldPath(at, "servers");
    if (!servers->is_object()) {
      r.Fail(sat, absl::StrCat("expected an object, got ", TypeName(*servers)));
    } else {
      for (const auto& [name, entry] : servers->items()) {
        const std::string eat = FieldPath(sat, name);
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          r.Fail(eat, "not one of the top-level \"servers\"");
        } else if (!entry.is_null()) {
          p.servers[name] = ReadSweepServer(r, entry, eat);
        }
      }
    }
  }
  if (auto it = j.find("overhead"); it != j.end() && !it->is_null()) {
    p.overhead = r.Number(*it, FieldPath(at, "overhead"), 0);
  }
  if (auto it = j.find("overhead_range"); it != j.end() && !it->is_null()) {
    const std::string rat = FieldPath(at, "overhead_range");
    if (!it->is_array() || it->size() != 2) {
      r.Fail(rat, absl::StrCat("expected [lowest, highest], got ",
                               it->is_array() ? Dump(*it) : TypeName(*it)));
    } else {
      const double lo = r.Number((*it)[0], rat + "[0]", 0);
      const double hi = r.Number((*it)[1], rat + "[1]", 0);
      if (!r.ok()) return p;
      if (lo > hi || !p.overhead.has_value() || *p.overhead < lo || *p.overhead > hi) {
        r.Fail(rat, absl::StrCat("must hold the overhead (",
                                 p.overhead.has_value() ? Dump(j.at("overhead")) : "none",
                                 ") between its lowest and highest; got ", Dump(*it)));
      } else {
        p.overhead_range = std::make_pair(lo, hi);
      }
    }
  }
  return p;
}

}  // namespace

absl::StatusOr<Sweep> ParseSweep(absl::string_view text) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sweep is not valid JSON (at byte ", e.byte, ")"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sweep is not a JSON object (got ", TypeName(j), ")"));
  }
  SweepReader r;
  Sweep s;
  if (const Json* kind = r.Need(j, "", "kind"); kind != nullptr && *kind != kSweepKind) {
    r.Fail("kind", absl::StrCat("expected \"", kSweepKind, "\", got ", Dump(*kind)));
  }
  if (!r.ok() && j.contains("phases")) {
    // An attnserve-bench run, most likely.
    return absl::InvalidArgumentError(
        absl::StrCat(r.error(), " (a run of attnserve-bench? redraw that with --html_from)"));
  }
  s.title = r.Text(j, "", "title", /*required=*/false, /*non_empty=*/false);
  s.command = r.Text(j, "", "command", /*required=*/false, /*non_empty=*/false);
  if (auto it = j.find("machine"); it != j.end()) {
    if (it->is_object()) {
      s.machine = *it;
    } else {
      r.Fail("machine", absl::StrCat("expected an object, got ", TypeName(*it)));
    }
  }
  if (const Json* settings = r.Need(j, "", "settings"); settings != nullptr) {
    if (settings->is_object()) {
      s.settings = *settings;
      s.target_overhead = r.Number(*settings, "settings", "target_overhead", 0);
      if (r.ok() && s.target_overhead <= 0) {
        r.Fail("settings.target_overhead", "must be positive; got 0");
      }
    } else {
      r.Fail("settings", absl::StrCat("expected an object, got ", TypeName(*settings)));
    }
  }
  if (const Json* servers = r.Need(j, "", "servers"); servers != nullptr) {
    if (!servers->is_array()) {
      r.Fail("servers", absl::StrCat("expected an array of names, got ", TypeName(*servers)));
    } else if (servers->empty()) {
      r.Fail("servers", "empty (the first entry is the server under test)");
    }
    for (size_t i = 0; r.ok() && i < servers->size(); ++i) {
      const Json& name = (*servers)[i];
      const std::string at = absl::StrCat("servers[", i, "]");
      if (!name.is_string() || name.get_ref<const std::string&>().empty()) {
        r.Fail(at, absl::StrCat("expected a non-empty name, got ", Dump(name)));
      } else if (std::find(s.servers.begin(), s.servers.end(), name.get<std::string>()) !=
                 s.servers.end()) {
        r.Fail(at, absl::StrCat(Dump(name), " listed twice"));
      } else if (i == 0 && name == kEcho) {
        r.Fail(at, "the server under test cannot be the echo server");
      } else {
        s.servers.push_back(name.get<std::string>());
      }
    }
  }
  if (!r.ok()) return absl::InvalidArgumentError(r.error());
  if (const Json* points = r.Need(j, "", "points"); points != nullptr) {
    if (!points->is_array()) {
      r.Fail("points", absl::StrCat("expected an array, got ", TypeName(*points)));
    } else if (points->empty()) {
      r.Fail("points", "empty: nothing was measured");
    }
    for (size_t i = 0; r.ok() && i < points->size(); ++i) {
      s.points.push_back(
          ReadSweepPoint(r, (*points)[i], absl::StrCat("points[", i, "]"), s.servers));
    }
  }
  if (!r.ok()) return absl::InvalidArgumentError(r.error());
  s.document = std::move(j);
  return s;
}

namespace {

constexpr const char* kSweepStyle = R"css(
p.worst { font-size: 15px; }
.over { font-weight: bold; color: #b00020; }
td.missing { color: #777; text-align: center; }
pre.command { font-size: 12px; background: #f6f6f6; padding: 6px 8px; white-space: pre-wrap;
  word-break: break-all; max-width: 960px; }
)css";

const char* const kBaselineColors[] = {"#9467bd", "#8c564b", "#e377c2", "#17becf"};

// "768 KiB", "1.5 KiB", "12 MiB", "100 B": binary units, at most 3 significant digits (more for
// 100 and up, never an exponent).
std::string HumanBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return absl::StrCat(v >= 100 ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.3g", v), " ",
                      kUnits[u]);
}

std::string PointName(const SweepPoint& p) {
  return absl::StrCat("[", p.shape, "] (", HumanBytes(p.request_bytes), ")");
}

std::string CallersText(int64_t n) { return absl::StrCat(n, n == 1 ? " caller" : " callers"); }

std::string Fixed(std::optional<double> v, int decimals) {
  return v.has_value() ? absl::StrFormat("%.*f", decimals, *v) : "n/a";
}

const SweepServer* Measured(const SweepPoint& p, const std::string& server) {
  auto it = p.servers.find(server);
  return it == p.servers.end() ? nullptr : &it->second;
}

// `server`'s CPU per call over the backend's plus the echo server's, when all are known.
std::optional<double> Ratio(const SweepPoint& p, const std::string& server) {
  const SweepServer* s = Measured(p, server);
  const SweepServer* echo = Measured(p, kEcho);
  if (s == nullptr || echo == nullptr || !s->cpu_us_per_call || !echo->cpu_us_per_call) {
    return std::nullopt;
  }
  const double denominator = p.backend_cpu_us + *echo->cpu_us_per_call;
  const double ratio = *s->cpu_us_per_call / denominator;
  if (!(denominator > 0) || !std::isfinite(ratio)) return std::nullopt;
  return ratio;
}

std::string ServerColor(const Sweep& sweep, size_t i) {
  if (i == 0) return "#1f77b4";
  if (sweep.servers[i] == kEcho) return "#2ca02c";
  size_t k = 0;  // which baseline
  for (size_t j = 1; j < i; ++j) k += sweep.servers[j] != kEcho;
  return kBaselineColors[k % 4];
}

// The points of one (rpc, callers) group, by request size.
struct SweepGroup {
  std::string rpc;
  int64_t callers = 0;
  std::vector<const SweepPoint*> points;
};

std::vector<SweepGroup> Groups(const Sweep& sweep) {
  auto rank = [](const std::string& rpc) { return rpc == "attend" ? 0 : rpc == "mha" ? 1 : 2; };
  std::vector<SweepGroup> groups;
  for (const SweepPoint& p : sweep.points) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const SweepGroup& g) {
      return g.rpc == p.rpc && g.callers == p.callers;
    });
    if (g == groups.end()) {
      groups.push_back({p.rpc, p.callers, {}});
      g = groups.end() - 1;
    }
    g->points.push_back(&p);
  }
  std::sort(groups.begin(), groups.end(), [&](const SweepGroup& a, const SweepGroup& b) {
    return std::make_tuple(rank(a.rpc), a.rpc, a.callers) <
           std::make_tuple(rank(b.rpc), b.rpc, b.callers);
  });
  for (SweepGroup& g : groups) {
    std::stable_sort(g.points.begin(), g.points.end(),
                     [](const SweepPoint* a, const SweepPoint* b) {
                       return a->request_bytes < b->request_bytes;
                     });
  }
  return groups;
}

std::string GroupName(const SweepGroup& g) {
  return absl::StrCat(g.rpc, ", ", CallersText(g.callers));
}

// The smallest positive and the largest value over `series`, for a log axis.
void PositiveRange(const std::vector<Series>& series, double* lo, double* hi) {
  *lo = 0;
  *hi = 0;
  for (const Series& s : series) {
    for (double v : s.y) {
      if (!(v > 0)) continue;
      *lo = *lo == 0 ? v : std::min(*lo, v);
      *hi = std::max(*hi, v);
    }
  }
}

Axis BytesAxis(const SweepGroup& g) {
  return LogAxis(static_cast<double>(g.points.front()->request_bytes),
                 static_cast<double>(g.points.back()->request_bytes));
}

Frame SweepFrame(const SweepGroup& g, const std::string& what, const std::string& y_title) {
  Frame f;
  f.height = 340;
  f.title = absl::StrCat(what, ": ", GroupName(g));
  f.x_title = "request size (bytes, log scale)";
  f.y_title = y_title;
  return f;
}

std::string CpuChart(const Sweep& sweep, const SweepGroup& g) {
  std::vector<Series> series;
  for (size_t i = 0; i < sweep.servers.size(); ++i) {
    Series s = Line(sweep.servers[i], ServerColor(sweep, i));
    for (const SweepPoint* p : g.points) {
      const SweepServer* m = Measured(*p, sweep.servers[i]);
      if (m == nullptr || !m->cpu_us_per_call) continue;
      s.x.push_back(static_cast<double>(p->request_bytes));
      s.y.push_back(*m->cpu_us_per_call);
    }
    series.push_back(std::move(s));
  }
  Series backend = Line("backend", "#d62728"), plus_echo = Line("backend + echo", "#ff7f0e");
  plus_echo.dashed = true;
  for (const SweepPoint* p : g.points) {
    backend.x.push_back(static_cast<double>(p->request_bytes));
    backend.y.push_back(p->backend_cpu_us);
    const SweepServer* echo = Measured(*p, kEcho);
    if (echo != nullptr && echo->cpu_us_per_call) {
      plus_echo.x.push_back(static_cast<double>(p->request_bytes));
      plus_echo.y.push_back(p->backend_cpu_us + *echo->cpu_us_per_call);
    }
  }
  series.push_back(std::move(backend));
  if (!plus_echo.x.empty()) series.push_back(std::move(plus_echo));
  double lo, hi;
  PositiveRange(series, &lo, &hi);
  return Figure(
      LineChart(SweepFrame(g, "CPU per call against request size", "CPU per call (µs, log scale)"),
                BytesAxis(g), lo > 0 ? LogAxis(lo, hi) : LogAxis(1, 10), series),
      "CPU time per call of each server process; the backend's own compute CPU for the same "
      "problem (no gRPC); and, dashed, the backend plus the echo server's CPU for the same "
      "bytes: what serving would cost with nothing of its own.");
}

std::string OverheadChart(const Sweep& sweep, const SweepGroup& g) {
  std::vector<Series> series;
  double max_y = sweep.target_overhead;
  Series under_test = Line(absl::StrCat(sweep.servers[0], " / (backend + echo)"), "#1f77b4");
  for (const SweepPoint* p : g.points) {
    if (!p->overhead) continue;
    under_test.x.push_back(static_cast<double>(p->request_bytes));
    under_test.y.push_back(*p->overhead);
    under_test.labels.push_back(absl::StrFormat("%.2f", *p->overhead));
    max_y = std::max(max_y, *p->overhead);
  }
  series.push_back(std::move(under_test));
  for (size_t i = 1; i < sweep.servers.size(); ++i) {
    if (sweep.servers[i] == kEcho) continue;
    Series s = Line(absl::StrCat(sweep.servers[i], " / (backend + echo)"), ServerColor(sweep, i));
    for (const SweepPoint* p : g.points) {
      const std::optional<double> ratio = Ratio(*p, sweep.servers[i]);
      if (!ratio) continue;
      s.x.push_back(static_cast<double>(p->request_bytes));
      s.y.push_back(*ratio);
      max_y = std::max(max_y, *ratio);
    }
    series.push_back(std::move(s));
  }
  const Axis x = BytesAxis(g);
  Series target = Line(absl::StrCat("target ", FormatTick(sweep.target_overhead)), "#555555");
  target.dashed = true;
  target.x = {x.lo, x.hi};
  target.y = {sweep.target_overhead, sweep.target_overhead};
  series.push_back(std::move(target));
  return Figure(
      LineChart(
          SweepFrame(g, "Overhead ratio against request size", "server CPU / (backend + echo CPU)"),
          x, LinearAxis(max_y * 1.1), series),
      absl::StrCat("Each server's CPU per call over the backend's plus the echo server's (",
                   sweep.servers[0],
                   "'s as the sweep computed it, labelled); 1 is serving at the cost of computing "
                   "and moving the bytes, above 1 is overhead of the server's own. Dashed: the "
                   "target ",
                   FormatTick(sweep.target_overhead), "."));
}

std::string FaultsChart(const Sweep& sweep, const SweepGroup& g) {
  std::vector<Series> series;
  bool zero = false;
  for (size_t i = 0; i < sweep.servers.size(); ++i) {
    Series s = Line(sweep.servers[i], ServerColor(sweep, i));
    for (const SweepPoint* p : g.points) {
      const SweepServer* m = Measured(*p, sweep.servers[i]);
      if (m == nullptr || !m->faults_per_call) continue;
      s.x.push_back(static_cast<double>(p->request_bytes));
      s.y.push_back(*m->faults_per_call);
      zero = zero || *m->faults_per_call <= 0;
    }
    series.push_back(std::move(s));
  }
  double lo, hi;
  PositiveRange(series, &lo, &hi);
  // Faults per call run from about none (small requests served from reused memory) to hundreds
  // (a fresh buffer of a few MiB is hundreds of 4 KiB pages): on a linear axis everything below
  // the largest sizes would lie flat on 0. So a log axis when the positive values span more than
  // two decades, which leaves out points at 0 (the caption says so); otherwise a linear axis
  // from 0, which shows every point, zeros included.
  const bool log = lo > 0 && hi / lo > 100;
  std::string caption =
      "Page faults of each server process per call (memory the kernel had to map in, zeroed, "
      "for the call)";
  if (log && zero) {
    absl::StrAppend(&caption, "; log scale: points at 0 are not drawn.");
  } else {
    absl::StrAppend(&caption, log ? "; log scale." : "; linear scale.");
  }
  return Figure(LineChart(SweepFrame(g, "Page faults per call against request size",
                                     log ? "faults per call (log scale)" : "faults per call"),
                          BytesAxis(g), log ? LogAxis(lo, hi) : LinearAxis(hi * 1.1), series),
                caption);
}

std::string SweepTable(const Sweep& sweep, const SweepGroup& g) {
  std::vector<std::string> baselines;
  for (size_t i = 1; i < sweep.servers.size(); ++i) {
    if (sweep.servers[i] != kEcho) baselines.push_back(sweep.servers[i]);
  }
  std::string s =
      "<table><tr><th class=\"key\" rowspan=\"2\">shape</th><th rowspan=\"2\">request</th>"
      "<th rowspan=\"2\">response</th>";
  for (const std::string& name : sweep.servers) {
    absl::StrAppend(&s, "<th colspan=\"5\">", HtmlEscape(name), "</th>");
  }
  absl::StrAppend(&s, "<th rowspan=\"2\">backend µs</th><th rowspan=\"2\">overhead</th>");
  for (const std::string& name : baselines) {
    absl::StrAppend(&s, "<th rowspan=\"2\">", HtmlEscape(name), " / (backend + echo)</th>");
  }
  absl::StrAppend(&s, "</tr>\n<tr>");
  for (size_t i = 0; i < sweep.servers.size(); ++i) {
    absl::StrAppend(&s,
                    "<th>req/s</th><th>CPU µs/call</th><th>faults/call</th><th>p50 ms</th>"
                    "<th>errors</th>");
  }
  absl::StrAppend(&s, "</tr>\n");
  // `spread`: the rounds' lowest and highest, after the ratio ("1.75 (1.73-1.94)").
  auto ratio_cell = [&](std::optional<double> r,
                        std::optional<std::pair<double, double>> spread = std::nullopt) {
    const std::string after =
        spread.has_value() ? absl::StrFormat(" (%.2f-%.2f)", spread->first, spread->second) : "";
    if (r.has_value() && *r > sweep.target_overhead) {
      return absl::StrFormat("<td class=\"over\">%.2f%s</td>", *r, after);
    }
    return absl::StrCat("<td>", Fixed(r, 2), after, "</td>");
  };
  for (const SweepPoint* p : g.points) {
    absl::StrAppend(&s, "<tr><td class=\"key\">", HtmlEscape(p->shape), "</td><td>",
                    HumanBytes(p->request_bytes), "</td><td>", HumanBytes(p->response_bytes),
                    "</td>");
    for (const std::string& name : sweep.servers) {
      const SweepServer* m = Measured(*p, name);
      if (m == nullptr) {
        absl::StrAppend(&s, "<td colspan=\"5\" class=\"missing\">not measured</td>");
        continue;
      }
      absl::StrAppend(&s, "<td>", Fixed(m->req_per_s, 1), "</td><td>", Fixed(m->cpu_us_per_call, 1),
                      "</td><td>", Fixed(m->faults_per_call, 2), "</td><td>", Fixed(m->p50_ms, 3),
                      "</td>", m->errors > 0 ? "<td class=\"over\">" : "<td>", m->errors, "</td>");
    }
    absl::StrAppend(&s, "<td>", absl::StrFormat("%.1f", p->backend_cpu_us), "</td>",
                    ratio_cell(p->overhead, p->overhead_range));
    for (const std::string& name : baselines) absl::StrAppend(&s, ratio_cell(Ratio(*p, name)));
    absl::StrAppend(&s, "</tr>\n");
  }
  return s + "</table>\n";
}

// "Not measured: echo at [1,8,4096,64] (12 MiB); a0c8747 at any size.", or "".
std::string MissingText(const Sweep& sweep, const SweepGroup& g) {
  std::vector<std::string> parts;
  for (const std::string& name : sweep.servers) {
    std::vector<std::string> at;
    for (const SweepPoint* p : g.points) {
      if (Measured(*p, name) == nullptr) at.push_back(PointName(*p));
    }
    if (at.empty()) continue;
    parts.push_back(at.size() == g.points.size()
                        ? absl::StrCat(name, " at any size")
                        : absl::StrCat(name, " at ", absl::StrJoin(at, ", ")));
  }
  if (parts.empty()) return "";
  return absl::StrCat("Not measured: ", absl::StrJoin(parts, "; "), ".");
}

// The worst overhead with where it is, and how many points are over the target.
std::string WorstText(const Sweep& sweep) {
  const SweepPoint* worst = nullptr;
  int over = 0, with_ratio = 0;
  for (const SweepGroup& g : Groups(sweep)) {
    for (const SweepPoint* p : g.points) {
      if (!p->overhead) continue;
      ++with_ratio;
      over += *p->overhead > sweep.target_overhead;
      if (worst == nullptr || *p->overhead > *worst->overhead) worst = p;
    }
  }
  const std::string target = FormatTick(sweep.target_overhead);
  if (worst == nullptr) {
    return absl::StrCat("No overhead ratio: ", sweep.servers[0],
                        " and the echo server were not both measured at any point (target ", target,
                        ").");
  }
  return absl::StrCat("Worst overhead ", absl::StrFormat("%.2f", *worst->overhead), " at ",
                      worst->rpc, " ", PointName(*worst), ", ", CallersText(worst->callers), "; ",
                      over, " of ", with_ratio, " point", with_ratio == 1 ? "" : "s",
                      " above the target ", target, ".");
}

// The document for the page: top-level fields compact, one point per line.
std::string SweepJsonText(const Json& document) {
  std::vector<std::string> fields;
  for (const auto& [key, value] : document.items()) {
    std::string v;
    if (key == "points" && value.is_array()) {
      std::vector<std::string> points;
      for (const Json& p : value) points.push_back(Dump(p));
      v = absl::StrCat("[\n  ", absl::StrJoin(points, ",\n  "), "\n]");
    } else {
      v = Dump(value);
    }
    fields.push_back(absl::StrCat(Dump(Json(key)), ": ", v));
  }
  return absl::StrCat("{", absl::StrJoin(fields, ",\n "), "}\n");
}

}  // namespace

std::string SweepToHtml(const Sweep& sweep) {
  const std::string title = sweep.title.empty() ? "attnserve serving sweep" : sweep.title;
  std::vector<std::string> roles;
  for (size_t i = 0; i < sweep.servers.size(); ++i) {
    const std::string& n = sweep.servers[i];
    roles.push_back(i == 0       ? absl::StrCat(n, " (under test)")
                    : n == kEcho ? absl::StrCat(n, " (the echo server)")
                                 : absl::StrCat(n, " (run beside it)"));
  }
  const std::vector<SweepGroup> groups = Groups(sweep);
  std::vector<std::string> group_names;
  for (const SweepGroup& g : groups) group_names.push_back(GroupName(g));
  std::string s = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      HtmlEscape(title), "</title>\n<style>", kStyle, kSweepStyle,
      "</style>\n</head>\n<body>\n<h1>", HtmlEscape(title), "</h1>\n<p class=\"worst\">",
      HtmlEscape(WorstText(sweep)), "</p>\n<p class=\"note\">",
      HtmlEscape(absl::StrCat(
          "Each point is one request size (rpc and shape) sent by a number of concurrent "
          "callers to each server. For each it gives the CPU time each server process spent "
          "per call; the CPU the backend's own compute takes for the same problem, without "
          "gRPC; and the CPU per call of the echo server, the same gRPC stack answering with "
          "the query it got and computing nothing, for the same bytes. "
          "The overhead ratio is the server's CPU per call over backend + echo: 1 means serving "
          "costs what computing and moving the bytes cost, above 1 is the server's own "
          "overhead (target ",
          FormatTick(sweep.target_overhead),
          "). Page faults per call are the server process's page faults over its calls: memory "
          "the kernel had to map in for them.")),
      "</p>\n<p class=\"note\">",
      HtmlEscape(absl::StrCat("Servers: ", absl::StrJoin(roles, ", "), ". ", sweep.points.size(),
                              " point", sweep.points.size() == 1 ? "" : "s", " in ", groups.size(),
                              " group", groups.size() == 1 ? "" : "s", ": ",
                              absl::StrJoin(group_names, "; "), ".")),
      "</p>\n<h2>Command</h2>\n<pre class=\"command\">",
      HtmlEscape(sweep.command.empty() ? "not recorded" : sweep.command),
      "</pre>\n<div class=\"tables\">\n", KeyValueTable("Machine", sweep.machine),
      KeyValueTable("Settings", sweep.settings), "</div>\n");
  for (const SweepGroup& g : groups) {
    absl::StrAppend(&s, "<h2>", HtmlEscape(GroupName(g)), "</h2>\n");
    if (const std::string missing = MissingText(sweep, g); !missing.empty()) {
      absl::StrAppend(&s, "<p class=\"note\">", HtmlEscape(missing), "</p>\n");
    }
    absl::StrAppend(&s, CpuChart(sweep, g), OverheadChart(sweep, g), FaultsChart(sweep, g),
                    "<div class=\"wide\">", SweepTable(sweep, g), "</div>\n");
  }
  // As ToHtml: "<" escaped so that no "</script>" inside a string can end the element.
  absl::StrAppend(&s, "<script type=\"application/json\" id=\"attnserve-sweep-data\">\n",
                  absl::StrReplaceAll(SweepJsonText(sweep.document), {{"<", "\\u003c"}}),
                  "</script>\n</body>\n</html>\n");
  return s;
}

}  // namespace attnserve::bench
