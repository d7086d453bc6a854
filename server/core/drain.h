// The server's drain: one object the host owns (ServerHost), holding all that a drain waits on.
//
//   calls     the AttentionService calls gRPC has open, from the moment a call reaches its
//             handler until gRPC destroys it after its status went out. Counted by the host's
//             interceptor, which sees every call whatever its handler does, so a drain knows when
//             every answer is out without trusting each handler to say so. The one count of
//             what is in flight on the server (the IdleReleaser reads it too).
//   reads     those compute calls admitted before the drain whose request is still being read:
//             they are handed to the dispatcher before it stops taking work, so that they are
//             computed within the grace period instead of refused after their callers were
//             counted as served.
//   listeners the open streams: told when the drain begins (idle ones end at once, busy ones
//             once their requests are answered), which would otherwise hold the exit until the
//             grace period ended.
//
// The host's steps (ServerHost::Shutdown): Begin(), AwaitReads(), the dispatcher's own
// shutdown, AwaitNoCalls(); a second signal calls Cut(). Thread-safe; nothing here blocks
// except the Await* calls.
#ifndef ATTNSERVE_SERVER_CORE_DRAIN_H_
#define ATTNSERVE_SERVER_CORE_DRAIN_H_

#include <atomic>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/core/idle_release.h"

namespace attnserve::server {

class Drain {
 public:
  // What hears of the drain's beginning (an open stream). OnDrain is called at most once, with
  // no lock of the listener's held by the caller; it must not call Join or Leave.
  class Listener {
   public:
    virtual void OnDrain() = 0;

   protected:
    ~Listener() = default;
  };

  // --- Calls: the host's interceptor ---
  void CallOpened() ABSL_LOCKS_EXCLUDED(mu_);
  void CallClosed() ABSL_LOCKS_EXCLUDED(mu_);
  // Calls open now and calls ever opened (the IdleReleaser's idea of activity).
  IdleReleaser::Activity activity() const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Reads: a compute call from its admission to the hand-over of its request ---
  // Counts a read and returns whether the drain had begun then, in one step: a call that finds
  // it not begun is waited for by AwaitReads, so it may be served; one that finds it begun must
  // be refused (and its read ended). (Asking draining() later could refuse a call the drain was
  // already waiting for.)
  [[nodiscard]] bool BeginRead() ABSL_LOCKS_EXCLUDED(mu_);
  void EndRead() ABSL_LOCKS_EXCLUDED(mu_);

  // --- Listeners ---
  // True: the drain has begun, and the listener was not joined (it must end at once).
  bool Join(Listener* listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  // No-op for one not joined. Waits for an OnDrain of it in progress.
  void Leave(Listener* listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);

  // Whether the drain has begun (new compute calls are refused UNAVAILABLE).
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // --- The host's steps ---
  // The drain begins: draining() from now on, and every listener's OnDrain (under the lock, so
  // that no listener is deleted meanwhile: Leave waits).
  void Begin() ABSL_LOCKS_EXCLUDED(listeners_mu_);
  // Waits until no read is in progress, `deadline` passes, or Cut().
  void AwaitReads(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no call is open or `deadline` passes (or Cut's deadline, if sooner); returns
  // how many calls are still open.
  int64_t AwaitNoCalls(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // The grace period is cut short (a second signal): AwaitReads returns now, AwaitNoCalls by
  // `calls_deadline` at the latest, also when either is waiting already. May precede Begin.
  void Cut(absl::Time calls_deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<bool> draining_{false};
  mutable Mutex mu_;
  CondVar changed_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reading_ ABSL_GUARDED_BY(mu_) = 0;
  bool cut_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time calls_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Apart from mu_: a listener's OnDrain may end a call, whose end the interceptor counts
  // (CallClosed takes mu_).
  Mutex listeners_mu_;
  absl::flat_hash_set<Listener*> listeners_ ABSL_GUARDED_BY(listeners_mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_DRAIN_H_
