#include "server/core/idle_release.h"

#include <algorithm>
#include <utility>

namespace attnserve::server {

IdleReleaser::IdleReleaser(absl::Duration idle, batching::Clock* clock,
                           std::function<Activity()> activity, std::function<void()> release)
    : idle_(idle),
      clock_(clock),
      activity_(std::move(activity)),
      release_(std::move(release)),
      thread_([this] { Run(); }) {}

IdleReleaser::~IdleReleaser() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

int64_t IdleReleaser::releases() const {
  MutexLock lock(&mu_);
  return releases_;
}

void IdleReleaser::Run() {
  const absl::Duration period = std::max(idle_ / 4, absl::Milliseconds(10));
  int64_t opened_seen = activity_().opened;
  // The first look of the current quiet stretch (every call had ended by then, so the server has
  // been idle at least since), or InfiniteFuture while a call is open or one just arrived.
  absl::Time quiet_since = absl::InfiniteFuture();
  bool released = true;  // a fresh server holds nothing worth releasing
  MutexLock lock(&mu_);
  while (!stopping_) {
    // A look happens only once `period` has passed on the clock: WaitUntil may return early
    // (spuriously, or a FakeClock's poll), and a look before its time would see a call that
    // arrived since the last look one period too soon.
    const absl::Time next = clock_->Now() + period;
    while (!stopping_ && clock_->Now() < next) clock_->WaitUntil(&mu_, &cv_, next);
    if (stopping_) break;
    const Activity now = activity_();
    const absl::Time t = clock_->Now();
    if (now.open > 0 || now.opened != opened_seen) {
      opened_seen = now.opened;
      quiet_since = absl::InfiniteFuture();
      released = false;
      continue;
    }
    if (quiet_since == absl::InfiniteFuture()) quiet_since = t;
    if (released || t - quiet_since < idle_) continue;
    released = true;
    ++releases_;
    mu_.Unlock();  // the release takes the backend's and the allocator's time, not ours
    release_();
    mu_.Lock();
  }
}

}  // namespace attnserve::server
