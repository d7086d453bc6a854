// A dynamic batcher, in the shape of TensorFlow Serving's shared batch scheduler: callers
// Schedule() tasks under a signature key; batch threads pack tasks of one key into batches and
// hand each batch to process_batch. Start here; the rules a batch forms by are in
// batch_queue.h, the options and counters in batcher_options.h, the task concept in
// batch_task.h.
//
// Contract
//   Schedule(key, &task) never blocks: it holds the batcher's lock for a few hundred
//   instructions and never waits for a batch thread. It takes ownership of *task only when it
//   returns OK (then *task is null); on any other code *task is left with the caller, who
//   answers its request with that code. Codes:
//     UNAVAILABLE         the queue is full (max_queued_requests tasks queued) or the task's
//                         bytes would take the queue over max_queued_bytes; or Shutdown() has
//                         started. Abseil's guidance is "use UNAVAILABLE if the client can
//                         retry just the failing call", and here it can: a full queue is a
//                         transient overload that the same call passes after a backoff (or on
//                         another replica, for shutdown). RESOURCE_EXHAUSTED ("a per-user
//                         quota, or the entire file system is out of space") reads as a limit
//                         the caller has hit, which a retry does not change; false here.
//     RESOURCE_EXHAUSTED  the task alone is larger than max_queued_bytes: no retry can pass.
//     DEADLINE_EXCEEDED   the task's deadline had already passed, or the queue ahead of it
//                         would outlast it: the cost model's Estimate(queued tokens + its own)
//                         divided by num_batch_threads reaches past the deadline. Refusing at
//                         arrival answers at once what would otherwise expire in the queue,
//                         after holding a place there that a task able to finish could use.
//     CANCELLED           the task was already cancelled.
//     INVALID_ARGUMENT    a null task, or negative num_tokens() / num_bytes().
//   The optional `why` says which (DropReason, batch_queue.h), so that counters need not parse
//   codes. A full queue first tries to make room by fair share (batch_policy.h): the newest task
//   of the heaviest owner is then rejected (UNAVAILABLE, DropReason::kFairShare) and the new
//   task admitted. The refusals a wait can help (a full queue, the byte budget, a fair-share
//   shed, a queue that would outlast the deadline; not Shutdown()) carry a retry pushback
//   (pushback.h): the cost model's estimate of the queue ahead divided by num_batch_threads.
//
//   Every task the batcher takes goes to exactly one of the two callbacks, exactly once:
//     process_batch(key, batch)  a non-empty batch, all of `key`, at most max_batch_requests
//                                tasks and (unless it is one task) at most max_batch_tokens
//                                tokens, in arrival order. Runs on a batch thread. It answers
//                                every task of the batch, also when the backend fails.
//     reject(task, status, why)  a task that will not be computed: DEADLINE_EXCEEDED (its
//                                deadline passed while queued), CANCELLED (cancelled while
//                                queued), UNAVAILABLE (still queued when Shutdown()'s grace
//                                period ended, or shed for fair share). Runs on a batch thread,
//                                or on the thread that called NotifyCancelled(), Shutdown() or
//                                the destructor; and inside Schedule() for a task of another
//                                owner shed to make room (after the lock is released), so
//                                Schedule() must not be called holding a lock that reject takes.
//   Callbacks may run concurrently with each other. They may call Schedule(),
//   stats(); they must not call NotifyCancelled(), Shutdown() or destroy the batcher.
//
// Expiry and cancellation
//   A task whose deadline is <= now, or whose IsCancelled() is true, when its batch forms is
//   rejected instead of computed. A batch whose tasks have deadlines leaves early enough for
//   them (cost_model.h). Cancelled tasks also leave the queue at once: after a task's
//   IsCancelled() becomes true, call NotifyCancelled(); it sweeps every queue on the calling
//   thread and rejects what is cancelled there, so a cancellation takes effect even while every
//   batch thread is busy computing (one pass over the queued tasks, so call it once per
//   cancellation, not in a loop). Expired tasks are removed when their batch forms; in a queue
//   that is not backlogged that is before their deadline anyway. (A gRPC server learns of an
//   expired deadline as a cancellation, so it can use the same path for both.)
//
// RunNowOrSchedule(key, &task): where a task would be computed at once anyway (nothing queued,
//   a batch thread free, max_queue_delay zero), the calling thread computes it, as a batch of its
//   own: the caller pays the computation instead of two thread hops (to a batch thread and back),
//   which cost more than a tiny request's arithmetic (tests/bench/SERVING.md). It counts as one
//   of the num_batch_threads batches computed at once while it runs. Otherwise it is Schedule().
//   Blocks for the computation: for callers whose tasks are cheap. An overload takes the
//   function that computes the task here (instead of process_batch), so that the caller can
//   answer it after the slot is free again.
//
// Shutdown(grace): Schedule() refuses new tasks from then on (UNAVAILABLE); batch threads send
//   everything queued at once, without waiting for max_queue_delay, until the queues are empty
//   or `grace` (on the batcher's clock) has passed; what is still queued then goes to reject
//   with UNAVAILABLE; the batch threads are joined. Returns when all of that is done, which is
//   after the grace period when a process_batch call runs longer than it. The destructor calls
//   Shutdown(absl::ZeroDuration()); call Shutdown() first for a graceful drain.
//   EndGracePeriod() ends the grace period now, from another thread, also before or during
//   Shutdown(): a drain cut short (attnserve's second SIGTERM).
//
// Thread-safety: thread-safe. Every method may be called from any thread, except as the
// callbacks section says.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCHER_H_
#define ATTNSERVE_SERVER_BATCHING_BATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/batching/batch_policy.h"
#include "server/batching/batch_queue.h"
#include "server/batching/batch_task.h"
#include "server/batching/batcher_options.h"
#include "server/batching/clock.h"
#include "server/batching/cost_model.h"
#include "server/batching/pushback.h"

