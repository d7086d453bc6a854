// The cost of a sliding window and of linear attention against full causal attention over the
// sequence length, on the CPU backend (issue 32; figures in tests/bench/KINDS.md).
// Self-attention of one sequence, float32, Hq = Hkv = heads, D = Dv = 64: for each L, full
// causal attention (up to --max_full_len), causal attention in a window of --window keys
// (left = window - 1, right = 0) and causal linear attention (elu + 1), the best of --reps calls
// each, alternating, all in one process. Prints one line per L: the times, full / window, and
// the times per query row (what a window and linear attention keep flat). With --html=PATH it
// also writes, after the run, a page with the same table under two log-log charts against L (ms
// per call, µs per query row), drawn as inline SVG by attnserve-bench's client/bench/chart.h: one
// file that opens anywhere and fetches nothing, for issue 32's "one chart" (tests/bench/KINDS.md).
//
//   build/tests/bench/attention_kinds_bench [--threads=2] [--heads=1] [--window=4096]
//       [--min_len=1024] [--max_len=262144] [--max_full_len=65536] [--reps=3] [--html=PATH]
//
// Not a test: nothing here asserts a time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/bench/chart.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"

namespace {

using attnserve::kernels::AttentionParams;
using attnserve::kernels::cpu::CpuBackend;
using attnserve::kernels::cpu::CpuBackendOptions;

// The text after "--name=", or null when the flag is not given.
const char* FlagText(int argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return nullptr;
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const char* text = FlagText(argc, argv, name);
  return text != nullptr ? std::atoll(text) : fallback;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string UtcNow() {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
}

// One L's best times in ms; full causal attention is not run above --max_full_len.
struct Row {
  int64_t len = 0;
  bool full = false;
  double ms[3] = {0, 0, 0};  // full, window, linear
};

constexpr const char* kColumns[] = {"L",     "full_ms",     "window_ms",     "linear_ms",
                                    "ratio", "full_us/row", "window_us/row", "linear_us/row"};
constexpr int kWidths[] = {8, 12, 12, 12, 8, 14, 14, 14};

// A row's cells ("-" where full attention was not run), formatted once for stdout and the page
// alike, so that the two cannot disagree.
std::vector<std::string> Cells(const Row& r) {
  const double l = static_cast<double>(r.len);
  return {absl::StrCat(r.len),
          r.full ? absl::StrFormat("%.2f", r.ms[0]) : "-",
          absl::StrFormat("%.2f", r.ms[1]),
          absl::StrFormat("%.2f", r.ms[2]),
          r.full ? absl::StrFormat("%.2f", r.ms[0] / r.ms[1]) : "-",
          r.full ? absl::StrFormat("%.3f", 1e3 * r.ms[0] / l) : "-",
          absl::StrFormat("%.3f", 1e3 * r.ms[1] / l),
          absl::StrFormat("%.3f", 1e3 * r.ms[2] / l)};
}

// A line of the stdout table: the cells right-aligned in their columns.
template <typename T>
std::string TextLine(const T& cells) {
  std::string s;
  int i = 0;
  for (const auto& cell : cells) {
    absl::StrAppend(&s, i == 0 ? "" : " ", absl::StrFormat("%*s", kWidths[i], cell));
    ++i;
  }
  return s;
}

// A log axis over the series' y values; LogAxis needs a positive range, so (1, 10) when empty.
attnserve::bench::Axis LogAxisOverY(const std::vector<attnserve::bench::Series>& series) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& s : series) {
    for (double y : s.y) {
      if (y <= 0) continue;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  }
  return hi > 0 ? attnserve::bench::LogAxis(lo, hi) : attnserve::bench::LogAxis(1, 10);
}

// The --html page: what ran, where and when, the two charts and the stdout table.
std::string Page(const std::string& command, const std::string& setup, const std::string& started,
                 const std::string& finished, int window, int reps, const std::vector<Row>& rows) {
  using attnserve::bench::Axis;
  using attnserve::bench::Frame;
  using attnserve::bench::HtmlEscape;
  using attnserve::bench::LineChart;
  using attnserve::bench::LogAxis;
  using attnserve::bench::Series;
  // Colours of attnserve-bench's report (matplotlib's first ones); the window dashed as well, so
  // that the lines stay apart in grey print where full and window coincide (L <= w).
  std::vector<Series> per_call = {
      {.name = "full causal", .color = "#d62728"},
      {.name = absl::StrCat("window ", window), .color = "#1f77b4", .dashed = true},
      {.name = "linear (elu + 1)", .color = "#2ca02c"}};
  std::vector<Series> per_row = per_call;
  for (const Row& r : rows) {
    for (int way = 0; way < 3; ++way) {
      if (way == 0 && !r.full) continue;
      const double l = static_cast<double>(r.len);
      per_call[way].x.push_back(l);
      per_call[way].y.push_back(r.ms[way]);
      per_row[way].x.push_back(l);
      per_row[way].y.push_back(1e3 * r.ms[way] / l);
    }
  }
  const Axis x = rows.empty() ? LogAxis(1, 10)
                              : LogAxis(static_cast<double>(rows.front().len),
                                        static_cast<double>(rows.back().len));
  const Frame call_frame{.height = 360,
                         .title = "Milliseconds per call against L, log-log",
                         .x_title = "L (tokens, log scale)",
                         .y_title = "ms per call (log scale)"};
  const Frame row_frame{.height = 360,
                        .title = "Microseconds per query row against L, log-log",
                        .x_title = "L (tokens, log scale)",
                        .y_title = "µs per query row (log scale)"};
  std::string table = "<table>\n<tr>";
  for (const char* column : kColumns) absl::StrAppend(&table, "<th>", HtmlEscape(column), "</th>");
  absl::StrAppend(&table, "</tr>\n");
  for (const Row& r : rows) {
    absl::StrAppend(&table, "<tr>");
    for (const std::string& cell : Cells(r)) {
      absl::StrAppend(&table, "<td>", HtmlEscape(cell), "</td>");
    }
    absl::StrAppend(&table, "</tr>\n");
  }
  absl::StrAppend(&table, "</table>\n");
  const std::string title = "Attention kinds against L: full causal, sliding window, linear";
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      HtmlEscape(title),
      "</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px auto; max-width: 1000px; padding: 0 16px; "
      "color: #222; }\n"
      "h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; }\n"
      "p.note { color: #555; font-size: 13px; max-width: 760px; }\n"
      "table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }\n"
      "th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }\n"
      "th { background: #f2f2f2; }\n"
      "figure { margin: 8px 0 16px; } figcaption { font-size: 13px; color: #444; }\n"
      "svg.chart { max-width: 100%; height: auto; }\n"
      "</style>\n</head>\n<body>\n<h1>",
      HtmlEscape(title), "</h1>\n<p class=\"note\">",
      HtmlEscape(absl::StrCat("Run from ", started, " to ", finished, ". ", setup,
                              ". Causal self-attention of one sequence on the CPU backend, the "
                              "best of ",
                              reps, " calls of each way at each L, alternating, in one process.")),
      "</p>\n<h2>Command</h2>\n<pre>", HtmlEscape(command),
      "</pre>\n<h2>Time per call</h2>\n<figure>\n",
      LineChart(call_frame, x, LogAxisOverY(per_call), per_call), "<figcaption>",
      HtmlEscape("On log-log axes a cost in L^k is a line of slope k: full causal attention "
                 "computes L²/2 scores (slope 2), the window at most L·w (slope 1 once L is past "
                 "w), linear attention a fixed amount of work a row (slope 1)."),
      "</figcaption></figure>\n<h2>Time per query row</h2>\n<figure>\n",
      LineChart(row_frame, x, LogAxisOverY(per_row), per_row), "<figcaption>",
      HtmlEscape("The same times over L: flat where the cost is linear in L."),
      "</figcaption></figure>\n<h2>Table</h2>\n<p class=\"note\">",
      HtmlEscape("As printed on stdout: ms per call, full / window, µs per query row."), "</p>\n",
      table, "</body>\n</html>\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = static_cast<int>(Flag(argc, argv, "threads", 2));
  const int heads = static_cast<int>(Flag(argc, argv, "heads", 1));
  const int window = static_cast<int>(Flag(argc, argv, "window", 4096));
  const int64_t min_len = Flag(argc, argv, "min_len", 1024);
  const int64_t max_len = Flag(argc, argv, "max_len", 262144);
  const int64_t max_full_len = Flag(argc, argv, "max_full_len", 65536);
  const int reps = static_cast<int>(Flag(argc, argv, "reps", 3));
  const char* html_path = FlagText(argc, argv, "html");
  constexpr int kD = 64;

  // Opened before the run, so that a path that cannot be written fails now, not after minutes.
  std::ofstream html;
  if (html_path != nullptr) {
    html.open(html_path);
    if (!html) {
      std::fprintf(stderr, "cannot write %s\n", html_path);
      return 1;
    }
  }
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = threads});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  const std::string started = UtcNow();
  const std::string setup = absl::StrFormat(
      "%s, %d threads, kernel %s; heads %d, D 64, float32, causal; window %d keys", CpuModel(),
      threads, attnserve::kernels::cpu::IsaName((*backend)->isa()), heads, window);
  std::printf("# %s\n%s\n", setup.c_str(), TextLine(kColumns).c_str());
  std::vector<Row> rows;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (int64_t len = min_len; len <= max_len; len *= 2) {
    const int l = static_cast<int>(len);
    std::vector<float> q(size_t(heads) * l * kD), k(q.size()), v(q.size()), out(q.size());
    for (float* x : {q.data(), k.data(), v.data()}) {
      for (size_t i = 0; i < q.size(); ++i) x[i] = normal(rng);
    }
    AttentionParams p;
    p.batch = 1;
    p.num_heads = p.num_kv_heads = heads;
    p.q_len = p.kv_len = l;
    p.head_dim = p.v_head_dim = kD;
    const int64_t head_stride = int64_t{l} * kD;
    p.q = {q.data(), heads * head_stride, head_stride, kD};
    p.k = {k.data(), heads * head_stride, head_stride, kD};
    p.v = {v.data(), heads * head_stride, head_stride, kD};
    p.out = {out.data(), heads * head_stride, head_stride, kD};
    p.causal = true;
    p.scale = 0.125f;
    AttentionParams windowed = p;
    windowed.mods.window_left = window - 1;
    windowed.mods.window_right = 0;
    AttentionParams linear = p;
    linear.kind = attnserve::kernels::AttentionKind::kLinear;
    const bool full = len <= max_full_len;
    double best[3] = {1e30, 1e30, 1e30};  // full, window, linear
    const AttentionParams* ways[3] = {&p, &windowed, &linear};
    for (int r = 0; r < reps; ++r) {
      for (int way = 0; way < 3; ++way) {
        if (way == 0 && !full) continue;
        const auto t0 = std::chrono::steady_clock::now();
        if (!(*backend)->Attend({*ways[way]}).ok()) return 1;
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        best[way] = std::min(best[way], ms);
      }
    }
    rows.push_back({.len = len, .full = full, .ms = {best[0], best[1], best[2]}});
    std::printf("%s\n", TextLine(Cells(rows.back())).c_str());
    std::fflush(stdout);
  }
  if (html_path != nullptr) {
    std::vector<std::string> args(argv, argv + argc);
    html << Page(absl::StrJoin(args, " "), setup, started, UtcNow(), window, reps, rows);
    html.close();
    if (!html) {
      std::fprintf(stderr, "cannot write %s\n", html_path);
      return 1;
    }
    std::fprintf(stderr, "wrote %s\n", html_path);
  }
  return 0;
}
