// Several producer threads against a real-clock batcher with several batch threads: every
// task, whatever happens to it, is answered exactly once. Bounded in iterations (not time), so
// it also runs under ThreadSanitizer.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/batching/batcher.h"
#include "tests/server/batching/test_task.h"

namespace attnserve::batching {
namespace {

using testing::TaskRegistry;

// Like TestTask, but cancellable by the producer after the batcher has taken it (through a
// flag the producer shares, never through the task, which it no longer owns).
class StressTask {
 public:
  StressTask(TaskRegistry* registry, int id, int64_t tokens, int64_t bytes, absl::Time deadline,
             std::shared_ptr<std::atomic<bool>> cancelled)
      : registry_(registry),
        id_(id),
        tokens_(tokens),
        bytes_(bytes),
        deadline_(deadline),
        cancelled_(std::move(cancelled)) {}
  ~StressTask() { registry_->Destroyed(id_); }
  int64_t num_tokens() const { return tokens_; }
  int64_t num_bytes() const { return bytes_; }
  absl::Time deadline() const { return deadline_; }
  bool IsCancelled() const { return cancelled_->load(std::memory_order_acquire); }
  int id() const { return id_; }

 private:
  TaskRegistry* const registry_;
  const int id_;
  const int64_t tokens_, bytes_;
  const absl::Time deadline_;
  const std::shared_ptr<std::atomic<bool>> cancelled_;
};

using StressBatcher = Batcher<int, StressTask>;

constexpr int kProducers = 4;
constexpr int kTasksPerProducer = 1500;

struct Outcomes {
  std::atomic<int64_t> processed{0}, expired{0}, cancelled{0}, shut_down{0}, other{0};
  std::atomic<int64_t> refused{0}, wrong_key{0}, oversize_batches{0};
  std::atomic<int64_t> refusals{0};  // Schedule() calls that did not return OK, retries included
};

class BatcherStressTest : public ::testing::Test {
 protected:
  void Start() {
    BatcherOptions options;
    options.max_batch_requests = 8;
    options.max_batch_tokens = 64;
    options.max_queue_delay = absl::Microseconds(200);
    options.max_queued_requests = 64;
    options.max_queued_bytes = 64 * 50;
    options.num_batch_threads = 3;
    auto batcher = StressBatcher::Create(
        options,
        [this](const int& key, StressBatcher::Batch batch) {
          int64_t tokens = 0;
          for (const auto& t : batch) {
            tokens += t->num_tokens();
            if (t->id() % 3 != key) out_.wrong_key++;
          }
          if (batch.size() > 8 || (batch.size() > 1 && tokens > 64)) out_.oversize_batches++;
          out_.processed += static_cast<int64_t>(batch.size());
        },
        [this](std::unique_ptr<StressTask> /*task*/, absl::Status status, DropReason) {
          switch (status.code()) {
            case absl::StatusCode::kDeadlineExceeded:
              out_.expired++;
              break;
            case absl::StatusCode::kCancelled:
              out_.cancelled++;
              break;
            case absl::StatusCode::kUnavailable:
              out_.shut_down++;
              break;
            default:
              out_.other++;
          }
        });
    ASSERT_TRUE(batcher.ok()) << batcher.status();
    batcher_ = *std::move(batcher);
  }