namespace attnserve::batching {

// Key: the signature tasks must share to be batched together (copyable, hashable with Hash,
// compared with Eq); for attention, dtype, heads, head dims, module and kernel-changing options.
template <typename Key, BatchTask Task, typename Hash = absl::Hash<Key>,
          typename Eq = std::equal_to<Key>>
class Batcher {
 public:
  using Batch = std::vector<std::unique_ptr<Task>>;
  using ProcessBatchFn = std::function<void(const Key& key, Batch batch)>;
  using RejectFn =
      std::function<void(std::unique_ptr<Task> task, absl::Status status, DropReason why)>;

  // Validates `options` (batcher_options.h) and starts options.num_batch_threads threads.
  // INVALID_ARGUMENT names the bad option and its value, or a missing callback.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(const BatcherOptions& options,
                                                         ProcessBatchFn process_batch,
                                                         RejectFn reject) {
    if (absl::Status status = ValidateBatcherOptions(options); !status.ok()) return status;
    if (!process_batch) return absl::InvalidArgumentError("process_batch must be set; was empty");
    if (!reject) return absl::InvalidArgumentError("reject must be set; was empty");
    std::unique_ptr<Batcher> batcher(
        new Batcher(options, std::move(process_batch), std::move(reject)));
    batcher->Start(options.num_batch_threads);
    return batcher;
  }

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  ~Batcher() { Shutdown(absl::ZeroDuration()); }

