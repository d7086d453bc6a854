#include "server/batching/clock.h"

#include "absl/time/clock.h"

namespace attnserve::batching {

absl::Time RealClock::Now() { return absl::Now(); }

void RealClock::WaitUntil(Mutex* mu, CondVar* cv, absl::Time deadline) {
  cv->WaitWithDeadline(mu, deadline);
}

}  // namespace attnserve::batching
