// Time, injected. The batcher never reads the wall clock directly: it asks a Clock for the time
// and waits through it, so tests drive time with a FakeClock (server/batching/fake_clock.h)
// and see every dispatch decision happen at an exact, chosen instant.
//
// Thread-safety: implementations are thread-safe.
#ifndef ATTNSERVE_SERVER_BATCHING_CLOCK_H_
#define ATTNSERVE_SERVER_BATCHING_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace attnserve::batching {

class Clock {
 public:
  virtual ~Clock() = default;

  // The current time on this clock.
  virtual absl::Time Now() = 0;

  // Releases `mu` and blocks until `cv` is notified or Now() >= `deadline` on this clock (or
  // spuriously), then takes `mu` again. REQUIRES: `mu` is held and is the mutex `cv` is
  // notified under. Callers re-check their condition in a loop, as with any condition
  // variable. A deadline of absl::InfiniteFuture() waits for a notification alone.
  virtual void WaitUntil(Mutex* mu, CondVar* cv, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// The wall clock: absl::Now() and the condition variable's own timed wait.
class RealClock final : public Clock {
 public:
  absl::Time Now() override;
  void WaitUntil(Mutex* mu, CondVar* cv, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_CLOCK_H_