  // See the contract above. When it refuses, `*why` (if not null) says why.
  absl::Status Schedule(const Key& key, std::unique_ptr<Task>* task, DropReason* why = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_) {
    DropReason ignored = DropReason::kInvalid;
    if (why == nullptr) why = &ignored;
    *why = DropReason::kInvalid;
    if (task == nullptr || *task == nullptr) {
      return RefuseInvalid("Schedule needs a task; got null", why);
    }
    const Task& t = **task;
    QueuedTask<Task> queued{nullptr, static_cast<int64_t>(t.num_tokens()),
                            static_cast<int64_t>(t.num_bytes()), t.deadline(), absl::Time()};
    if constexpr (requires { t.owner(); }) queued.owner = static_cast<uint64_t>(t.owner());
    if (queued.tokens < 0) {
      return RefuseInvalid(absl::StrCat("task num_tokens() must be >= 0; was ", queued.tokens),
                           why);
    }
    if (queued.bytes < 0) {
      return RefuseInvalid(absl::StrCat("task num_bytes() must be >= 0; was ", queued.bytes), why);
    }
    Admission admission;
    int64_t queued_requests = 0, queued_bytes = 0, queued_tokens = 0;
    absl::Duration needed, drain;
    std::optional<QueuedTask<Task>> shed;
    bool slot_free = true;
    {
      MutexLock lock(&mu_);
      queued.enqueued = clock_->Now();
      if (const std::optional<DropReason> why_not = Undeliverable(t, queued.enqueued)) {
        *why = *why_not;
        if (*why_not == DropReason::kCancelled) {
          ++stats_.refused_cancelled;
          return absl::CancelledError("the call was cancelled before it was queued");
        }
        ++stats_.refused_expired;
        return absl::DeadlineExceededError("the deadline passed before the request was queued");
      }
      if (draining_) {
        ++stats_.refused_shutdown;
        *why = DropReason::kShutdown;
        return absl::UnavailableError("the server is shutting down; retry on another replica");
      }
      // Refused at arrival rather than left to expire in the queue: the queue ahead, at the
      // measured cost per token, would outlast the deadline.
      if (queued.deadline != absl::InfiniteFuture()) {
        needed = cost_model_->Estimate(policy_.queued_tokens() + queued.tokens) / num_threads_;
        if (queued.enqueued + needed > queued.deadline) {
          ++stats_.refused_unmeetable;
          *why = DropReason::kUnmeetable;
          queued_requests = policy_.queued_requests();
          queued_tokens = policy_.queued_tokens();
        }
      }
      admission =
          *why == DropReason::kUnmeetable ? Admission::kUnmeetable : policy_.CanAdmit(queued.bytes);
      if (admission == Admission::kQueueFull) {
        QueuedTask<Task> victim;
        if (policy_.ShedFor(queued.owner, &victim)) {
          ++stats_.shed;
          shed = std::move(victim);
          admission = policy_.CanAdmit(queued.bytes);
        }
      }
      if (admission == Admission::kOk) {
        queued.task = std::move(*task);
        policy_.Add(key, std::move(queued));
        ++stats_.scheduled;
        slot_free = computing_ < num_threads_;
      } else {
        if (admission == Admission::kQueueFull) {
          ++stats_.refused_queue_full;
        } else if (admission != Admission::kUnmeetable) {
          ++stats_.refused_bytes;
        }
        queued_requests = policy_.queued_requests();
        queued_bytes = policy_.queued_bytes();
      }
      // How long the queue ahead takes to drain: the refused caller's retry pushback.
      if (admission != Admission::kOk) {
        drain = cost_model_->Estimate(policy_.queued_tokens()) / num_threads_;
      }
    }
    if (shed.has_value()) {
      // Outside the lock. The shed task belongs to another owner than the caller's.
      reject_(std::move(shed->task),
              WithPushback(absl::UnavailableError(
                               "the batch queue is full and shared fairly between connections; "
                               "this connection held more than its share; retry with backoff"),
                           drain),
              DropReason::kFairShare);
    }
    if (admission == Admission::kOk) {
      // One idle batch thread recomputes when the head batch is due. Notified after the lock is
      // released, so that the woken thread does not block at once on a mutex still held here;
      // no wake-up is lost, since a thread checks the queues under the lock before it waits.
      // With every slot computing there is no idle thread to wake (a woken one would wait again
      // for a slot): whoever frees one looks at the queues then.
      if (slot_free) work_cv_.NotifyOne();
      return absl::OkStatus();
    }
    // The message is built after the lock is released: it allocates, and overload is exactly
    // when the lock is most contended.
    switch (admission) {
      case Admission::kQueueFull:
        *why = DropReason::kQueueFull;
        return WithPushback(
            absl::UnavailableError(absl::StrCat("batch queue full: ", queued_requests,
                                                " requests queued (max_queued_requests ",
                                                max_queued_requests_, "); retry with backoff")),
            drain);
      case Admission::kOverByteBudget:
        *why = DropReason::kQueueBytes;
        return WithPushback(
            absl::UnavailableError(absl::StrCat(
                "batch queue memory over budget: ", queued_bytes, " bytes queued + ", queued.bytes,
                " > max_queued_bytes ", max_queued_bytes_, "; retry with backoff")),
            drain);
      case Admission::kUnmeetable:
        return WithPushback(absl::DeadlineExceededError(absl::StrCat(
                                "the queue ahead (", queued_requests, " requests, ", queued_tokens,
                                " tokens) needs about ", absl::FormatDuration(needed),
                                ", longer than the deadline allows; refused without queueing")),
                            drain);
      default:
        *why = DropReason::kTooLarge;
        return absl::ResourceExhaustedError(absl::StrCat(
            "the request needs ", queued.bytes,
            " bytes of queue memory, more than max_queued_bytes (", max_queued_bytes_, ") allows"));
    }
  }

