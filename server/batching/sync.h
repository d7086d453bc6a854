// A mutex and a condition variable for the batcher: std::mutex and std::condition_variable
// under Abseil's thread-safety annotations.
//
// Why not absl::Mutex: Debian's Abseil is built without ThreadSanitizer, so TSan cannot see
// absl::Mutex's synchronisation (its lock and unlock run in uninstrumented code) and reports
// every access it guards as a race. std::mutex goes through pthreads, which TSan intercepts,
// so the batcher and its tests stay checkable under -DATTNSERVE_SANITIZE=thread. The wrappers
// exist only to carry the annotations (libstdc++'s std::mutex has none).
//
// Thread-safety: thread-safe (they are the synchronisation).
#ifndef ATTNSERVE_SERVER_BATCHING_SYNC_H_
#define ATTNSERVE_SERVER_BATCHING_SYNC_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve::batching {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the static analysis that the caller holds the lock (not checked at run time).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu`, waits for a notification (or a spurious wake-up), and takes `mu` again.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held; the caller's annotation says so
  }

  // Like Wait(), but returns at the latest at `deadline` on the wall clock (absl::Now()).
  // Returns true when the deadline passed, false on a notification or a spurious wake-up.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == absl::InfiniteFuture()) {
      Wait(mu);
      return false;
    }
    // Past a year the conversion could overflow inside the standard library; nobody waits
    // that long without being woken.
    deadline = std::min(deadline, absl::Now() + absl::Hours(24 * 365));
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out =
        cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_SYNC_H_
