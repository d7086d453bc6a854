#include "client/bench/chart.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnserve::bench {

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

double Axis::Map(double v, double from, double to) const {
  double f;
  if (log) {
    if (v <= 0) return from;
    f = std::log10(v / lo) / std::log10(hi / lo);
  } else {
    f = (v - lo) / (hi - lo);
  }
  return from + f * (to - from);
}

Axis LinearAxis(double max_value) {
  Axis a;
  if (!(max_value > 0) || !std::isfinite(max_value)) max_value = 1;
  // The smallest 1-2-5 step that covers max_value in at most six steps.
  const double magnitude = std::pow(10.0, std::floor(std::log10(max_value / 6)));
  double step = 10 * magnitude;
  for (double m : {1.0, 2.0, 5.0}) {
    if (std::ceil(max_value / (m * magnitude) - 1e-9) <= 6) {
      step = m * magnitude;
      break;
    }
  }
  const int n = static_cast<int>(std::ceil(max_value / step - 1e-9));
  a.hi = n * step;
  for (int i = 0; i <= n; ++i) a.ticks.push_back(i * step);
  return a;
}

namespace {

// The power of ten at or below `v` (its exponent), exact at powers of ten.
int DecadeBelow(double v) {
  int k = static_cast<int>(std::floor(std::log10(v)));
  while (std::pow(10.0, k) > v) --k;
  while (std::pow(10.0, k + 1) <= v) ++k;
  return k;
}

}  // namespace

Axis LogAxis(double min_value, double max_value) {
  Axis a;
  a.log = true;
  const int lo = DecadeBelow(min_value);
  int hi = DecadeBelow(max_value);
  if (std::pow(10.0, hi) < max_value || hi == lo) ++hi;
  a.lo = std::pow(10.0, lo);
  a.hi = std::pow(10.0, hi);
  for (int k = lo; k <= hi; ++k) {
    const double p = std::pow(10.0, k);
    a.ticks.push_back(p);
    if (hi - lo <= 2 && k < hi) {
      a.ticks.push_back(2 * p);
      a.ticks.push_back(5 * p);
    }
  }
  return a;
}

std::string FormatTick(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1000 && std::fabs(v) < 1e6) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4g", v);
}

namespace {

constexpr int kLeft = 72, kRight = 24, kTop = 44, kBottom = 52;

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

// The plot area of a frame, in pixels.
struct Plot {
  double x0, x1, y0, y1;  // x0 left, x1 right, y0 bottom, y1 top
  explicit Plot(const Frame& f)
      : x0(kLeft), x1(f.width - kRight), y0(f.height - kBottom), y1(kTop) {}
};

std::string Open(const Frame& f) {
  return absl::StrFormat(
      "<svg class=\"chart\" role=\"img\" aria-label=\"%s\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
      HtmlEscape(f.title), f.width, f.height, f.width, f.height);
}

// Grid lines, tick labels and axis titles; `x` may be null (category axis drawn by the caller).
std::string Axes(const Frame& f, const Plot& p, const Axis* x, const Axis& y) {
  std::string s = absl::StrFormat(
      "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#fff\" stroke=\"#999\"/>\n",
      Num(p.x0), Num(p.y1), Num(p.x1 - p.x0), Num(p.y0 - p.y1));
  for (double t : y.ticks) {
    const double py = y.Map(t, p.y0, p.y1);
    absl::StrAppend(
        &s, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#e4e4e4\"/>"
                            "<text x=\"%s\" y=\"%s\" text-anchor=\"end\">%s</text>\n",
                            Num(p.x0), Num(py), Num(p.x1), Num(py), Num(p.x0 - 6), Num(py + 4),
                            HtmlEscape(FormatTick(t))));
  }
  if (x != nullptr) {
    for (double t : x->ticks) {
      const double px = x->Map(t, p.x0, p.x1);
      absl::StrAppend(
          &s, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#e4e4e4\"/>"
                              "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n",
                              Num(px), Num(p.y1), Num(px), Num(p.y0), Num(px), Num(p.y0 + 16),
                              HtmlEscape(FormatTick(t))));
    }
  }
  absl::StrAppend(
      &s, absl::StrFormat("<text x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n",
                          Num((p.x0 + p.x1) / 2), Num(f.height - 12), HtmlEscape(f.x_title)));
  absl::StrAppend(&s, absl::StrFormat("<text transform=\"translate(16 %s) rotate(-90)\" "
                                      "text-anchor=\"middle\">%s</text>\n",
                                      Num((p.y0 + p.y1) / 2), HtmlEscape(f.y_title)));
  return s;
}

