// Charts for attnserve-bench's HTML report, drawn by this code as inline SVG (no script, no
// charting library, nothing fetched when the page opens): axes with nice ranges and ticks,
// linear or logarithmic, and three kinds of chart built on them.
//
// Why not a library: Debian packages several (libjs-chart.js, libjs-d3, libjs-dygraphs,
// libjs-jquery-flot), but each would have to be copied into every report (and into this
// repository, which takes no third-party code) or loaded from the reader's disk, and all of them
// need a script; chart.js draws on a canvas, which leaves nothing in the page to check. Static
// SVG opens anywhere, prints crisply, and its numbers are unit-tested here.
//
// Every text that reaches the page goes through HtmlEscape. Pure functions of their arguments;
// thread-safe.
#ifndef ATTNSERVE_CLIENT_BENCH_CHART_H_
#define ATTNSERVE_CLIENT_BENCH_CHART_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attnserve::bench {

// `text` with &, <, >, " and ' replaced by character references: safe as HTML text, as an
// attribute value in double or single quotes, and as SVG text inside HTML.
std::string HtmlEscape(absl::string_view text);

// A value axis: the range [lo, hi] a chart spans and the values to label.
struct Axis {
  double lo = 0;
  double hi = 1;
  bool log = false;
  std::vector<double> ticks;  // ascending, within [lo, hi]
  // Where `v` falls between pixel positions `from` (at lo) and `to` (at hi); values outside the
  // range map outside [from, to] (log: values <= 0 map to `from`).
  double Map(double v, double from, double to) const;
};

// [0, hi] with hi the first multiple at or above `max_value` of the smallest 1-2-5 step that
// needs at most six steps: 37 -> [0, 40] by 10, 100 -> [0, 100] by 20, 103.7 -> [0, 120] by 20,
// 0.9 -> [0, 1] by 0.2. max_value <= 0 gives [0, 1] by 0.2.
Axis LinearAxis(double max_value);

// Whole decades around [min_value, max_value]: lo = 10^floor(log10 min), hi = 10^ceil(log10 max)
// (one decade at least). Ticks at 1, 2 and 5 times each power of ten when the range spans at most
// two decades, else at the powers of ten only: (0.37, 12) -> [0.1, 100] ticks 0.1, 1, 10, 100.
// REQUIRES: 0 < min_value <= max_value.
Axis LogAxis(double min_value, double max_value);

// A tick label: up to 4 significant digits, no exponent below 1e6 ("0.005", "250", "12000").
std::string FormatTick(double v);

// A line (or its markers) of a line chart.
struct Series {
  std::string name;
  std::string color;  // CSS colour
  std::vector<double> x, y;
  bool dashed = false;
  std::vector<std::string> labels;  // optional, one per point, drawn above it
};

// A shaded stretch of the x axis with a caption (the phases of a run on a time axis).
struct Band {
  double from = 0, to = 0;
  std::string label;
};

// A chart's frame: pixel size, titles of the axes and the caption read by screen readers.
struct Frame {
  int width = 960;
  int height = 320;
  std::string title;  // aria-label
  std::string x_title;
  std::string y_title;
};

// Lines with markers over `x` and `y` axes, a legend above the plot, and optional bands.
// Points with y <= 0 on a log y axis are left out.
std::string LineChart(const Frame& frame, const Axis& x, const Axis& y,
                      const std::vector<Series>& series, const std::vector<Band>& bands = {});

// A histogram: bar i spans [edges[i], edges[i + 1]) on `x` (log or linear) with height
// heights[i] on `y`; `markers` are labelled vertical lines (percentiles).
struct Marker {
  double x = 0;
  std::string label;
};
std::string HistogramChart(const Frame& frame, const Axis& x, const Axis& y,
                           const std::vector<double>& edges, const std::vector<double>& heights,
                           const std::string& color, const std::vector<Marker>& markers = {});

// Stacked bars, one per category: values[s][c] is segment s of category c (negative values count
// as 0), segment s drawn in colors[s] and named names[s] in the legend; bar_labels[c], when
// given, is a second line under category c (leave frame.x_title empty: it would overlap).
std::string StackedBarChart(const Frame& frame, const Axis& y,
                            const std::vector<std::string>& categories,
                            const std::vector<std::string>& names,
                            const std::vector<std::string>& colors,
                            const std::vector<std::vector<double>>& values,
                            const std::vector<std::string>& bar_labels = {});

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_CHART_H_
