// Gives memory kept between calls back to the system once the server has been idle: the
// backend's per-thread scratch (kernels::Backend::ReleaseIdleMemory) and the allocator's free
// pages (base/allocator.h: AllocatorReleaseFreeMemory). Not per request: while calls keep
// coming, what one call freed serves the next without faulting its pages in again
// (docs/operations.md, "Memory").
//
// Idle means: no call open, and none opened, for `idle`. The releaser then releases once, and
// again only after a call has come and gone. Thread-safe; time is injected (tests drive a
// FakeClock).
#ifndef ATTNSERVE_SERVER_CORE_IDLE_RELEASE_H_
#define ATTNSERVE_SERVER_CORE_IDLE_RELEASE_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/batching/clock.h"

namespace attnserve::server {

class IdleReleaser {
 public:
  // What the releaser reads of the server: calls open now, and calls ever opened.
  struct Activity {
    int64_t open = 0;
    int64_t opened = 0;
  };

  // Looks at `activity` every idle / 4 (at least every 10 ms of `clock`) and calls `release`
  // on its own thread once the server has been idle for `idle`. REQUIRES idle > 0.
  IdleReleaser(absl::Duration idle, batching::Clock* clock, std::function<Activity()> activity,
               std::function<void()> release);
  // Stops the thread (a release under way finishes first).
  ~IdleReleaser();

  // Releases done so far.
  int64_t releases() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  const absl::Duration idle_;
  batching::Clock* const clock_;
  const std::function<Activity()> activity_;
  const std::function<void()> release_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_IDLE_RELEASE_H_
