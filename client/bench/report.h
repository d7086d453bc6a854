// A whole attnserve-bench run as one document: the settings, the server's GetServerInfo, the
// client machine and every phase (summary, latency histogram, per-second series). Written as
// JSON; the HTML report is drawn from that JSON, so a saved run can be redrawn later
// (attnserve-bench --html_from=run.json --html=run.html).
#ifndef ATTNSERVE_CLIENT_BENCH_REPORT_H_
#define ATTNSERVE_CLIENT_BENCH_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
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

// --- Request-size sweeps (a serving-overhead curve) ---
//
// A sweep measures, for a range of request sizes, the CPU each server process spends per call
// beside the backend's own compute CPU for the same problem (no gRPC) and the CPU of the echo
// server (client/bench/echo_server.cc: the same gRPC stack, computing nothing) for the same bytes.
// tests/bench/serving_sweep.py writes it as one JSON document (sizes in bytes, times in
// microseconds unless named _ms):
//
//   {"kind": "attnserve-serving-sweep", "title": "...", "command": "...",
//    "machine": {"cpu": ..., "cores": ..., ...}, "settings": {"target_overhead": 1.25, ...},
//    "servers": ["attnserve", "echo", "a0c8747"],
//    "points": [{"rpc": "attend", "shape": "1,8,128,64", "request_bytes": 786432,
//                "response_bytes": 262144, "callers": 1, "backend_cpu_us": 290.1,
//                "servers": {"attnserve": {"ok": 4000, "errors": 0, "req_per_s": 800.5,
//                                          "cpu_us_per_call": 1100.2, "faults_per_call": 0.7,
//                                          "p50_ms": 1.1, "p99_ms": 2.0}, "echo": {...}, ...},
//                "overhead": 1.42}, ...]}
//
// attnserve-bench --sweep_from=sweep.json --html=sweep.html draws it (SweepToHtml).

// One server's figures at one point. A measured value written as null (no call succeeded, say)
// is nullopt here and reads "n/a" on the page.
struct SweepServer {
  int64_t ok = 0;
  int64_t errors = 0;
  std::optional<double> req_per_s;
  std::optional<double> cpu_us_per_call;
  std::optional<double> faults_per_call;
  std::optional<double> p50_ms;
  std::optional<double> p99_ms;
};

// One request size (rpc and shape) with one number of concurrent callers.
struct SweepPoint {
  std::string rpc;    // "attend", "mha", ...
  std::string shape;  // "1,8,128,64"
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  int64_t callers = 1;
  double backend_cpu_us = 0;
  // The servers measured at this point, by name; one whose leg failed (or did not run) is absent.
  std::map<std::string, SweepServer> servers;
  // servers[0]'s cpu_us_per_call / (backend_cpu_us + echo's cpu_us_per_call), as the file gives
  // it; nullopt when the file has none (null or absent: no echo, or no server under test).
  std::optional<double> overhead;
  // The lowest and highest of the rounds' overheads when the point was measured in several
  // rounds (serving_sweep.py --rounds: overhead is then their median); nullopt when the file has
  // none.
  std::optional<std::pair<double, double>> overhead_range;
};

struct Sweep {
  std::string title;    // "" when the file has none
  std::string command;  // "" when the file has none
  nlohmann::ordered_json machine = nlohmann::ordered_json::object();
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();
  double target_overhead = 0;  // settings.target_overhead
  // The server columns in order: [0] is the server under test; "echo" the echo server; any other
  // is a baseline (another build of the server, named by its commit, say).
  std::vector<std::string> servers;
  std::vector<SweepPoint> points;  // as the file orders them
  // The whole document as read (fields this code does not know included): embedded in the page.
  nlohmann::ordered_json document = nlohmann::ordered_json::object();
};

// Reads and checks a sweep document. Required: "kind" == "attnserve-serving-sweep";
// "settings"."target_overhead" > 0; "servers", a non-empty array of distinct non-empty names,
// the first not "echo"; "points", a non-empty array of objects, each with "rpc" (non-empty
// string), "shape" (string), "request_bytes" (integer >= 1), "response_bytes" (integer >= 0),
// "callers" (integer >= 1), "backend_cpu_us" (number >= 0), "servers" (an object whose keys are
// names from "servers"; an entry may be absent or null: not measured) and optionally "overhead"
// (number >= 0 or null). Each server entry needs "ok" and "errors" (integers >= 0) and
// "req_per_s", "cpu_us_per_call", "faults_per_call", "p50_ms", "p99_ms" (numbers >= 0, or null).
// Optional, but typed when present: "title" and "command" (strings), "machine" (object).
// Unknown fields are kept (in `document`) and otherwise ignored. The numbers are not checked
// against each other (overhead is drawn as given). On the first problem: INVALID_ARGUMENT whose
// message starts with the field's path and says what is wrong, e.g.
//   points[3].servers.echo.cpu_us_per_call: missing
//   kind: expected "attnserve-serving-sweep", got "attnserve-bench-run"
//   points: empty: nothing was measured
// (text that is not JSON: "the sweep is not valid JSON (at byte N)"). Never throws.
absl::StatusOr<Sweep> ParseSweep(absl::string_view text);

// A self-contained HTML page (inline SVG and CSS, nothing executed, nothing fetched), styled as
// ToHtml's: the title; the worst overhead in one sentence ("Worst overhead 1.42 at attend
// [1,8,128,64] (768 KiB), 1 caller; ...") and how many points exceed the target; what the sweep
// measures; the machine, the command and the settings. Then one section per (rpc, callers)
// group, attend before mha before any other rpc, fewer callers first, points by request size:
// CPU per call against request size (log-log: each server, the backend, backend + echo dashed);
// the overhead ratio of the server under test, and of each baseline (its CPU / (backend + echo)),
// against the target (dashed); page faults per call; and a table (overheads above the target in
// class "over", bold). Servers missing at some points are named under each group. The document
// rides along in <script type="application/json" id="attnserve-sweep-data">.
std::string SweepToHtml(const Sweep& sweep);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_REPORT_H_
