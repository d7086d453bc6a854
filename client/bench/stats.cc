#include "client/bench/stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_codes.h"

namespace attnserve::bench {

Distribution Summarise(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  auto rank = [&](double p) {
    // The epsilon keeps 99.9% of 1000 at rank 999 despite 0.999 * 1000 rounding up.
    const size_t r = static_cast<size_t>(std::ceil(p / 100.0 * v.size() - 1e-9));
    return v[std::clamp<size_t>(r, 1, v.size()) - 1];
  };
  d.p50 = rank(50);
  d.p90 = rank(90);
  d.p99 = rank(99);
  d.p999 = rank(99.9);
  d.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / v.size();
  return d;
}

double LogHistogram::LowerMs(int i) const {
  return std::pow(10.0, static_cast<double>(first_bin + i) / bins_per_decade);
}

double LogHistogram::UpperMs(int i) const { return LowerMs(i + 1); }

int64_t LogHistogram::Total() const {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

int LogBin(double value_ms, int bins_per_decade) {
  const double v = std::max(value_ms, 1e-6);
  auto edge = [&](int k) { return std::pow(10.0, static_cast<double>(k) / bins_per_decade); };
  int k = static_cast<int>(std::floor(std::log10(v) * bins_per_decade));
  // log10 may land a hair off at a bin edge (10^0.3 is not exact): settle on the edges.
  while (v < edge(k)) --k;
  while (v >= edge(k + 1)) ++k;
  return k;
}

LogHistogram MakeLogHistogram(const std::vector<double>& values_ms, int bins_per_decade) {
  LogHistogram h;
  h.bins_per_decade = bins_per_decade;
  if (values_ms.empty()) return h;
  std::vector<int> bins;
  bins.reserve(values_ms.size());
  for (double v : values_ms) bins.push_back(LogBin(v, bins_per_decade));
  const auto [lo, hi] = std::minmax_element(bins.begin(), bins.end());
  h.first_bin = *lo;
  h.counts.assign(*hi - *lo + 1, 0);
  for (int b : bins) ++h.counts[b - h.first_bin];
  return h;
}

TimeSeries Bucketize(const std::vector<Sample>& samples, int64_t start_ns, int64_t end_ns,
                     double bucket_s) {
  TimeSeries ts;
  const double length_s = std::max(0.0, (end_ns - start_ns) / 1e9);
  // Whole buckets, plus the remainder as its own bucket only when at least half a bucket long.
  int n = static_cast<int>(std::floor(length_s / bucket_s + 1e-9));
  if (length_s - n * bucket_s >= bucket_s / 2 || n == 0) ++n;
  for (int i = 0; i < n; ++i) {
    ts.t_s.push_back(i * bucket_s);
    ts.width_s.push_back(i + 1 < n ? bucket_s : std::max(length_s - i * bucket_s, 1e-9));
  }
  ts.sent.assign(n, 0);
  ts.ok.assign(n, 0);
  ts.errors.assign(n, 0);
  ts.p99_ms.assign(n, 0);
  auto index = [&](int64_t t_ns) {
    const double t = (t_ns - start_ns) / 1e9 / bucket_s;
    return std::clamp(static_cast<int>(std::floor(t)), 0, n - 1);
  };
  std::vector<std::vector<double>> latencies(n);
  for (const Sample& s : samples) {
    ++ts.sent[index(s.intended_ns)];
    const int i = index(s.completed_ns);
    ++(s.code == 0 ? ts.ok : ts.errors)[i];
    latencies[i].push_back(s.latency_us / 1e3);
  }
  for (int i = 0; i < n; ++i) ts.p99_ms[i] = Summarise(std::move(latencies[i])).p99;
  return ts;
}

std::string CodeName(int code) {
  if (code == kThrottledCode) return "THROTTLED_BY_CLIENT";
  if (code == kHeldByPushbackCode) return "HELD_BY_PUSHBACK";
  const std::string_view name = StatusCodeName(code);
  if (!name.empty()) return std::string(name);
  return absl::StrCat("CODE_", code);
}

PhaseReport Summarise(const std::vector<Sample>& samples, const std::vector<int64_t>& tokens,
                      const std::vector<double>& flops, double elapsed_s, double send_window_s) {
  PhaseReport r;
  r.elapsed_s = elapsed_s;
  r.send_window_s = send_window_s;
  r.sent = static_cast<int64_t>(samples.size());
  std::vector<double> latency_ms, server_ms;
  double tok = 0, fl = 0, queued = 0, compute = 0, batch = 0;
  for (const Sample& s : samples) {
    latency_ms.push_back(s.latency_us / 1e3);
    if (s.code != 0) {
      ++r.errors[CodeName(s.code)];
      continue;
    }
    ++r.ok;
    server_ms.push_back(s.server_us / 1e3);
    tok += tokens[s.item];
    fl += flops[s.item];
    queued += s.queued_us / 1e3;
    compute += s.compute_us / 1e3;
    batch += s.batch_size;
  }
  if (elapsed_s > 0) {
    r.requests_per_s = r.ok / elapsed_s;
    r.tokens_per_s = tok / elapsed_s;
    r.gflops_per_s = fl / elapsed_s / 1e9;
  }
  if (send_window_s > 0) r.sent_per_s = r.sent / send_window_s;
  r.latency_histogram = MakeLogHistogram(latency_ms);
  r.latency_ms = Summarise(std::move(latency_ms));
  r.server_ms = Summarise(std::move(server_ms));
  if (r.ok > 0) {
    r.queued_ms_mean = queued / r.ok;
    r.compute_ms_mean = compute / r.ok;
    r.batch_size_mean = batch / r.ok;
  }
  return r;
}

namespace {

std::string Errors(const PhaseReport& p, const char* sep, const char* kv) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : p.errors) parts.push_back(absl::StrCat(code, kv, n));
  return absl::StrJoin(parts, sep);
}

}  // namespace

