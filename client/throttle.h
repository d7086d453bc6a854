// Client-side adaptive throttling (Google's SRE book, "Handling Overload"), the same as the
// Python and Node.js clients' (client/python/attnserve/throttle.py, client/node/throttle.js;
// all three pass tests/testing/throttle_cases.json).
//
// A client keeps, over a sliding window (30 s by default, as 1-second buckets), `requests`:
// every throttled call the application attempted, including those the ratio below rejected here
// (not those a pushback held back), and `accepts`: those the server accepted. Before sending a
// call it rejects it locally with probability
//
//     p = min(max_probability, max(0, (requests - k * accepts) / (requests + 1)))
//
// (k = 2 and max_probability = 0.95 by default). While the server accepts at least one call in
// k, p stays 0; when it refuses most, the client sheds the excess itself, before it costs the
// server anything, yet keeps sending a fraction, so that it notices the server's recovery.
//
// That fraction is at least 1 - max_probability of the calls attempted (as in Envoy's admission
// control). Without the cap (the SRE book's formula, max_probability = 1) a throttle that saw
// most of its first calls fail (a fresh client's burst, a server's cold start) sent so few that
// it took longer than a 15-20 s overload to learn that the server had recovered: goodput swung
// between 0.01 and 0.8 of capacity from one run to the next (tests/bench/OVERLOAD.md). With it,
// at least 5% go out, so a collapsed throttle reopens within seconds; the price is that beyond
// 1 / (1 - max_probability) = 20 times a server's capacity the callers no longer shed enough by
// themselves, and the server's own refusals take the rest.
//
// Accepted is every answer but UNAVAILABLE and DEADLINE_EXCEEDED (overload, shutdown, a
// refusal at arrival, a deadline that passed): INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED
// and the rest show a server able to take and judge the call, and a caller's own bad requests
// must never make it throttle itself. A failed answer carrying the trailer
// grpc-retry-pushback-ms (a non-negative integer; the server's overload refusals send it) also
// holds back every throttled call until that many milliseconds have passed.
//
// A sent call is counted when its answer comes (Record), so that calls in flight weigh
// nothing; a call rejected by the ratio when it is rejected (Check). A call held back by a
// pushback is not counted: the server never judged it, and counting it as refused made every
// pushback raise p for the whole window after it (one pushback of seconds under a CPU quota
// closed the throttle for the rest of the phase: OVERLOAD.md).
#ifndef ATTNSERVE_CLIENT_THROTTLE_H_
#define ATTNSERVE_CLIENT_THROTTLE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace attnserve {

// The trailer of gRPC's retry pushback (gRFC A6).
inline constexpr char kPushbackKey[] = "grpc-retry-pushback-ms";

struct ThrottleOptions {
  // Default: on. Off, the throttle never rejects and counts nothing.
  bool enabled = true;
  // A call is rejected locally with probability max(0, (requests - k * accepts) /
  // (requests + 1)). REQUIRES: finite, >= 1. Default: 2 (lower sheds sooner).
  double k = 2.0;
  // The sliding window the counts cover, in whole seconds. REQUIRES: >= 1. Default: 30.
  int window_seconds = 30;
  // The most p can be: at least 1 - max_probability of the calls are sent, so that a throttle
  // that has closed notices the server's recovery. REQUIRES: 0 < max_probability <= 1 (1: the
  // SRE book's formula, uncapped). Default: 0.95.
  double max_probability = 0.95;
};

// INVALID_ARGUMENT naming the field and value when `options` break a REQUIRES above (checked
// also when disabled: a bad k is a bug either way).
absl::Status ValidateThrottleOptions(const ThrottleOptions& options);

// Whether an answer with `code` counts as accepted by the server: every code but UNAVAILABLE and
// DEADLINE_EXCEEDED.
bool IsAccept(absl::StatusCode code);

// The milliseconds of a grpc-retry-pushback-ms value, or nullopt unless it is a non-negative
// decimal integer that fits in 63 bits (gRPC's core rewrites a value it cannot parse as a
// negative one).
std::optional<int64_t> ParsePushback(std::string_view value);

// Whether `status` is a rejection by a client's own throttle (UNAVAILABLE, never sent), as
// opposed to the server's.
bool IsThrottledByClient(const absl::Status& status);

// Whether `status` is one of those rejections made while a server's retry pushback lasts (the
// call held back whatever the throttle's odds), as opposed to one drawn from the odds.
bool IsHeldByPushback(const absl::Status& status);

// Thread-safe: one per client, shared by its threads (with several replicas, one for all).
class Throttle {
 public:
  // clock: seconds, monotonic (default: std::chrono::steady_clock); rand: uniform in [0, 1)
  // (default: a per-throttle std::mt19937_64 seeded from std::random_device). Both are for
  // tests: a fake clock and fake draws make every decision deterministic.
  static absl::StatusOr<std::unique_ptr<Throttle>> Create(const ThrottleOptions& options,
                                                          std::function<double()> clock = nullptr,
                                                          std::function<double()> rand = nullptr);

  const ThrottleOptions& options() const { return options_; }

  // Before a throttled call: nullopt to send it, or why it is rejected locally (counted as a
  // request when the ratio rejects it, not when a pushback holds it back). Draws from rand only
  // when p > 0 and no pushback is in force.
  std::optional<std::string> Check() ABSL_LOCKS_EXCLUDED(mu_);
  // A sent call's answer: its code and, for a failure, the value of its grpc-retry-pushback-ms
  // trailer (empty: none).
  void Record(absl::StatusCode code, std::string_view pushback = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // The probability that a call made now is rejected by the ratio (a pushback in force rejects
  // every call whatever this says).
  double Probability() const ABSL_LOCKS_EXCLUDED(mu_);
  // (requests, accepts) in the window now.
  std::pair<int64_t, int64_t> Counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Throttle(const ThrottleOptions& options, std::function<double()> clock,
           std::function<double()> rand);
  void Add(int64_t second, bool accepted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::pair<int64_t, int64_t> CountsAt(int64_t second) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double P(int64_t requests, int64_t accepts) const;

  const ThrottleOptions options_;
  const std::function<double()> clock_;
  const std::function<double()> rand_;  // called under mu_
  mutable Mutex mu_;
  // A ring: slot s % window holds second s's counts while seconds_[slot] == s.
  std::vector<int64_t> seconds_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> accepts_ ABSL_GUARDED_BY(mu_);
  double pushback_until_ ABSL_GUARDED_BY(mu_);
  int64_t pushback_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_THROTTLE_H_