  // See the contract above. Returns OK when the task was taken (computed here, or queued), else
  // what Schedule() returns. `*why` as for Schedule().
  absl::Status RunNowOrSchedule(const Key& key, std::unique_ptr<Task>* task,
                                DropReason* why = nullptr) ABSL_LOCKS_EXCLUDED(mu_) {
    return RunNowOrSchedule(key, task, process_batch_, why);
  }
  // The same, but a task computed here goes to `compute_here` (on this thread) instead of
  // process_batch. It takes the batch, so the caller owns the answer: compute_here may answer it
  // or keep it for the caller to answer after this returns (the dispatcher does). The slot is
  // held only while compute_here runs, so answering afterwards frees the slot for the next task
  // while the answer is sent (sending costs a tiny request more than its arithmetic:
  // tests/bench/SERVING.md).
  absl::Status RunNowOrSchedule(const Key& key, std::unique_ptr<Task>* task,
                                absl::FunctionRef<void(const Key& key, Batch batch)> compute_here,
                                DropReason* why = nullptr) ABSL_LOCKS_EXCLUDED(mu_) {
    if (task == nullptr || *task == nullptr || !run_now_allowed_) return Schedule(key, task, why);
    const Task& t = **task;
    const int64_t tokens = static_cast<int64_t>(t.num_tokens());
    const int64_t bytes = static_cast<int64_t>(t.num_bytes());
    // Every refusal is Schedule()'s, with its reasons and counters.
    if (tokens < 0 || bytes < 0 || bytes > max_queued_bytes_) return Schedule(key, task, why);
    bool run_here;
    {
      MutexLock lock(&mu_);
      const absl::Time now = clock_->Now();
      // Where Schedule() would queue the task behind others, refuse it, or have a batch thread
      // wait for company, it does.
      run_here = !draining_ && policy_.empty() && computing_ < num_threads_ &&
                 !Undeliverable(t, now).has_value() &&
                 (t.deadline() == absl::InfiniteFuture() ||
                  now + cost_model_->Estimate(tokens) / num_threads_ <= t.deadline());
      if (run_here) {
        ++computing_;
        ++stats_.scheduled;
        ++stats_.batches;
        ++stats_.processed;
        ++stats_.ran_on_caller;
      }
    }
    if (!run_here) return Schedule(key, task, why);
    if (why != nullptr) *why = DropReason::kInvalid;
    Batch batch;
    batch.push_back(std::move(*task));
    const absl::Time start = clock_->Now();
    compute_here(key, std::move(batch));
    const absl::Duration elapsed = clock_->Now() - start;
    bool queued;
    bool idle_draining;
    {
      MutexLock lock(&mu_);
      if (tokens > 0) cost_model_->Record(tokens, elapsed);
      --computing_;
      queued = !policy_.empty();
      idle_draining = draining_ && computing_ == 0;
    }
    // A batch thread may be waiting for this slot; Shutdown() may wait for the last one.
    if (queued) work_cv_.NotifyOne();
    if (idle_draining) drained_cv_.NotifyAll();
    return absl::OkStatus();
  }

