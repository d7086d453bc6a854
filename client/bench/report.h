// A whole attnserve-bench run as one document: the settings, the server's GetServerInfo, the
// client machine and every phase (summary, latency histogram, per-second series). Written as
// JSON; the HTML report is drawn from that JSON, so a saved run can be redrawn later
// (attnserve-bench --html_from=run.json --html=run.html).
#ifndef ATTNSERVE_CLIENT_BENCH_REPORT_H_
#define ATTNSERVE_CLIENT_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/bench/stats.h"
#include "nlohmann/json.hpp"

namespace attnserve::bench {

struct RunReport {
  // The run's settings (flags and derived values such as mean_flops), a JSON object.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  // GetServerInfoResponse in proto3 JSON with the proto's field names (version, backends with
  // their devices, limits, batching), a JSON object.
  nlohmann::ordered_json server = nlohmann::ordered_json::object();
  // The client machine (DescribeMachine()), a JSON object.
  nlohmann::ordered_json machine = nlohmann::ordered_json::object();
  std::vector<PhaseReport> phases;
};

// {"config": {...}, "server": {...}, "machine": {...}, "phases": [{...}, ...]}, one phase per
// line. Numbers keep 6 significant digits. Each phase holds its PhaseReport fields by name, with
// "latency_histogram": {"bins_per_decade", "first_bin", "counts": [...]} and "series": {"t_s",
// "width_s", "sent", "ok", "errors", "p99_ms"} (parallel arrays).
std::string ToJson(const RunReport& report);

// Reads what ToJson wrote. INVALID_ARGUMENT when the text is not JSON, not an object, or has no
// "phases" array of objects. Missing fields read as zero or empty (older files have no
// histogram or series; their charts say "no data").
absl::StatusOr<RunReport> ParseJsonReport(absl::string_view text);

// Now in UTC as ISO 8601, e.g. "2026-12-01T06:52:58Z" (config's started_utc).
std::string UtcTimestamp();

// The machine this process runs on: cpu_model (/proc/cpuinfo), logical_cores, memory_bytes
// (/proc/meminfo), os (uname). Fields that cannot be read are left out.
nlohmann::ordered_json DescribeMachine();

// A self-contained HTML page (inline SVG and CSS, nothing executed, nothing fetched): the phase
// table; latency percentiles against achieved throughput (the knee); the mean latency split into
// server queue, compute and the rest; a latency histogram per phase on a log axis; sent, OK and
// error rates and p99 second by second; the settings, server and machine; and the JSON itself
// in a <script type="application/json" id="attnserve-bench-data"> element.
std::string ToHtml(const RunReport& report);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_REPORT_H_