// A legend row above the plot: a swatch and a name per entry.
std::string Legend(const Plot& p, const std::vector<std::string>& names,
                   const std::vector<std::string>& colors, bool lines) {
  std::string s;
  double x = p.x0;
  const double y = p.y1 - 18;
  for (size_t i = 0; i < names.size(); ++i) {
    if (lines) {
      absl::StrAppend(&s,
                      absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" "
                                      "stroke=\"%s\" stroke-width=\"2.5\"/>",
                                      Num(x), Num(y), Num(x + 18), Num(y), HtmlEscape(colors[i])));
    } else {
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"14\" height=\"10\" "
                                          "fill=\"%s\"/>",
                                          Num(x + 2), Num(y - 5), HtmlEscape(colors[i])));
    }
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%s\" y=\"%s\">%s</text>\n", Num(x + 23),
                                        Num(y + 4), HtmlEscape(names[i])));
    x += 23 + 7.0 * names[i].size() + 16;  // about 7 px per character at 12 px
  }
  return s;
}

std::string NoData(const Plot& p) {
  return absl::StrFormat(
      "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" fill=\"#777\">no data</text>\n",
      Num((p.x0 + p.x1) / 2), Num((p.y0 + p.y1) / 2));
}

}  // namespace

std::string LineChart(const Frame& frame, const Axis& x, const Axis& y,
                      const std::vector<Series>& series, const std::vector<Band>& bands) {
  const Plot p(frame);
  std::string s = Open(frame);
  absl::StrAppend(&s, Axes(frame, p, &x, y));
  for (size_t i = 0; i < bands.size(); ++i) {
    const double a = x.Map(bands[i].from, p.x0, p.x1), b = x.Map(bands[i].to, p.x0, p.x1);
    absl::StrAppend(
        &s, absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\" "
                            "fill-opacity=\"0.5\"/><text x=\"%s\" y=\"%s\" text-anchor=\"middle\" "
                            "fill=\"#555\" font-size=\"11\">%s</text>\n",
                            Num(a), Num(p.y1), Num(std::max(0.0, b - a)), Num(p.y0 - p.y1),
                            i % 2 == 0 ? "#eef2f7" : "#f7f7f7", Num((a + b) / 2), Num(p.y1 + 13),
                            HtmlEscape(bands[i].label)));
  }
  std::vector<std::string> names, colors;
  bool any = false;
  for (const Series& se : series) {
    names.push_back(se.name);
    colors.push_back(se.color);
    std::string points, marks;
    for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
      if (y.log && se.y[i] <= 0) continue;
      const double px = x.Map(se.x[i], p.x0, p.x1), py = y.Map(se.y[i], p.y0, p.y1);
      absl::StrAppend(&points, Num(px), ",", Num(py), " ");
      absl::StrAppend(&marks,
                      absl::StrFormat("<circle cx=\"%s\" cy=\"%s\" r=\"3\"/>", Num(px), Num(py)));
      if (i < se.labels.size() && !se.labels[i].empty()) {
        absl::StrAppend(&marks, absl::StrFormat("<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" "
                                                "font-size=\"11\" fill=\"#333\">%s</text>",
                                                Num(px), Num(py - 8), HtmlEscape(se.labels[i])));
      }
      any = true;
    }
    absl::StrAppend(
        &s, absl::StrFormat("<g class=\"data\" fill=\"%s\"><polyline fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"2\"%s points=\"%s\"/>%s</g>\n",
                            HtmlEscape(se.color), HtmlEscape(se.color),
                            se.dashed ? " stroke-dasharray=\"6 4\"" : "", points, marks));
  }
  if (!any) absl::StrAppend(&s, NoData(p));
  absl::StrAppend(&s, Legend(p, names, colors, /*lines=*/true), "</svg>\n");
  return s;
}

