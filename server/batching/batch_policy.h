// The batcher's whole queueing state: one BatchQueue per signature key, admission control over
// all of them, and the choice of which queue's batch leaves next. Pure policy like
// batch_queue.h: single-threaded, the time passed in.
//
// Admission (max_queued_requests, max_queued_bytes) counts queued tasks of every key together:
// the budget is the process's memory and the callers' patience, not a per-signature quota.
// Among queues whose batch is ready, the one whose dispatch time is earliest leaves first
// (ties: the one whose oldest task is oldest), so no signature starves another.
//
// Thread-safety: not thread-safe (the batcher guards it with its lock).
#ifndef ATTNSERVE_SERVER_BATCHING_BATCH_POLICY_H_
#define ATTNSERVE_SERVER_BATCHING_BATCH_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/batching/batch_queue.h"
#include "server/batching/batch_task.h"
#include "server/batching/cost_model.h"

namespace attnserve::batching {

enum class Admission {
  kOk,
  kQueueFull,        // max_queued_requests tasks are queued.
  kOverByteBudget,   // the task's bytes would take the queue over max_queued_bytes.
  kLargerThanBudget  // the task alone is larger than max_queued_bytes: it can never be queued.
};

template <typename Key, BatchTask Task, typename Hash, typename Eq>
class BatchPolicy {
 public:
  BatchPolicy(BatchLimits limits, int max_queued_requests, int64_t max_queued_bytes)
      : limits_(limits),
        max_queued_requests_(max_queued_requests),
        max_queued_bytes_(max_queued_bytes) {}

  const BatchLimits& limits() const { return limits_; }
  bool empty() const { return queued_requests_ == 0; }
  int64_t queued_requests() const { return queued_requests_; }
  int64_t queued_bytes() const { return queued_bytes_; }

  // Whether a task of `bytes` bytes may be added now.
  Admission CanAdmit(int64_t bytes) const {
    if (bytes > max_queued_bytes_) return Admission::kLargerThanBudget;
    if (queued_requests_ >= max_queued_requests_) return Admission::kQueueFull;
    if (bytes > max_queued_bytes_ - queued_bytes_) return Admission::kOverByteBudget;
    return Admission::kOk;
  }

  // REQUIRES: CanAdmit(task.bytes) == kOk.
  void Add(const Key& key, QueuedTask<Task> task) {
    ++queued_requests_;
    queued_bytes_ += task.bytes;
    queues_[key].Push(std::move(task));
  }

  // The earliest time some queue's batch is ready (see batch_queue.h); while `draining`, every
  // non-empty queue is ready at once. absl::InfiniteFuture() when nothing is queued.
  absl::Time NextDispatchTime(const BatchCostModel& cost, bool draining) const {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [key, queue] : queues_) {
      next = std::min(next, draining ? absl::InfinitePast() : queue.DispatchTime(limits_, cost));
    }
    return next;
  }

  // If some queue's batch is ready at `now`, pops it into `batch` and returns its key; the
  // cancelled and expired tasks met on the way go to `dropped` (appended). `batch` may come
  // back empty when every task met was dropped. Returns nullopt when no batch is ready.
  std::optional<Key> PopReadyBatch(absl::Time now, const BatchCostModel& cost, bool draining,
                                   std::vector<QueuedTask<Task>>* batch,
                                   std::vector<DroppedTask<Task>>* dropped) {
    auto best = queues_.end();
    absl::Time best_time = absl::InfiniteFuture();
    for (auto it = queues_.begin(); it != queues_.end(); ++it) {
      const absl::Time t = draining ? absl::InfinitePast() : it->second.DispatchTime(limits_, cost);
      if (t > now) continue;
      if (best == queues_.end() || t < best_time ||
          (t == best_time && it->second.oldest() < best->second.oldest())) {
        best = it;
        best_time = t;
      }
    }
    if (best == queues_.end()) return std::nullopt;
    const size_t dropped_before = dropped->size();
    best->second.PopBatch(now, limits_, batch, dropped);
    std::optional<Key> key(best->first);
    for (const QueuedTask<Task>& t : *batch) Forget(t);
    for (size_t i = dropped_before; i < dropped->size(); ++i) Forget((*dropped)[i].queued);
    // Keys come and go with the requests' shapes; an empty queue is not kept.
    if (best->second.empty()) queues_.erase(best);
    return key;
  }

  // Moves every cancelled task of every queue into `dropped` (appended).
  void RemoveCancelled(std::vector<DroppedTask<Task>>* dropped) {
    const size_t dropped_before = dropped->size();
    for (auto& [key, queue] : queues_) queue.RemoveCancelled(dropped);
    for (size_t i = dropped_before; i < dropped->size(); ++i) Forget((*dropped)[i].queued);
    absl::erase_if(queues_, [](const auto& kv) { return kv.second.empty(); });
  }

  // Moves every queued task into `out` (appended).
  void PopAll(std::vector<QueuedTask<Task>>* out) {
    for (auto& [key, queue] : queues_) queue.PopAll(out);
    queues_.clear();
    queued_requests_ = 0;
    queued_bytes_ = 0;
  }

 private:
  void Forget(const QueuedTask<Task>& t) {
    --queued_requests_;
    queued_bytes_ -= t.bytes;
  }

  const BatchLimits limits_;
  const int64_t max_queued_requests_;
  const int64_t max_queued_bytes_;
  absl::flat_hash_map<Key, BatchQueue<Task>, Hash, Eq> queues_;
  int64_t queued_requests_ = 0;
  int64_t queued_bytes_ = 0;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCH_POLICY_H_
