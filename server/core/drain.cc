#include "server/core/drain.h"

#include <algorithm>

namespace attnserve::server {

void Drain::CallOpened() {
  MutexLock lock(&mu_);
  ++open_;
  ++opened_;
}

void Drain::CallClosed() {
  MutexLock lock(&mu_);
  if (--open_ == 0) changed_.NotifyAll();
}

IdleReleaser::Activity Drain::activity() const {
  MutexLock lock(&mu_);
  return {open_, opened_};
}

bool Drain::BeginRead() {
  MutexLock lock(&mu_);
  ++reading_;
  // Under mu_: a Begin whose AwaitReads took mu_ before this saw no read of ours, and its
  // store of draining_ (before that) is visible here.
  return draining();
}

void Drain::EndRead() {
  MutexLock lock(&mu_);
  if (--reading_ == 0) changed_.NotifyAll();
}

bool Drain::Join(Listener* listener) {
  MutexLock lock(&listeners_mu_);
  if (draining()) return true;
  listeners_.insert(listener);
  return false;
}

void Drain::Leave(Listener* listener) {
  MutexLock lock(&listeners_mu_);
  listeners_.erase(listener);
}

void Drain::Begin() {
  MutexLock lock(&listeners_mu_);
  draining_.store(true, std::memory_order_release);
  for (Listener* listener : listeners_) listener->OnDrain();
  listeners_.clear();
}

void Drain::AwaitReads(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (reading_ > 0 && !cut_ && absl::Now() < deadline) {
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

int64_t Drain::AwaitNoCalls(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (open_ > 0 && absl::Now() < std::min(deadline, calls_deadline_)) {
    changed_.WaitWithDeadline(&mu_, std::min(deadline, calls_deadline_));
  }
  return open_;
}

void Drain::Cut(absl::Time calls_deadline) {
  MutexLock lock(&mu_);
  cut_ = true;
  calls_deadline_ = std::min(calls_deadline_, calls_deadline);
  changed_.NotifyAll();
}

}  // namespace attnserve::server
