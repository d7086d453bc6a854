// Test helpers for the batcher: a task that reports its own destruction, and a recorder that
// plays process_batch and reject and checks that every task ends in exactly one of them.
#ifndef ATTNSERVE_TESTS_SERVER_BATCHING_TEST_TASK_H_
#define ATTNSERVE_TESTS_SERVER_BATCHING_TEST_TASK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/batching/batcher.h"

namespace attnserve::batching::testing {

// Counts, per task id, how often a task was destroyed. Thread-safe.
class TaskRegistry {
 public:
  void Destroyed(int id) {
    MutexLock lock(&mu_);
    ++destroyed_[id];
  }
  int times_destroyed(int id) const {
    MutexLock lock(&mu_);
    auto it = destroyed_.find(id);
    return it == destroyed_.end() ? 0 : it->second;
  }
  int64_t total_destroyed() const {
    MutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [id, count] : destroyed_) n += count;
    return n;
  }

 private:
  mutable Mutex mu_;
  absl::flat_hash_map<int, int> destroyed_ ABSL_GUARDED_BY(mu_);
};

class TestTask {
 public:
  TestTask(TaskRegistry* registry, int id, int64_t tokens, int64_t bytes = 1,
           absl::Time deadline = absl::InfiniteFuture(), uint64_t owner = 0)
      : registry_(registry),
        id_(id),
        tokens_(tokens),
        bytes_(bytes),
        deadline_(deadline),
        owner_(owner) {}
  ~TestTask() {
    if (registry_ != nullptr) registry_->Destroyed(id_);
  }

  int64_t num_tokens() const { return tokens_; }
  int64_t num_bytes() const { return bytes_; }
  absl::Time deadline() const { return deadline_; }
  uint64_t owner() const { return owner_; }
  bool IsCancelled() const { return cancelled_.load(std::memory_order_acquire); }

  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  int id() const { return id_; }

 private:
  TaskRegistry* const registry_;
  const int id_;
  const int64_t tokens_;
  const int64_t bytes_;
  const absl::Time deadline_;
  const uint64_t owner_;
  std::atomic<bool> cancelled_{false};
};
static_assert(BatchTask<TestTask>);

using TestBatcher = Batcher<std::string, TestTask>;

// Plays both callbacks: records each batch (key and task ids) and each rejection (id and code),
// then destroys the tasks. An optional hook runs inside process_batch before recording (to
// hold a batch thread busy, or to advance a fake clock).
class Recorder {
 public:
  struct BatchRecord {
    std::string key;
    std::vector<int> ids;
  };
  struct RejectRecord {
    int id;
    absl::StatusCode code;
    DropReason why;
  };

  std::function<void(const std::string&, const std::vector<int>&)> on_batch;

  TestBatcher::ProcessBatchFn ProcessFn() {
    return [this](const std::string& key, TestBatcher::Batch batch) {
      std::vector<int> ids;
      for (const auto& task : batch) ids.push_back(task->id());
      if (on_batch) on_batch(key, ids);
      batch.clear();  // The tasks are "answered" here, before the record appears.
      MutexLock lock(&mu_);
      batches_.push_back({key, ids});
      recorded_.NotifyAll();
    };
  }
  TestBatcher::RejectFn RejectFn() {
    return [this](std::unique_ptr<TestTask> task, absl::Status status, DropReason why) {
      const int id = task->id();
      task.reset();
      MutexLock lock(&mu_);
      rejects_.push_back({id, status.code(), why});
      recorded_.NotifyAll();
    };
  }

  // Block (up to 20 s of real time) until at least n batches / rejections are recorded.
  bool WaitForBatches(size_t n) {
    MutexLock lock(&mu_);
    return AwaitCount(&batches_, n);
  }
  bool WaitForRejects(size_t n) {
    MutexLock lock(&mu_);
    return AwaitCount(&rejects_, n);
  }

  std::vector<BatchRecord> batches() const {
    MutexLock lock(&mu_);
    return batches_;
  }
  std::vector<RejectRecord> rejects() const {
    MutexLock lock(&mu_);
    return rejects_;
  }
  // How many times `id` appears in all batches and rejections together.
  int Appearances(int id) const {
    MutexLock lock(&mu_);
    int n = 0;
    for (const auto& b : batches_) {
      for (int i : b.ids) n += (i == id);
    }
    for (const auto& r : rejects_) n += (r.id == id);
    return n;
  }

 private:
  template <typename T>
  bool AwaitCount(const std::vector<T>* records, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (records->size() < n) {
      if (recorded_.WaitWithDeadline(&mu_, give_up)) return records->size() >= n;
    }
    return true;
  }

  mutable Mutex mu_;
  std::vector<BatchRecord> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<RejectRecord> rejects_ ABSL_GUARDED_BY(mu_);
  CondVar recorded_;
};

// absl::Notification on TSan-visible primitives (see base/mutex.h).
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
    cv_.NotifyAll();
  }
  void WaitForNotification() {
    MutexLock lock(&mu_);
    while (!notified_) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  CondVar cv_;
};

}  // namespace attnserve::batching::testing

#endif  // ATTNSERVE_TESTS_SERVER_BATCHING_TEST_TASK_H_
