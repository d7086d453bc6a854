// What attnserve-bench records for each request and how a phase is summarised: throughput,
// latency percentiles, the server's own queue/compute split (from each response's Timing) and
// errors by code; rendered as text, JSON and CSV.
#ifndef ATTNSERVE_CLIENT_BENCH_STATS_H_
#define ATTNSERVE_CLIENT_BENCH_STATS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace attnserve::bench {

// One completed request. Latency runs from the INTENDED send time (open loop: the schedule's
// time, even when the client was late; closed loop: the actual send) to the completion.
struct Sample {
  double latency_us = 0;
  int code = 0;           // canonical gRPC code; 0 = OK
  int64_t queued_us = 0;  // the server's Timing (OK responses only)
  int64_t compute_us = 0;
  int64_t server_us = 0;
  int32_t batch_size = 0;
  uint32_t item = 0;  // index into the Workload
};

// Thread-safe: Record from any thread (gRPC completion threads), Take from the driver.
class Recorder {
 public:
  void Record(const Sample& s) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(s);
  }
  // The samples so far (copied; for the progress line).
  std::vector<Sample> Copy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }
  size_t Count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_.size();
  }
  std::vector<Sample> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(samples_);
  }

 private:
  mutable std::mutex mu_;
  std::vector<Sample> samples_;
};

// Nearest-rank percentiles (p = 50 -> the value at rank ceil(0.5 * n)) and the mean.
struct Distribution {
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};
Distribution Summarise(std::vector<double> values);

struct PhaseReport {
  std::string name;          // "warmup" is never reported; "step 1", ...
  std::string level_kind;    // "concurrency" or "rate"
  double level = 0;          // callers, or requests/s offered
  double elapsed_s = 0;      // first intended send to last completion
  double send_window_s = 0;  // first to last intended send (open loop: the offered window)
  int64_t sent = 0;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // by canonical code name
  double requests_per_s = 0;              // OK responses / elapsed
  double sent_per_s = 0;       // requests sent / send window (open loop: the achieved rate)
  double tokens_per_s = 0;     // B*Lq of OK responses / elapsed
  double gflops_per_s = 0;     // nominal dense FLOPs of OK responses / elapsed / 1e9
  Distribution latency_ms;     // every completed request, OK or not
  Distribution server_ms;      // Timing.server_us of OK responses
  double queued_ms_mean = 0;   // Timing.queued_us, mean
  double compute_ms_mean = 0;  // Timing.compute_us, mean
  double batch_size_mean = 0;
};

// The canonical name of a gRPC code ("OK", "UNAVAILABLE", ...).
std::string CodeName(int code);

// Summarises one phase. `tokens`/`flops` give each workload item's worth.
PhaseReport Summarise(const std::vector<Sample>& samples, const std::vector<int64_t>& tokens,
                      const std::vector<double>& flops, double elapsed_s, double send_window_s);

// Renderings: a human table, a JSON document ({"config": ..., "phases": [...]}) with `config`
// a JSON object given as text, and CSV with one header line and one line per phase.
std::string ToText(const std::vector<PhaseReport>& phases);
std::string ToJson(const std::string& config_json, const std::vector<PhaseReport>& phases);
std::string ToCsv(const std::vector<PhaseReport>& phases);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_STATS_H_
