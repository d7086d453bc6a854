// The batcher's whole queueing state: one BatchQueue per signature key, admission control over
// all of them, and the choice of which queue's batch leaves next. Pure policy like
// batch_queue.h: single-threaded, the time passed in.
//
// Admission (max_queued_requests, max_queued_bytes) counts queued tasks of every key together:
// the budget is the process's memory and the callers' patience, not a per-signature quota.
// Fair share: the queue is shared between owners (batch_task.h; for the server, connections).
// A queue may fill up with one owner's tasks while nobody else is waiting (work-conserving),
// but when it is full and a task arrives from an owner holding less than its fair share
// (max_queued_requests / owners with queued tasks, the newcomer included), the newest task of
// the owner holding the most is shed to make room, provided that owner holds more than its
// share. One caller flooding the queue thus delays a well-behaved caller by at most its share.
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
  kQueueFull,         // max_queued_requests tasks are queued.
  kOverByteBudget,    // the task's bytes would take the queue over max_queued_bytes.
  kLargerThanBudget,  // the task alone is larger than max_queued_bytes: it can never be queued.
  kUnmeetable,        // (decided by the batcher) the queue ahead would outlast the deadline.
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
  int64_t queued_tokens() const { return queued_tokens_; }
  // Queued tasks of `owner`.
  int64_t queued_of(uint64_t owner) const {
    auto it = owners_.find(owner);
    return it == owners_.end() ? 0 : it->second;
  }

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
    queued_tokens_ += task.tokens;
    ++owners_[task.owner];
    queues_[key].Push(std::move(task));
  }

  // When CanAdmit said kQueueFull: makes room for a task of `owner` by removing the newest task
  // of the heaviest owner into `shed`, if fair share allows (see above). Returns whether it did.
  bool ShedFor(uint64_t owner, QueuedTask<Task>* shed) {
    const int64_t owners = static_cast<int64_t>(owners_.size()) + (owners_.contains(owner) ? 0 : 1);
    const int64_t share = std::max<int64_t>(1, max_queued_requests_ / owners);
    if (queued_of(owner) >= share) return false;
    uint64_t heaviest = 0;
    int64_t most = 0;
    for (const auto& [o, n] : owners_) {
      if (n > most) {
        heaviest = o;
        most = n;
      }
    }
    if (most <= share) return false;
    auto newest = queues_.end();
    absl::Time newest_time = absl::InfinitePast();
    for (auto it = queues_.begin(); it != queues_.end(); ++it) {
      std::optional<absl::Time> t = it->second.NewestOf(heaviest);
      if (t.has_value() && (newest == queues_.end() || *t >= newest_time)) {
        newest = it;
        newest_time = *t;
      }
    }
    if (newest == queues_.end()) return false;  // cannot happen: `heaviest` has tasks queued
    *shed = newest->second.TakeNewestOf(heaviest);
    Forget(*shed);
    if (newest->second.empty()) queues_.erase(newest);
    return true;
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
    owners_.clear();
    queued_requests_ = 0;
    queued_bytes_ = 0;
    queued_tokens_ = 0;
  }

 private:
  void Forget(const QueuedTask<Task>& t) {
    --queued_requests_;
    queued_bytes_ -= t.bytes;
    queued_tokens_ -= t.tokens;
    auto it = owners_.find(t.owner);
    if (--it->second == 0) owners_.erase(it);
  }

  const BatchLimits limits_;
  const int64_t max_queued_requests_;
  const int64_t max_queued_bytes_;
  absl::flat_hash_map<Key, BatchQueue<Task>, Hash, Eq> queues_;
  absl::flat_hash_map<uint64_t, int64_t> owners_;  // queued tasks per owner, none at 0
  int64_t queued_requests_ = 0;
  int64_t queued_bytes_ = 0;
  int64_t queued_tokens_ = 0;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCH_POLICY_H_
