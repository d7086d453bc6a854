// FOR TESTS ONLY. A Clock whose time moves only when the test says so.
//
// Production code takes a Clock* and never names this class; it lives next to clock.h only so
// that tests of every folder can use it without a separate testing library. It is header-only
// and is compiled into nothing but the tests that include it.
//
// Typical use, with a batcher whose max_queue_delay is 10 ms:
//
//   FakeClock clock;
//   ... Schedule a task at clock.Now() == t0 ...
//   ASSERT_TRUE(clock.BlockUntilWaiting(t0 + absl::Milliseconds(10)));  // the worker sleeps
//   clock.Advance(absl::Milliseconds(10));                              // ... and wakes
//
// Thread-safety: thread-safe.
#ifndef ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_
#define ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_

#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/batching/clock.h"

namespace attnserve::batching {

class FakeClock final : public Clock {
 public:
  // Starts at a fixed, arbitrary instant so that test output does not depend on the wall clock.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() override {
    MutexLock lock(&mu_);
    return now_;
  }

  // Moves time forward by `d`. REQUIRES: d >= 0.
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

  // Sets the time to `t`. REQUIRES: t >= Now().
  void SetTime(absl::Time t) {
    MutexLock lock(&mu_);
    now_ = t;
  }

  void WaitUntil(Mutex* mu, CondVar* cv, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override {
    // Lock order: the caller's `mu`, then this clock's mu_; nothing here takes them the other
    // way round.
    {
      MutexLock lock(&mu_);
      waiting_.insert(deadline);
      registered_.NotifyAll();
    }
    // Advance() cannot notify `cv`: without taking the caller's `mu` (which would invert the
    // lock order) a notification could fall between the caller's check and its wait and be
    // lost. So the waiter polls instead: it returns after at most kPollInterval of real time
    // (a spurious wake-up, which the contract allows), and the caller re-checks everything,
    // fake time included. What the caller decides depends on fake time alone; the poll only
    // bounds how soon it notices. (Looping here instead would lose a notification that
    // arrives between two polls.)
    if (Now() < deadline) cv->WaitWithDeadline(mu, absl::Now() + kPollInterval);
    MutexLock lock(&mu_);
    waiting_.erase(waiting_.find(deadline));
  }

  // Blocks, for at most `timeout` of real time, until some thread waits in WaitUntil with
  // exactly `deadline`. Returns whether one did. Tests call this to know that a batch thread
  // has gone to sleep until `deadline`, that is, has decided what to do until then.
  bool BlockUntilWaiting(absl::Time deadline, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time give_up = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (waiting_.count(deadline) == 0) {
      if (registered_.WaitWithDeadline(&mu_, give_up)) return waiting_.count(deadline) > 0;
    }
    return true;
  }

 private:
  static constexpr absl::Duration kPollInterval = absl::Milliseconds(1);

  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // The deadlines of the threads now in WaitUntil.
  std::multiset<absl::Time> waiting_ ABSL_GUARDED_BY(mu_);
  CondVar registered_;  // notified when a thread enters WaitUntil
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_
