// Admission of unary compute calls (Attend, MultiHeadAttention) when their headers arrive,
// before their requests are read: by Little's law, from what the whole server has shown it can
// do, not from the backend's compute time alone.
//
// Why: under a CPU quota the backend's compute is a small part of a call's cost; receiving,
// parsing and answering it are most of it (tests/bench/OVERLOAD.md). The batcher's cost model
// (compute time per token) saw a short queue while hundreds of calls were being uploaded, so it
// admitted them all, and nearly all expired. The gate counts the calls it has admitted and not
// yet answered (`in_flight`) and measures the time between answers while the server is busy
// (`interval`, an exponential average): a new call would be answered after about
// (in_flight + 1) x interval, and a call for which that is more than kTimeoutShare of the time
// left to its deadline is refused at once, costing the server its headers only. With nothing in
// flight a call is always admitted, so the gate cannot starve the server, and a short deadline
// never locks the gate shut.
#ifndef ATTNSERVE_SERVER_CORE_ADMISSION_H_
#define ATTNSERVE_SERVER_CORE_ADMISSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace attnserve::server {

// Thread-safe. Time is passed in (tests drive it).
class AdmissionGate {
 public:
  // Weight of each new interval in the average: about the last 1/kWeight answers count. 0.05
  // averages over about two 100 ms periods of a CPU quota (one burst of answers each).
  static constexpr double kWeight = 0.05;
  // Of the time left to a call's deadline, the share its expected wait may take. The rest is for
  // what the server does not see: the caller's deadline runs from before the call's headers were
  // read, and the answer still has to travel, both late under a tight CPU quota. With the whole
  // time left (1.0), many answers sent as OK reached their callers after their deadline; with
  // half, none did, and goodput under overload was far higher (tests/bench/OVERLOAD.md has the
  // figures and the command).
  static constexpr double kTimeoutShare = 0.5;

  // OK: admitted, and Done() must follow once. DEADLINE_EXCEEDED: (in_flight + 1) x interval
  // is more than kTimeoutShare x (deadline - now) (refused; no Done()), with a retry pushback
  // (server/batching/pushback.h) of the difference, at least one interval: about when a call
  // with as much time left would be admitted.
  absl::Status Admit(absl::Time now, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // An admitted call is answered (whatever the answer).
  void Done(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration interval() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last answer was given, or the first call of a busy period admitted.
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Zero until the first answer.
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_ADMISSION_H_