std::string HistogramChart(const Frame& frame, const Axis& x, const Axis& y,
                           const std::vector<double>& edges, const std::vector<double>& heights,
                           const std::string& color, const std::vector<Marker>& markers) {
  const Plot p(frame);
  std::string s = Open(frame);
  absl::StrAppend(&s, Axes(frame, p, &x, y));
  absl::StrAppend(&s, absl::StrFormat("<g class=\"data\" fill=\"%s\">", HtmlEscape(color)));
  for (size_t i = 0; i < heights.size() && i + 1 < edges.size(); ++i) {
    const double a = x.Map(edges[i], p.x0, p.x1), b = x.Map(edges[i + 1], p.x0, p.x1);
    const double top = y.Map(heights[i], p.y0, p.y1);
    absl::StrAppend(&s,
                    absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\"/>", Num(a),
                                    Num(top), Num(std::max(0.5, b - a - 0.5)), Num(p.y0 - top)));
  }
  absl::StrAppend(&s, "</g>\n");
  for (size_t i = 0; i < markers.size(); ++i) {
    const double px = x.Map(markers[i].x, p.x0, p.x1);
    absl::StrAppend(
        &s, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333\" "
                            "stroke-dasharray=\"4 3\"/><text x=\"%s\" y=\"%s\" font-size=\"11\" "
                            "text-anchor=\"middle\">%s</text>\n",
                            Num(px), Num(p.y1), Num(px), Num(p.y0), Num(px),
                            Num(p.y1 - 6 - 12.0 * (i % 2)), HtmlEscape(markers[i].label)));
  }
  if (heights.empty()) absl::StrAppend(&s, NoData(p));
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

std::string StackedBarChart(const Frame& frame, const Axis& y,
                            const std::vector<std::string>& categories,
                            const std::vector<std::string>& names,
                            const std::vector<std::string>& colors,
                            const std::vector<std::vector<double>>& values,
                            const std::vector<std::string>& bar_labels) {
  const Plot p(frame);
  std::string s = Open(frame);
  absl::StrAppend(&s, Axes(frame, p, nullptr, y));
  const double slot = (p.x1 - p.x0) / std::max<size_t>(1, categories.size());
  const double width = std::min(60.0, slot * 0.6);
  std::string labels;
  absl::StrAppend(&s, "<g class=\"data\">");
  for (size_t c = 0; c < categories.size(); ++c) {
    const double cx = p.x0 + slot * (c + 0.5);
    double base = 0;
    for (size_t k = 0; k < values.size(); ++k) {
      const double v = c < values[k].size() ? std::max(0.0, values[k][c]) : 0;
      const double top = y.Map(base + v, p.y0, p.y1), bottom = y.Map(base, p.y0, p.y1);
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" "
                                          "fill=\"%s\"/>",
                                          Num(cx - width / 2), Num(top), Num(width),
                                          Num(bottom - top), HtmlEscape(colors[k])));
      base += v;
    }
    if (c < bar_labels.size()) {
      absl::StrAppend(&labels, absl::StrFormat("<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" "
                                               "font-size=\"11\">%s</text>\n",
                                               Num(cx), Num(p.y0 + 31), HtmlEscape(bar_labels[c])));
    }
    absl::StrAppend(&labels,
                    absl::StrFormat("<text x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n",
                                    Num(cx), Num(p.y0 + 16), HtmlEscape(categories[c])));
  }
  absl::StrAppend(&s, "</g>\n", labels);
  if (categories.empty()) absl::StrAppend(&s, NoData(p));
  absl::StrAppend(&s, Legend(p, names, colors, /*lines=*/false), "</svg>\n");
  return s;
}

}  // namespace attnserve::bench