  // Rejects every queued task that is cancelled, on this thread (see the contract). Holds the
  // lock only for one pass over the queued tasks; never waits for a batch thread.
  void NotifyCancelled() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<DroppedTask<Task>> dropped;
    bool drained;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;  // Shutdown() answers whatever is left
      policy_.RemoveCancelled(&dropped);
      stats_.cancelled += static_cast<int64_t>(dropped.size());
      drained = policy_.empty();
    }
    // Outside the lock, as in Run(): reject may call back into the batcher.
    if (drained && !dropped.empty()) drained_cv_.NotifyAll();
    for (DroppedTask<Task>& d : dropped) {
      reject_(std::move(d.queued.task),
              absl::CancelledError("the call was cancelled while the request was queued"),
              DropReason::kCancelled);
    }
  }

  // See the contract above. Later calls return at once; must not be called from a callback.
  void Shutdown(absl::Duration grace) ABSL_LOCKS_EXCLUDED(shutdown_mu_, mu_) {
    MutexLock shutdown_lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    std::vector<QueuedTask<Task>> leftovers;
    {
      MutexLock lock(&mu_);
      draining_ = true;
      // Now() + InfiniteDuration() is InfiniteFuture(): wait for the queues alone.
      const absl::Time grace_end = clock_->Now() + grace;
      if (!policy_.empty() && clock_->Now() < grace_end) {
        // Wake every idle thread: everything queued is due now. Notified under the lock, unlike
        // elsewhere, because the lock is held from draining_ to the final sweep; only the wait
        // below releases it, so with a zero grace period no batch leaves after Shutdown().
        work_cv_.NotifyAll();
      }
      while (!policy_.empty() && !grace_ended_ && clock_->Now() < grace_end) {
        clock_->WaitUntil(&mu_, &drained_cv_, grace_end);
      }
      stopping_ = true;
      policy_.PopAll(&leftovers);
      stats_.shut_down += static_cast<int64_t>(leftovers.size());
    }
    work_cv_.NotifyAll();  // idle threads exit
    for (QueuedTask<Task>& t : leftovers) {
      reject_(std::move(t.task),
              absl::UnavailableError("the server shut down before computing the request"),
              DropReason::kShutdown);
    }
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
    // Batches computed by callers (RunNowOrSchedule) end before the batcher may go.
    MutexLock lock(&mu_);
    while (computing_ > 0) drained_cv_.Wait(&mu_);
  }

  // See the contract above. Never blocks.
  void EndGracePeriod() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      grace_ended_ = true;
    }
    drained_cv_.NotifyAll();
  }

  // A snapshot of the counters and gauges.
  BatcherStats stats() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    BatcherStats s = stats_;
    s.queued_requests = policy_.queued_requests();
    s.queued_bytes = policy_.queued_bytes();
    return s;
  }

 private:
  Batcher(const BatcherOptions& options, ProcessBatchFn process_batch, RejectFn reject)
      : owned_clock_(options.clock == nullptr ? std::make_unique<RealClock>() : nullptr),
        clock_(options.clock == nullptr ? owned_clock_.get() : options.clock),
        owned_cost_model_(options.cost_model != nullptr ? options.cost_model
                                                        : std::make_shared<EwmaCostModel>()),
        cost_model_(owned_cost_model_.get()),
        process_batch_(std::move(process_batch)),
        reject_(std::move(reject)),
        max_queued_requests_(options.max_queued_requests),
        max_queued_bytes_(options.max_queued_bytes),
        num_threads_(options.num_batch_threads),
        run_now_allowed_(options.max_queue_delay == absl::ZeroDuration()),
        policy_(BatchLimits{options.max_batch_requests, options.max_batch_tokens,
                            options.max_queue_delay},
                options.max_queued_requests, options.max_queued_bytes) {}

  void Start(int num_threads) ABSL_LOCKS_EXCLUDED(shutdown_mu_) {
    MutexLock shutdown_lock(&shutdown_mu_);
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Run(); });
  }

  absl::Status RefuseInvalid(absl::string_view message, DropReason* why) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    ++stats_.refused_invalid;
    *why = DropReason::kInvalid;
    return absl::InvalidArgumentError(message);
  }

  // A batch thread: takes ready batches until Shutdown() stops it.
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<QueuedTask<Task>> tasks;
    std::vector<DroppedTask<Task>> dropped;
    mu_.Lock();
    while (!stopping_) {
      if (computing_ >= num_threads_) {
        // Every slot is taken, one by a caller computing its own task (RunNowOrSchedule),
        // which notifies when it is done.
        work_cv_.Wait(&mu_);
        continue;
      }
      const absl::Time now = clock_->Now();
      const std::optional<Key> key =
          policy_.PopReadyBatch(now, *cost_model_, draining_, &tasks, &dropped);
      if (!key.has_value() && dropped.empty()) {
        // Nothing to do until the next batch is due, or until a notification (a task
        // scheduled, a cancellation, shutdown).
        clock_->WaitUntil(&mu_, &work_cv_, policy_.NextDispatchTime(*cost_model_, draining_));
        continue;
      }
      for (const DroppedTask<Task>& d : dropped) {
        (d.reason == DropReason::kExpired ? stats_.expired : stats_.cancelled)++;
      }
      const bool computes = !tasks.empty();
      if (computes) {
        ++stats_.batches;
        stats_.processed += static_cast<int64_t>(tasks.size());
        ++computing_;
      }
      const bool drained = policy_.empty();
      const bool more_due = policy_.NextDispatchTime(*cost_model_, draining_) <= now;
      mu_.Unlock();
      // Notifications outside the lock, as in Schedule(). Another batch already due goes to
      // another idle thread rather than waiting for this one to finish.
      if (more_due) work_cv_.NotifyOne();
      if (drained) drained_cv_.NotifyAll();  // Shutdown() may wait for empty queues
      // The callbacks run outside the lock: process_batch is the computation itself, and
      // holding the lock through it would make Schedule() wait for a batch; and callbacks may
      // call back into the batcher (Schedule, stats), which would deadlock.
      for (DroppedTask<Task>& d : dropped) {
        reject_(
            std::move(d.queued.task),
            d.reason == DropReason::kExpired
                ? absl::DeadlineExceededError("the deadline passed while the request was queued")
                : absl::CancelledError("the call was cancelled while the request was queued"),
            d.reason);
      }
      dropped.clear();
      int64_t tokens = 0;
      absl::Duration elapsed;
      if (!tasks.empty()) {
        Batch batch;
        batch.reserve(tasks.size());
        for (QueuedTask<Task>& t : tasks) {
          tokens += t.tokens;
          batch.push_back(std::move(t.task));
        }
        tasks.clear();
        const absl::Time start = clock_->Now();
        process_batch_(*key, std::move(batch));
        elapsed = clock_->Now() - start;
      }
      mu_.Lock();
      if (computes) --computing_;
      if (tokens > 0) cost_model_->Record(tokens, elapsed);
    }
    mu_.Unlock();
  }

  const std::unique_ptr<Clock> owned_clock_;
  Clock* const clock_;
  const std::shared_ptr<BatchCostModel> owned_cost_model_;
  BatchCostModel* const cost_model_ ABSL_PT_GUARDED_BY(mu_);  // not thread-safe itself
  const ProcessBatchFn process_batch_;
  const RejectFn reject_;
  const int64_t max_queued_requests_;
  const int64_t max_queued_bytes_;
  const int num_threads_;
  const bool run_now_allowed_;  // max_queue_delay is zero: RunNowOrSchedule may compute

  // Taken first when both are held: Shutdown() holds it throughout, mu_ inside.
  Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(shutdown_mu_);

  mutable Mutex mu_;
  BatchPolicy<Key, Task, Hash, Eq> policy_ ABSL_GUARDED_BY(mu_);
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
  // Shutdown() has started: refuse new tasks, send queued batches at once.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // EndGracePeriod() was called: Shutdown() stops waiting for the queues to empty.
  bool grace_ended_ ABSL_GUARDED_BY(mu_) = false;
  // The grace period is over: batch threads exit after their current batch.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Batches being computed, by batch threads and by callers (RunNowOrSchedule); at most
  // num_batch_threads.
  int computing_ ABSL_GUARDED_BY(mu_) = 0;
  // Batch threads wait on work_cv_ (work queued, cancellations, shutdown); Shutdown() waits on
  // drained_cv_ (the queues became empty). Both are used with mu_.
  CondVar work_cv_;
  CondVar drained_cv_;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCHER_H_
