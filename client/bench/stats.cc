#include "client/bench/stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

std::string CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return kNames[code];
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

std::string JsonDistribution(const Distribution& d) {
  return absl::StrFormat(
      "{\"p50\": %.6g, \"p90\": %.6g, \"p99\": %.6g, \"p999\": %.6g, \"max\": %.6g, "
      "\"mean\": %.6g}",
      d.p50, d.p90, d.p99, d.p999, d.max, d.mean);
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

std::string ToJson(const std::string& config_json, const std::vector<PhaseReport>& phases) {
  std::vector<std::string> items;
  for (const PhaseReport& p : phases) {
    std::vector<std::string> errors;
    for (const auto& [code, n] : p.errors) errors.push_back(absl::StrCat("\"", code, "\": ", n));
    items.push_back(absl::StrFormat(
        "{\"name\": \"%s\", \"level_kind\": \"%s\", \"level\": %.6g, \"elapsed_s\": %.6g, "
        "\"send_window_s\": %.6g, \"sent\": %d, \"ok\": %d, \"errors\": {%s}, "
        "\"requests_per_s\": %.6g, \"sent_per_s\": %.6g, \"tokens_per_s\": %.6g, "
        "\"gflops_per_s\": %.6g, \"latency_ms\": %s, \"server_ms\": %s, "
        "\"queued_ms_mean\": %.6g, \"compute_ms_mean\": %.6g, \"batch_size_mean\": %.6g}",
        p.name, p.level_kind, p.level, p.elapsed_s, p.send_window_s, p.sent, p.ok,
        absl::StrJoin(errors, ", "), p.requests_per_s, p.sent_per_s, p.tokens_per_s, p.gflops_per_s,
        JsonDistribution(p.latency_ms), JsonDistribution(p.server_ms), p.queued_ms_mean,
        p.compute_ms_mean, p.batch_size_mean));
  }
  return absl::StrCat("{\"config\": ", config_json, ",\n \"phases\": [\n  ",
                      absl::StrJoin(items, ",\n  "), "\n]}\n");
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