std::string ToText(const std::vector<PhaseReport>& phases) {
  std::string out = absl::StrFormat(
      "%-8s %12s %9s %9s %7s %10s %11s %9s %9s %9s %9s %9s %9s | %9s %9s %9s %6s  %s\n", "phase",
      "level", "sent", "ok", "errors", "req/s", "tokens/s", "GFLOP/s", "p50 ms", "p90 ms", "p99 ms",
      "p99.9 ms", "max ms", "srv p50", "queue ms", "compute", "batch", "errors by code");
  for (const PhaseReport& p : phases) {
    absl::StrAppend(
        &out,
        absl::StrFormat("%-8s %12s %9d %9d %7d %10.1f %11.0f %9.2f %9.3f %9.3f %9.3f %9.3f %9.3f | "
                        "%9.3f %9.3f %9.3f %6.2f  %s\n",
                        p.name,
                        absl::StrFormat("%s=%g", p.level_kind == "rate" ? "rate" : "conc", p.level),
                        p.sent, p.ok, p.sent - p.ok, p.requests_per_s, p.tokens_per_s,
                        p.gflops_per_s, p.latency_ms.p50, p.latency_ms.p90, p.latency_ms.p99,
                        p.latency_ms.p999, p.latency_ms.max, p.server_ms.p50, p.queued_ms_mean,
                        p.compute_ms_mean, p.batch_size_mean, Errors(p, " ", "=")));
  }
  return out;
}

std::string ToCsv(const std::vector<PhaseReport>& phases) {
  std::string out =
      "phase,level_kind,level,elapsed_s,sent,ok,errors,requests_per_s,sent_per_s,tokens_per_s,"
      "gflops_per_s,p50_ms,p90_ms,p99_ms,p999_ms,max_ms,mean_ms,server_p50_ms,server_p99_ms,"
      "queued_ms_mean,compute_ms_mean,batch_size_mean,errors_by_code\n";
  for (const PhaseReport& p : phases) {
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "%s,%s,%g,%.6g,%d,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,"
            "%.6g,%.6g,%.6g,%s\n",
            p.name, p.level_kind, p.level, p.elapsed_s, p.sent, p.ok, p.sent - p.ok,
            p.requests_per_s, p.sent_per_s, p.tokens_per_s, p.gflops_per_s, p.latency_ms.p50,
            p.latency_ms.p90, p.latency_ms.p99, p.latency_ms.p999, p.latency_ms.max,
            p.latency_ms.mean, p.server_ms.p50, p.server_ms.p99, p.queued_ms_mean,
            p.compute_ms_mean, p.batch_size_mean, Errors(p, ";", "=")));
  }
  return out;
}

}  // namespace attnserve::bench
