// The one mutex type of attnserve: a mutex, its scoped lock and a condition variable, under
// Abseil's thread-safety annotations, so that clang's -Wthread-safety checks every guarded
// member (scripts/test-sanitizers.sh's clang build has it with -Werror).
//
// Typical use:
//
//   class Counter {  // thread-safe
//    public:
//     void Add(int n) {
//       MutexLock lock(&mu_);
//       total_ += n;
//       changed_.NotifyAll();
//     }
//     void AwaitAtLeast(int n) {
//       MutexLock lock(&mu_);
//       while (total_ < n) changed_.Wait(&mu_);
//     }
//    private:
//     Mutex mu_;
//     int total_ ABSL_GUARDED_BY(mu_) = 0;
//     CondVar changed_;
//   };
//
// Conditions are re-checked in a loop (a lambda predicate would be invisible to the analysis,
// which does not know that the lambda runs with the lock held).
//
// Why not absl::Mutex: Debian's Abseil is built without ThreadSanitizer, so TSan cannot see
// absl::Mutex synchronise (its lock and unlock run in uninstrumented code) and reports every
// access it guards as a race. std::mutex goes through pthreads, which TSan intercepts. The
// wrappers exist to carry the annotations (libstdc++'s std::mutex has none, and clang rejects
// ABSL_GUARDED_BY naming a type that is not a capability).
//
// Thread-safety: thread-safe (they are the synchronisation).
#ifndef ATTNSERVE_BASE_MUTEX_H_
#define ATTNSERVE_BASE_MUTEX_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the static analysis that the caller holds the lock (not checked at run time).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to the end of the scope.
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
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

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

  // Like WaitWithDeadline(absl::Now() + timeout).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitWithDeadline(mu, absl::Now() + timeout);
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_MUTEX_H_
