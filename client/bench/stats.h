// What attnserve-bench records for each request and how a phase is summarised: throughput,
// latency percentiles, the server's own queue/compute split (from each response's Timing) and
// errors by code; rendered as text, JSON and CSV.
#ifndef ATTNSERVE_CLIENT_BENCH_STATS_H_
#define ATTNSERVE_CLIENT_BENCH_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace attnserve::bench {

// One completed request. Latency runs from the INTENDED send time (open loop: the schedule's
// time, even when the client was late; closed loop: the actual send) to the completion.
struct Sample {
  double latency_us = 0;
  int code = 0;           // canonical gRPC code; 0 = OK; kThrottledCode, kHeldByPushbackCode:
                          // the client's own throttle rejected it (--throttle), never sent
  int64_t queued_us = 0;  // the server's Timing (OK responses only)
  int64_t compute_us = 0;
  int64_t server_us = 0;
  int32_t batch_size = 0;
  uint32_t item = 0;         // index into the Workload
  int64_t intended_ns = 0;   // NowNs() of the intended send (the latency's start)
  int64_t completed_ns = 0;  // NowNs() of the completion (the latency's end)
};

// Thread-safe: Record from any thread (gRPC completion threads), Take from the driver.
class Recorder {
 public:
  void Record(const Sample& s) {
    MutexLock lock(&mu_);
    samples_.push_back(s);
  }
  // The samples so far (copied; for the progress line).
  std::vector<Sample> Copy() const {
    MutexLock lock(&mu_);
    return samples_;
  }
  size_t Count() const {
    MutexLock lock(&mu_);
    return samples_.size();
  }
  std::vector<Sample> Take() {
    MutexLock lock(&mu_);
    return std::move(samples_);
  }

 private:
  mutable Mutex mu_;
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
};

// Nearest-rank percentiles (p = 50 -> the value at rank ceil(0.5 * n)) and the mean.
struct Distribution {
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};
Distribution Summarise(std::vector<double> values);

// Latencies binned on a log scale, bins_per_decade to a factor of 10: bin k holds values in
// [10^(k / bins_per_decade), 10^((k + 1) / bins_per_decade)) milliseconds, so with 10 bins per
// decade bin 0 is [1, 1.259) ms and bin -10 is [0.1, 0.126) ms. Only the bins from the first to
// the last non-empty one are kept.
struct LogHistogram {
  int bins_per_decade = 10;
  int first_bin = 0;
  std::vector<int64_t> counts;  // counts[i]: bin first_bin + i
  double LowerMs(int i) const;  // edges of counts[i]
  double UpperMs(int i) const;
  int64_t Total() const;
};
// The bin of `value_ms`; values under 1 ns count as 1 ns.
int LogBin(double value_ms, int bins_per_decade);
LogHistogram MakeLogHistogram(const std::vector<double>& values_ms, int bins_per_decade = 10);

// What happened second by second in one phase: requests sent (by intended send time),
// completions OK and not OK, and the p99 latency of the completions (by completion time).
// Bucket i starts t_s[i] seconds after the phase start and lasts width_s[i]; the last bucket
// absorbs a remainder shorter than half a bucket, so no rate comes from a sliver of time.
struct TimeSeries {
  std::vector<double> t_s;
  std::vector<double> width_s;
  std::vector<int64_t> sent;
  std::vector<int64_t> ok;
  std::vector<int64_t> errors;
  std::vector<double> p99_ms;  // 0 where nothing completed
  size_t size() const { return t_s.size(); }
};
// Buckets of `bucket_s` seconds over [start_ns, end_ns] (steady-clock NowNs() times). Samples
// outside the interval count in the nearest bucket. REQUIRES: bucket_s > 0.
TimeSeries Bucketize(const std::vector<Sample>& samples, int64_t start_ns, int64_t end_ns,
                     double bucket_s = 1);

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
  double start_s = 0;              // phase start, seconds after the first phase's start
  LogHistogram latency_histogram;  // every completed request's latency
  TimeSeries series;               // t_s counted from the first phase's start
};

// Sample::code of a call the client's throttle rejected (client/throttle.h): counted apart from
// the server's UNAVAILABLE, as "THROTTLED_BY_CLIENT".
inline constexpr int kThrottledCode = 100;
// Sample::code of a call held back by that throttle while a server's retry pushback lasted
// (client/throttle.h, IsHeldByPushback): "HELD_BY_PUSHBACK", apart from the rejections drawn
// from the throttle's odds.
inline constexpr int kHeldByPushbackCode = 101;

// The canonical name of a gRPC code ("OK", "UNAVAILABLE", ...), "THROTTLED_BY_CLIENT" or
// "HELD_BY_PUSHBACK".
std::string CodeName(int code);

// Summarises one phase. `tokens`/`flops` give each workload item's worth.
PhaseReport Summarise(const std::vector<Sample>& samples, const std::vector<int64_t>& tokens,
                      const std::vector<double>& flops, double elapsed_s, double send_window_s);

// Renderings: a human table, and CSV with one header line and one line per phase (the JSON
// document and the HTML report are in report.h).
std::string ToText(const std::vector<PhaseReport>& phases);
std::string ToCsv(const std::vector<PhaseReport>& phases);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_STATS_H_