  void Produce(int producer) {
    std::mt19937 rng(producer);
    for (int i = 0; i < kTasksPerProducer; ++i) {
      if (i == kTasksPerProducer - 1 && hold_last_task_) {
        producers_holding_++;
        release_last_task_.WaitForNotification();
      }
      const int id = producer * kTasksPerProducer + i;
      const int64_t tokens = 1 + rng() % 20;
      const int64_t bytes = 1 + rng() % 100;
      const absl::Time deadline =
          rng() % 5 == 0 ? absl::Now() + absl::Microseconds(rng() % 2000) : absl::InfiniteFuture();
      auto cancelled = std::make_shared<std::atomic<bool>>(false);
      auto task = std::make_unique<StressTask>(&registry_, id, tokens, bytes, deadline, cancelled);
      // Overload answers UNAVAILABLE: back off and retry, as a client would, a few times.
      absl::Status status;
      for (int attempt = 0; attempt < 5; ++attempt) {
        status = batcher_->Schedule(id % 3, &task);
        if (status.ok()) break;
        out_.refusals++;
        EXPECT_NE(task, nullptr);
        if (status.code() != absl::StatusCode::kUnavailable || shutting_down_) break;
        std::this_thread::sleep_for(std::chrono::microseconds(20 << attempt));
      }
      if (!status.ok()) {
        EXPECT_NE(task, nullptr);
        out_.refused++;
        continue;  // the caller still owns it; it is destroyed here
      }
      EXPECT_EQ(task, nullptr);
      if (rng() % 10 == 0) {
        cancelled->store(true, std::memory_order_release);
        if (rng() % 2 == 0) batcher_->NotifyCancelled();
      }
      if (rng() % 64 == 0) std::this_thread::yield();
    }
    producers_done_++;
  }

  void CheckAccounting() {
    const int64_t total = kProducers * kTasksPerProducer;
    EXPECT_EQ(
        out_.processed + out_.expired + out_.cancelled + out_.shut_down + out_.other + out_.refused,
        total);
    EXPECT_EQ(out_.other, 0);
    EXPECT_EQ(out_.wrong_key, 0);
    EXPECT_EQ(out_.oversize_batches, 0);
    EXPECT_EQ(registry_.total_destroyed(), total);
    for (int id = 0; id < total; ++id) ASSERT_EQ(registry_.times_destroyed(id), 1) << id;
    const BatcherStats s = batcher_->stats();
    EXPECT_EQ(s.scheduled, s.processed + s.expired + s.cancelled + s.shut_down + s.shed);
    EXPECT_EQ(s.processed, out_.processed);
    EXPECT_EQ(s.expired, out_.expired);
    EXPECT_EQ(s.cancelled, out_.cancelled);
    EXPECT_EQ(s.queued_requests, 0);
    EXPECT_EQ(s.refused_queue_full + s.refused_bytes + s.refused_shutdown + s.refused_expired +
                  s.refused_cancelled + s.refused_invalid + s.refused_unmeetable,
              out_.refusals);
  }

  TaskRegistry registry_;
  Outcomes out_;
  std::atomic<int> producers_done_{0};
  std::atomic<bool> shutting_down_{false};
  // When set, each producer holds its last task until release_last_task_ (so that some task is
  // surely scheduled after Shutdown, however the threads are scheduled).
  bool hold_last_task_ = false;
  std::atomic<int> producers_holding_{0};
  testing::Notification release_last_task_;
  std::unique_ptr<StressBatcher> batcher_;
};

TEST_F(BatcherStressTest, EveryTaskIsAnsweredExactlyOnce) {
  Start();
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) producers.emplace_back([this, p] { Produce(p); });
  for (auto& t : producers) t.join();
  batcher_->Shutdown(absl::Seconds(10));
  EXPECT_EQ(out_.shut_down, 0);  // ample grace: everything queued was drained
  EXPECT_GT(out_.processed, 0);
  CheckAccounting();
}

TEST_F(BatcherStressTest, ShutdownWhileProducersRun) {
  hold_last_task_ = true;
  Start();
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) producers.emplace_back([this, p] { Produce(p); });
  // Shut down mid-run (after 1000 tasks) or, on a machine too busy to get here sooner, when
  // every producer waits at its last task; either way each producer schedules after Shutdown.
  while (batcher_->stats().scheduled < 1000 && producers_holding_ < kProducers) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  shutting_down_ = true;
  batcher_->Shutdown(absl::Milliseconds(1));
  release_last_task_.Notify();
  for (auto& t : producers) t.join();
  EXPECT_GT(batcher_->stats().refused_shutdown, 0);
  CheckAccounting();
}

}  // namespace
}  // namespace attnserve::batching
