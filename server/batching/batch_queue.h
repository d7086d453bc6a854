// One signature's queue and the rules a batch forms by. Pure policy: no threads, no clock
// reads (the time is passed in), so every rule is tested exactly (tests/server/batching/
// batch_queue_test.cc). The threaded driver is batcher.h.
//
// Rules:
//   Packing   Tasks leave in arrival order. A batch takes tasks from the front while it has
//             fewer than max_requests and the next task's tokens fit under max_tokens; the
//             first task that does not fit starts the next batch (no skipping ahead, so a large
//             task is never overtaken indefinitely). A task larger than max_tokens on its own
//             is taken alone. No padding: a batch is just its tasks.
//   Timing    The head batch (what would leave now) is ready at once when it is full (no
//             further task would fit). Otherwise it is ready at
//               min(oldest enqueue time + max_queue_delay,
//                   min over its tasks of (deadline - cost.Estimate(its tokens))).
//   Dropping  When a batch is popped, tasks met at the front that are cancelled, or whose
//             deadline is <= now, are not put in it; they come back separately, with the
//             reason, to be rejected. RemoveCancelled() sweeps the whole queue.
//
// Thread-safety: not thread-safe (the batcher guards it with its lock).
#ifndef ATTNSERVE_SERVER_BATCHING_BATCH_QUEUE_H_
#define ATTNSERVE_SERVER_BATCHING_BATCH_QUEUE_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/batching/batch_task.h"
#include "server/batching/cost_model.h"

namespace attnserve::batching {

// The batch-forming limits of BatcherOptions.
struct BatchLimits {
  int max_requests = 1;
  int64_t max_tokens = 1;
  absl::Duration max_queue_delay = absl::ZeroDuration();
};

// A task with what the queue read from it when it was scheduled.
template <BatchTask Task>
struct QueuedTask {
  std::unique_ptr<Task> task;
  int64_t tokens = 0;
  int64_t bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time enqueued;
  uint64_t owner = 0;  // Task::owner() when the task has one (batch_task.h); else 0
};

// Why a task is not computed: refused by Schedule() (the caller keeps it), or rejected after it
// was queued (it goes to reject). Travels with the task from where the decision is made.
enum class DropReason {
  kExpired,     // DEADLINE_EXCEEDED: the deadline passed (before or while queued)
  kCancelled,   // CANCELLED: the caller went away (before or while queued)
  kQueueFull,   // UNAVAILABLE: max_queued_requests reached
  kQueueBytes,  // UNAVAILABLE: max_queued_bytes reached
  kTooLarge,    // RESOURCE_EXHAUSTED: the task alone is over max_queued_bytes
  kShutdown,    // UNAVAILABLE: Shutdown() had started, or its grace period ended
  kInvalid,     // INVALID_ARGUMENT: null task, negative size
  kUnmeetable,  // DEADLINE_EXCEEDED: the queue ahead would outlast the deadline
  kFairShare,   // UNAVAILABLE: shed from a full queue for a task of a lighter owner
};

// The one rule of whether a task's result can still reach its caller at `now`: nothing when it
// can; else why not, a cancellation first (its caller is gone whatever the deadline). The
// batcher asks it where it decides not to compute (Schedule, RunNowOrSchedule, batch formation)
// and the executor where it decides not to commit a session's extend; Call::Finish then says
// what the caller is told (server/core/call.h).
template <BatchTask Task>
std::optional<DropReason> Undeliverable(const Task& task, absl::Time now) {
  if (task.IsCancelled()) return DropReason::kCancelled;
  if (task.deadline() <= now) return DropReason::kExpired;
  return std::nullopt;
}

template <BatchTask Task>
struct DroppedTask {
  QueuedTask<Task> queued;
  DropReason reason;
};

template <BatchTask Task>
class BatchQueue {
 public:
  bool empty() const { return tasks_.empty(); }
  size_t size() const { return tasks_.size(); }
  // Enqueue time of the oldest task. REQUIRES: !empty().
  absl::Time oldest() const { return tasks_.front().enqueued; }

  void Push(QueuedTask<Task> task) { tasks_.push_back(std::move(task)); }

  // When the head batch should leave: absl::InfinitePast() when it is full now,
  // absl::InfiniteFuture() when the queue is empty.
  absl::Time DispatchTime(const BatchLimits& limits, const BatchCostModel& cost) const {
    if (tasks_.empty()) return absl::InfiniteFuture();
    int count = 0;
    int64_t tokens = 0;
    absl::Time earliest_deadline = absl::InfiniteFuture();
    for (const QueuedTask<Task>& t : tasks_) {
      if (!Fits(limits, count, tokens, t.tokens)) return absl::InfinitePast();
      ++count;
      tokens += t.tokens;
      earliest_deadline = std::min(earliest_deadline, t.deadline);
    }
    if (count >= limits.max_requests || tokens >= limits.max_tokens) return absl::InfinitePast();
    return std::min(tasks_.front().enqueued + limits.max_queue_delay,
                    earliest_deadline - cost.Estimate(tokens));
  }

  // Pops the head batch into `batch` (cleared first), and the cancelled or expired tasks met on
  // the way into `dropped` (appended). `batch` may come back empty.
  void PopBatch(absl::Time now, const BatchLimits& limits, std::vector<QueuedTask<Task>>* batch,
                std::vector<DroppedTask<Task>>* dropped) {
    batch->clear();
    int64_t tokens = 0;
    while (!tasks_.empty()) {
      QueuedTask<Task>& front = tasks_.front();
      if (const std::optional<DropReason> why_not = Undeliverable(*front.task, now)) {
        dropped->push_back({std::move(front), *why_not});
      } else if (Fits(limits, static_cast<int>(batch->size()), tokens, front.tokens)) {
        tokens += front.tokens;
        batch->push_back(std::move(front));
      } else {
        break;
      }
      tasks_.pop_front();
    }
  }

  // Moves every cancelled task into `dropped` (appended).
  void RemoveCancelled(std::vector<DroppedTask<Task>>* dropped) {
    auto kept = tasks_.begin();
    for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
      if (it->task->IsCancelled()) {
        dropped->push_back({std::move(*it), DropReason::kCancelled});
      } else {
        if (kept != it) *kept = std::move(*it);
        ++kept;
      }
    }
    tasks_.erase(kept, tasks_.end());
  }

  // The newest task of `owner`: its enqueue time, or nullopt when it has none here.
  std::optional<absl::Time> NewestOf(uint64_t owner) const {
    for (auto it = tasks_.rbegin(); it != tasks_.rend(); ++it) {
      if (it->owner == owner) return it->enqueued;
    }
    return std::nullopt;
  }

  // Removes and returns the newest task of `owner`. REQUIRES: NewestOf(owner).has_value().
  QueuedTask<Task> TakeNewestOf(uint64_t owner) {
    auto it = tasks_.end();
    do {
      --it;
    } while (it->owner != owner);
    QueuedTask<Task> taken = std::move(*it);
    tasks_.erase(it);
    return taken;
  }

  // Moves every task into `out` (appended).
  void PopAll(std::vector<QueuedTask<Task>>* out) {
    for (QueuedTask<Task>& t : tasks_) out->push_back(std::move(t));
    tasks_.clear();
  }

 private:
  // Whether a task of `task_tokens` joins a batch that has `count` tasks and `tokens` tokens.
  static bool Fits(const BatchLimits& limits, int count, int64_t tokens, int64_t task_tokens) {
    if (count >= limits.max_requests) return false;
    return count == 0 || tokens + task_tokens <= limits.max_tokens;
  }

  std::deque<QueuedTask<Task>> tasks_;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCH_QUEUE_H_
