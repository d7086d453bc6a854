// The load attnserve-bench applies: closed loop (N callers, each sending its next request when
// the previous one completes) or open loop (requests at intended times, constant or Poisson,
// whether or not earlier ones have completed), over a schedule of levels (one phase per level:
// a step schedule, or a ramp cut into equal steps), after an unreported warm-up.
//
// No coordinated omission: in open loop a request's latency is measured from its intended send
// time, so a client that falls behind (or a server that stalls) shows up in the latencies
// instead of silently lowering the offered rate.
#ifndef ATTNSERVE_CLIENT_BENCH_LOAD_H_
#define ATTNSERVE_CLIENT_BENCH_LOAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/bench/stats.h"
#include "client/bench/workload.h"
#include "client/client.h"

namespace attnserve::bench {

struct LoadOptions {
  Rpc rpc = Rpc::kAttend;
  enum class Mode { kClosed, kOpen } mode = Mode::kClosed;
  enum class Arrival { kConstant, kPoisson } arrival = Arrival::kConstant;
  // One phase per level: callers (closed loop) or requests/s (open loop). REQUIRES non-empty.
  std::vector<double> levels = {1};
  // Each phase lasts phase_duration, or sends phase_requests when that is positive.
  absl::Duration phase_duration = absl::Seconds(10);
  int64_t phase_requests = 0;
  // Load at the first level before the first phase; its results are discarded.
  absl::Duration warmup = absl::Seconds(1);
  // Deadline of each unary call.
  absl::Duration timeout = absl::Seconds(60);
  // Streams (rpc = kStream): one per channel; requests spread over them in turn.
  int streams = 1;
  // rpc = kDecode: the sessions stepped (prefilled by the caller, who also closes them) and
  // the tokens each holds. A step goes to a session with no step in flight; when every
  // session is busy it waits for the first to come free (the wait counts in its latency), so
  // a session never gets two steps at once.
  std::vector<std::string> session_ids;
  std::vector<int64_t> session_lengths;
  // Open loop: requests outstanding at most; the sender waits (and the wait counts in the
  // latency, measured from the intended time) beyond it. Default: 100000.
  int64_t max_in_flight = 100000;
  uint64_t seed = 1;
  // Print a progress line (with '\r') to stdout every second.
  bool progress = false;
};

// Runs the schedule. Not thread-safe; one Run at a time.
class Driver {
 public:
  Driver(Client& client, const Workload& workload, const LoadOptions& options);
  ~Driver();
  std::vector<PhaseReport> Run();

 private:
  using Done = std::function<void(const Sample&)>;
  struct Phase;
  class StreamPool;
  class DecodePool;
  // Sends workload item `item`; `done` gets the sample, latency from `intended`.
  void Issue(size_t item, int64_t intended_ns, Done done);
  PhaseReport RunPhase(const std::string& name, double level, bool warmup);
  void RunClosed(Phase& phase, int callers);
  void RunOpen(Phase& phase, double rate);

  Client& client_;
  const Workload& workload_;
  const LoadOptions options_;
  std::unique_ptr<StreamPool> streams_;
  std::unique_ptr<DecodePool> decode_;
  int64_t run_start_ns_ = 0;  // NowNs() at the first reported phase's start
};

// Monotonic nanoseconds (steady clock).
int64_t NowNs();

// Levels of a ramp from `from` to `to` in `steps` equal steps (both ends included).
std::vector<double> RampLevels(double from, double to, int steps);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_LOAD_H_
