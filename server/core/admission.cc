#include "server/core/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/batching/pushback.h"

namespace attnserve::server {

absl::Status AdmissionGate::Admit(absl::Time now, absl::Time deadline) {
  int64_t ahead;
  absl::Duration wait, interval;
  const absl::Duration allowed = kTimeoutShare * (deadline - now);
  {
    MutexLock lock(&mu_);
    // A busy period starts: the idle time before it is no interval between answers.
    if (in_flight_ == 0) last_ = now;
    ahead = in_flight_;
    interval = interval_;
    wait = (in_flight_ + 1) * interval_;
    if (in_flight_ == 0 || wait <= allowed) {
      ++in_flight_;
      return absl::OkStatus();
    }
  }
  // The retry pushback: about when a call with as much time left would be admitted (enough of
  // the calls ahead answered), at least one interval. Not until all of them are answered: a
  // client's throttle holds back every call for the pushback, and the server would go idle.
  return batching::WithPushback(
      absl::DeadlineExceededError(absl::StrCat(
          "the server would answer in about ", absl::FormatDuration(wait), " (", ahead,
          " calls ahead), too close to the deadline; refused before the request was read")),
      std::max(wait - allowed, interval));
}

void AdmissionGate::Done(absl::Time now) {
  MutexLock lock(&mu_);
  const absl::Duration sample = std::max(now - last_, absl::ZeroDuration());
  interval_ =
      interval_ == absl::ZeroDuration() ? sample : (1 - kWeight) * interval_ + kWeight * sample;
  last_ = now;
  --in_flight_;
}

int64_t AdmissionGate::in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

absl::Duration AdmissionGate::interval() const {
  MutexLock lock(&mu_);
  return interval_;
}

}  // namespace attnserve::server
