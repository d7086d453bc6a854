// The threaded batcher (server/batching/batcher.h) driven by a FakeClock. Each test waits for
// the batch thread to go to sleep until a known instant (FakeClock::BlockUntilWaiting) before
// it checks what has not happened yet, so nothing depends on real-time sleeps.
#include "server/batching/batcher.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/fake_clock.h"
#include "tests/server/batching/test_task.h"

namespace attnserve::batching {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Recorder;
using testing::TaskRegistry;
using testing::TestBatcher;
using testing::TestTask;

class BatcherTest : public ::testing::Test {
 protected:
  BatcherTest() {
    options_.max_batch_requests = 3;
    options_.max_batch_tokens = 10;
    options_.max_queue_delay = absl::Milliseconds(10);
    options_.max_queued_requests = 100;
    options_.max_queued_bytes = 1000;
    options_.num_batch_threads = 1;
    options_.clock = &clock_;
    options_.cost_model =
        std::make_shared<FixedCostModel>(absl::ZeroDuration(), absl::ZeroDuration());
  }

  // Every task created through Task() must end in exactly one callback, exactly once, and be
  // destroyed exactly once, unless the test kept it (refused by Schedule).
  void TearDown() override {
    batcher_.reset();
    for (int id : scheduled_ids_) {
      EXPECT_EQ(recorder_.Appearances(id), 1) << "task " << id;
      EXPECT_EQ(registry_.times_destroyed(id), 1) << "task " << id;
    }
  }

  void Start() {
    auto batcher = TestBatcher::Create(options_, recorder_.ProcessFn(), recorder_.RejectFn());
    ASSERT_TRUE(batcher.ok()) << batcher.status();
    batcher_ = *std::move(batcher);
  }

  std::unique_ptr<TestTask> Task(int id, int64_t tokens = 1, int64_t bytes = 1,
                                 absl::Time deadline = absl::InfiniteFuture()) {
    return std::make_unique<TestTask>(&registry_, id, tokens, bytes, deadline);
  }

  // Schedules and expects OK.
  TestTask* Add(const std::string& key, std::unique_ptr<TestTask> task) {
    TestTask* raw = task.get();
    const int id = task->id();
    EXPECT_TRUE(batcher_->Schedule(key, &task).ok());
    EXPECT_EQ(task, nullptr);
    scheduled_ids_.push_back(id);
    return raw;
  }

  // Makes the batch thread block inside process_batch on the batch containing `id` until
  // Release() (to make tasks wait behind a busy thread).
  void HoldBatchWith(int id) {
    recorder_.on_batch = [this, id](const std::string&, const std::vector<int>& ids) {
      for (int i : ids) {
        if (i == id) {
          busy_.Notify();
          release_.WaitForNotification();
        }
      }
    };
  }

  FakeClock clock_;
  const absl::Time t0_ = clock_.Now();
  BatcherOptions options_;
  TaskRegistry registry_;
  Recorder recorder_;
  std::unique_ptr<TestBatcher> batcher_;
  std::vector<int> scheduled_ids_;
  testing::Notification busy_, release_;
};

TEST_F(BatcherTest, FullBatchByCountLeavesAtOnce) {
  Start();
  for (int i = 1; i <= 7; ++i) Add("k", Task(i));
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  // The 7th task waits for company until the delay is up.
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(10)));
  EXPECT_EQ(recorder_.batches().size(), 2u);
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(3));
  const auto batches = recorder_.batches();
  EXPECT_THAT(batches[0].ids, ElementsAre(1, 2, 3));
  EXPECT_THAT(batches[1].ids, ElementsAre(4, 5, 6));
  EXPECT_THAT(batches[2].ids, ElementsAre(7));
}

TEST_F(BatcherTest, BatchIsFullWhenTheNextTaskWouldOverflowTokens) {
  Start();
  Add("k", Task(1, /*tokens=*/4));
  Add("k", Task(2, 4));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(10)));
  EXPECT_TRUE(recorder_.batches().empty());
  Add("k", Task(3, 4));  // 12 > 10: tasks 1 and 2 leave now, task 3 starts the next batch.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1, 2));
  Add("k", Task(4, 25));  // Larger than max_batch_tokens: behind task 3, then alone.
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(3));
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(3));
  EXPECT_THAT(recorder_.batches()[2].ids, ElementsAre(4));
}

TEST_F(BatcherTest, PartialBatchLeavesExactlyAtMaxQueueDelay) {
  Start();
  Add("k", Task(1));
  clock_.Advance(absl::Milliseconds(4));
  Add("k", Task(2));
  // Due at the oldest task's enqueue time + 10 ms, not the newest's.
  const absl::Time due = t0_ + absl::Milliseconds(10);
  ASSERT_TRUE(clock_.BlockUntilWaiting(due));
  clock_.Advance(absl::Milliseconds(5));  // t0 + 9 ms
  ASSERT_TRUE(clock_.BlockUntilWaiting(due));
  EXPECT_TRUE(recorder_.batches().empty());
  clock_.Advance(absl::Milliseconds(1));  // t0 + 10 ms
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1, 2));
}

TEST_F(BatcherTest, ZeroDelayDispatchesAtOnce) {
  options_.max_queue_delay = absl::ZeroDuration();
  Start();
  Add("k", Task(1));
  ASSERT_TRUE(recorder_.WaitForBatches(1));
}

TEST_F(BatcherTest, DeadlineMakesTheBatchLeaveEarly) {
  options_.max_queue_delay = absl::Milliseconds(100);
  options_.cost_model =
      std::make_shared<FixedCostModel>(absl::Milliseconds(2), absl::Milliseconds(1));
  Start();
  Add("k", Task(1, /*tokens=*/1));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(100)));
  // Deadline t0 + 20 ms; the batch (2 tokens) is estimated at 2 + 2 = 4 ms: leave at 16 ms.
  Add("k", Task(2, 1, 1, t0_ + absl::Milliseconds(20)));
  const absl::Time due = t0_ + absl::Milliseconds(16);
  ASSERT_TRUE(clock_.BlockUntilWaiting(due));
  clock_.Advance(absl::Milliseconds(15));
  ASSERT_TRUE(clock_.BlockUntilWaiting(due));
  EXPECT_TRUE(recorder_.batches().empty());
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1, 2));
  EXPECT_TRUE(recorder_.rejects().empty());
}

TEST_F(BatcherTest, LearnsCostFromMeasuredBatches) {
  options_.max_queue_delay = absl::Milliseconds(100);
  options_.cost_model = std::make_shared<EwmaCostModel>(/*margin=*/absl::ZeroDuration());
  // Every batch "takes" 6 * 2^-10 s on the fake clock; powers of two keep the arithmetic exact.
  recorder_.on_batch = [this](const std::string&, const std::vector<int>&) {
    clock_.Advance(absl::Nanoseconds(5'859'375));
  };
  Start();
  for (int i = 1; i <= 3; ++i) Add("k", Task(i, /*tokens=*/2));  // full: 6 tokens, 2^-10 s each
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  const absl::Time now = clock_.Now();
  // 4 tokens at 2^-10 s = 3.90625 ms before the deadline, long before the 100 ms delay.
  Add("k", Task(4, 4, 1, now + absl::Milliseconds(50)));
  const absl::Time due = now + absl::Milliseconds(50) - absl::Nanoseconds(3'906'250);
  ASSERT_TRUE(clock_.BlockUntilWaiting(due));
  clock_.SetTime(due);
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(4));
}

TEST_F(BatcherTest, TaskExpiredWhileQueuedIsRejectedNotProcessed) {
  options_.max_batch_requests = 1;
  HoldBatchWith(1);
  Start();
  Add("k", Task(1));
  busy_.WaitForNotification();
  Add("k", Task(2, 1, 1, t0_ + absl::Milliseconds(5)));
  Add("k", Task(3));
  clock_.Advance(absl::Milliseconds(6));
  release_.Notify();
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  ASSERT_TRUE(recorder_.WaitForRejects(1));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(3));
  EXPECT_EQ(recorder_.rejects()[0].id, 2);
  EXPECT_EQ(recorder_.rejects()[0].code, absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(batcher_->stats().expired, 1);
}

TEST_F(BatcherTest, TaskCancelledWhileQueuedIsRejectedAtBatchFormation) {
  options_.max_batch_requests = 1;
  HoldBatchWith(1);
  Start();
  Add("k", Task(1));
  busy_.WaitForNotification();
  Add("k", Task(2))->Cancel();  // no NotifyCancelled(): found when its batch forms
  Add("k", Task(3));
  release_.Notify();
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  ASSERT_TRUE(recorder_.WaitForRejects(1));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(3));
  EXPECT_EQ(recorder_.rejects()[0].id, 2);
  EXPECT_EQ(recorder_.rejects()[0].code, absl::StatusCode::kCancelled);
  EXPECT_EQ(batcher_->stats().cancelled, 1);
}

TEST_F(BatcherTest, NotifyCancelledRemovesTheTaskPromptly) {
  options_.max_queue_delay = absl::Seconds(10);
  Start();
  Add("k", Task(1));
  TestTask* two = Add("k", Task(2));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Seconds(10)));
  two->Cancel();
  batcher_->NotifyCancelled();
  ASSERT_TRUE(recorder_.WaitForRejects(1));  // without the clock moving
  EXPECT_EQ(recorder_.rejects()[0].id, 2);
  EXPECT_EQ(recorder_.rejects()[0].code, absl::StatusCode::kCancelled);
  EXPECT_EQ(batcher_->stats().queued_requests, 1);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1));
}

TEST_F(BatcherTest, ScheduleRefusesCancelledAndExpiredTasksAndCallerKeepsThem) {
  Start();
  auto cancelled = Task(1);
  cancelled->Cancel();
  EXPECT_EQ(batcher_->Schedule("k", &cancelled).code(), absl::StatusCode::kCancelled);
  ASSERT_NE(cancelled, nullptr);
  auto expired = Task(2, 1, 1, /*deadline=*/t0_);
  EXPECT_EQ(batcher_->Schedule("k", &expired).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_NE(expired, nullptr);
  EXPECT_EQ(registry_.total_destroyed(), 0);
  const BatcherStats stats = batcher_->stats();
  EXPECT_EQ(stats.refused_cancelled, 1);
  EXPECT_EQ(stats.refused_expired, 1);
  EXPECT_EQ(stats.scheduled, 0);
}

TEST_F(BatcherTest, FullQueueRefusesAtOnceWithUnavailable) {
  options_.max_queued_requests = 2;
  options_.max_batch_requests = 10;
  Start();
  Add("a", Task(1));
  Add("b", Task(2));  // the limit counts every key's queue
  auto third = Task(3);
  const absl::Status status = batcher_->Schedule("a", &third);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("max_queued_requests 2"));
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->id(), 3);
  EXPECT_EQ(batcher_->stats().refused_queue_full, 1);
  EXPECT_EQ(registry_.times_destroyed(3), 0);
}

TEST_F(BatcherTest, AFullQueueShedsTheHeaviestOwnersNewestTaskForALighterOwner) {
  options_.max_queued_requests = 4;
  options_.max_batch_requests = 10;
  Start();
  auto owned = [this](int id, uint64_t owner) {
    return std::make_unique<TestTask>(&registry_, id, 1, 1, absl::InfiniteFuture(), owner);
  };
  for (int id = 1; id <= 4; ++id) Add("a", owned(id, /*owner=*/1));  // one owner fills it
  // A second owner's task takes the place of the first owner's newest: 2 owners, 2 places each.
  Add("b", owned(5, 2));
  ASSERT_EQ(recorder_.rejects().size(), 1u);
  EXPECT_EQ(recorder_.rejects()[0].id, 4);
  EXPECT_EQ(recorder_.rejects()[0].code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(recorder_.rejects()[0].why, DropReason::kFairShare);
  Add("a", owned(6, 2));
  ASSERT_EQ(recorder_.rejects().size(), 2u);
  EXPECT_EQ(recorder_.rejects()[1].id, 3);
  // Both hold their share now: the queue is full for either.
  for (uint64_t owner : {1, 2}) {
    auto refused = owned(7, owner);
    DropReason why = DropReason::kInvalid;
    const absl::Status status = batcher_->Schedule("a", &refused, &why);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(why, DropReason::kQueueFull);
    EXPECT_GE(PushbackMs(status).value_or(0), 1) << "a full queue asks for a pushback";
    ASSERT_NE(refused, nullptr);
  }
  const BatcherStats stats = batcher_->stats();
  EXPECT_EQ(stats.shed, 2);
  EXPECT_EQ(stats.refused_queue_full, 2);
  EXPECT_EQ(stats.queued_requests, 4);
  // The shed tasks were answered; the rest are computed.
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(10)));
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  std::vector<int> computed;
  for (const auto& b : recorder_.batches())
    computed.insert(computed.end(), b.ids.begin(), b.ids.end());
  EXPECT_THAT(computed, ::testing::UnorderedElementsAre(1, 2, 5, 6));
}

TEST_F(BatcherTest, ATaskThatTheQueueAheadWouldMakeLateIsRefusedAtArrival) {
  options_.cost_model =
      std::make_shared<FixedCostModel>(absl::ZeroDuration(), absl::Milliseconds(1));
  Start();
  Add("k", Task(1, /*tokens=*/6));  // not a full batch (10 tokens): it stays queued
  // 6 tokens ahead + 1 of its own at 1 ms each: 7 ms, more than the 5 ms it has.
  auto late = Task(2, 1, 1, t0_ + absl::Milliseconds(5));
  DropReason why = DropReason::kInvalid;
  const absl::Status status = batcher_->Schedule("k", &late, &why);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("refused without queueing"));
  EXPECT_EQ(why, DropReason::kUnmeetable);
  EXPECT_EQ(PushbackMs(status), 6);  // the 6 tokens ahead, at 1 ms each: the queue's drain
  ASSERT_NE(late, nullptr);
  Add("k", Task(3, 1, 1, t0_ + absl::Milliseconds(8)));  // 7 ms fit in 8
  EXPECT_EQ(batcher_->stats().refused_unmeetable, 1);
  EXPECT_EQ(batcher_->stats().queued_requests, 2);
}

TEST_F(BatcherTest, BytesOverBudgetRefusesAtOnce) {
  Start();  // max_queued_bytes = 1000
  Add("k", Task(1, 1, /*bytes=*/600));
  auto over = Task(2, 1, 500);
  absl::Status status = batcher_->Schedule("k", &over);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("max_queued_bytes 1000"));
  ASSERT_NE(over, nullptr);
  auto huge = Task(3, 1, 1001);  // can never fit: retrying would not help
  status = batcher_->Schedule("k", &huge);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(batcher_->stats().refused_bytes, 2);
  EXPECT_EQ(batcher_->stats().queued_bytes, 600);
}

TEST_F(BatcherTest, InvalidTasksAreRefused) {
  Start();
  std::unique_ptr<TestTask> null_task;
  EXPECT_EQ(batcher_->Schedule("k", &null_task).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batcher_->Schedule("k", nullptr).code(), absl::StatusCode::kInvalidArgument);
  auto negative = Task(1, /*tokens=*/-1);
  const absl::Status status = batcher_->Schedule("k", &negative);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("was -1"));
  ASSERT_NE(negative, nullptr);
  EXPECT_EQ(batcher_->stats().refused_invalid, 3);
}

TEST_F(BatcherTest, KeysAreNeverMixed) {
  options_.max_batch_requests = 2;
  Start();
  Add("a", Task(1));
  Add("b", Task(2));
  Add("a", Task(3));  // "a" is full: leaves now; "b" waits.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_EQ(recorder_.batches()[0].key, "a");
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1, 3));
  Add("c", Task(4));
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(3));
  for (const auto& batch : recorder_.batches()) {
    for (int id : batch.ids) {
      EXPECT_EQ(batch.key, id == 2 ? "b" : id == 4 ? "c" : "a") << "task " << id;
    }
  }
}

TEST_F(BatcherTest, SeveralBatchThreadsComputeBatchesAtOnce) {
  options_.max_batch_requests = 1;
  options_.num_batch_threads = 2;
  testing::Notification both;
  std::atomic<int> inside{0};
  recorder_.on_batch = [&](const std::string&, const std::vector<int>&) {
    if (inside.fetch_add(1) + 1 == 2) both.Notify();
    both.WaitForNotification();  // returns only if both threads are here together
  };
  Start();
  Add("k", Task(1));
  Add("k", Task(2));
  ASSERT_TRUE(recorder_.WaitForBatches(2));
}

TEST_F(BatcherTest, ShutdownDrainsQueuedWorkWithoutWaitingForTheDelay) {
  options_.max_queue_delay = absl::Seconds(100);
  Start();
  Add("a", Task(1));
  Add("b", Task(2));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Seconds(100)));
  batcher_->Shutdown(absl::Seconds(1));
  EXPECT_EQ(recorder_.batches().size(), 2u);
  EXPECT_TRUE(recorder_.rejects().empty());
  auto late = Task(3);
  const absl::Status refused = batcher_->Schedule("a", &late);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  // A drain sends callers elsewhere at once: no pushback.
  EXPECT_EQ(PushbackMs(refused), std::nullopt);
  ASSERT_NE(late, nullptr);
  const BatcherStats stats = batcher_->stats();
  EXPECT_EQ(stats.processed, 2);
  EXPECT_EQ(stats.refused_shutdown, 1);
  batcher_->Shutdown(absl::Seconds(1));  // a second call returns at once
}

TEST_F(BatcherTest, ShutdownRejectsWhatIsLeftAfterTheGracePeriod) {
  options_.max_batch_requests = 1;
  HoldBatchWith(1);
  Start();
  Add("k", Task(1));
  busy_.WaitForNotification();
  Add("k", Task(2));
  Add("k", Task(3));
  std::thread shutdown([this] { batcher_->Shutdown(absl::Milliseconds(50)); });
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(50)));
  clock_.Advance(absl::Milliseconds(50));
  // Rejected before the busy batch finishes: the grace period is over.
  ASSERT_TRUE(recorder_.WaitForRejects(2));
  for (const auto& r : recorder_.rejects()) {
    EXPECT_EQ(r.code, absl::StatusCode::kUnavailable) << "task " << r.id;
  }
  release_.Notify();
  shutdown.join();
  EXPECT_EQ(recorder_.batches().size(), 1u);
  EXPECT_EQ(batcher_->stats().shut_down, 2);
}

TEST_F(BatcherTest, EndGracePeriodCutsADrainShort) {
  options_.max_batch_requests = 1;
  HoldBatchWith(1);
  Start();
  Add("k", Task(1));
  busy_.WaitForNotification();
  Add("k", Task(2));
  Add("k", Task(3));
  std::thread shutdown([this] { batcher_->Shutdown(absl::Hours(1)); });
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Hours(1)));
  batcher_->EndGracePeriod();
  // Rejected without the clock moving and while the busy batch still runs.
  ASSERT_TRUE(recorder_.WaitForRejects(2));
  for (const auto& r : recorder_.rejects()) {
    EXPECT_EQ(r.code, absl::StatusCode::kUnavailable) << "task " << r.id;
  }
  release_.Notify();
  shutdown.join();
  EXPECT_EQ(recorder_.batches().size(), 1u);
  EXPECT_EQ(batcher_->stats().shut_down, 2);
}

TEST_F(BatcherTest, EndGracePeriodBeforeShutdownMakesItsGraceZero) {
  options_.max_queue_delay = absl::Seconds(100);
  Start();
  Add("k", Task(1));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Seconds(100)));
  batcher_->EndGracePeriod();
  batcher_->Shutdown(absl::Hours(1));
  ASSERT_EQ(recorder_.rejects().size(), 1u);
  EXPECT_EQ(recorder_.rejects()[0].code, absl::StatusCode::kUnavailable);
}

TEST_F(BatcherTest, DestructorRejectsQueuedTasks) {
  options_.max_queue_delay = absl::Seconds(100);
  Start();
  Add("k", Task(1));
  Add("k", Task(2));
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Seconds(100)));
  batcher_.reset();
  // Zero grace: the destructor takes the queue before the batch thread can wake.
  EXPECT_TRUE(recorder_.batches().empty());
  ASSERT_EQ(recorder_.rejects().size(), 2u);
  for (const auto& r : recorder_.rejects()) {
    EXPECT_EQ(r.code, absl::StatusCode::kUnavailable);
  }
}

TEST_F(BatcherTest, StatsAccountForEveryTask) {
  options_.max_queued_requests = 4;
  options_.max_batch_requests = 10;  // nothing leaves before Shutdown()
  Start();
  for (int i = 1; i <= 4; ++i) Add("k", Task(i));
  auto refused = Task(5);
  EXPECT_FALSE(batcher_->Schedule("k", &refused).ok());
  batcher_->Shutdown(absl::InfiniteDuration());
  const BatcherStats s = batcher_->stats();
  EXPECT_EQ(s.scheduled, 4);
  EXPECT_EQ(s.refused_queue_full, 1);
  EXPECT_EQ(s.processed + s.expired + s.cancelled + s.shut_down, s.scheduled);
  EXPECT_EQ(s.batches, 1);
  EXPECT_EQ(s.queued_requests, 0);
  EXPECT_EQ(s.queued_bytes, 0);
}

// RunNowOrSchedule: a task that would be computed at once anyway is computed on the caller's
// thread, as a batch of its own, before the call returns.
TEST_F(BatcherTest, RunNowComputesOnTheCallersThreadWhenNothingWaits) {
  options_.max_queue_delay = absl::ZeroDuration();
  Start();
  std::thread::id ran_on;
  recorder_.on_batch = [&](const std::string&, const std::vector<int>&) {
    ran_on = std::this_thread::get_id();
  };
  auto task = Task(1);
  ASSERT_TRUE(batcher_->RunNowOrSchedule("k", &task).ok());
  scheduled_ids_.push_back(1);
  EXPECT_EQ(task, nullptr);
  ASSERT_EQ(recorder_.batches().size(), 1u);  // already computed: no waiting
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(1));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  const BatcherStats s = batcher_->stats();
  EXPECT_EQ(s.scheduled, 1);
  EXPECT_EQ(s.batches, 1);
  EXPECT_EQ(s.processed, 1);
  EXPECT_EQ(s.ran_on_caller, 1);
}

// While a caller computes, it holds the one batch slot: what arrives meanwhile queues (the
// batch thread does not start a second batch next to it) and leaves as one batch after it.
TEST_F(BatcherTest, ACallerComputingHoldsTheBatchSlot) {
  options_.max_queue_delay = absl::ZeroDuration();
  Start();
  HoldBatchWith(1);
  std::thread caller([&] {
    auto task = Task(1);
    EXPECT_TRUE(batcher_->RunNowOrSchedule("k", &task).ok());
  });
  scheduled_ids_.push_back(1);
  busy_.WaitForNotification();
  for (int id : {2, 3}) {
    auto task = Task(id);
    ASSERT_TRUE(batcher_->RunNowOrSchedule("k", &task).ok());  // queued, returns at once
    EXPECT_EQ(task, nullptr);
    scheduled_ids_.push_back(id);
  }
  EXPECT_EQ(batcher_->stats().queued_requests, 2);
  release_.Notify();
  caller.join();
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  const auto batches = recorder_.batches();
  EXPECT_THAT(batches[0].ids, ElementsAre(1));
  EXPECT_THAT(batches[1].ids, ElementsAre(2, 3));
  EXPECT_EQ(batcher_->stats().ran_on_caller, 1);
}

// With compute_here, a task computed on the caller's thread goes to compute_here instead of
// process_batch, and holds the batch slot while compute_here runs: what arrives then queues and
// goes to the batch thread once compute_here has returned (the caller answers after that).
TEST_F(BatcherTest, RunNowComputesInComputeHereHoldingTheSlotWhileItRuns) {
  options_.max_queue_delay = absl::ZeroDuration();
  Start();
  TestBatcher::ProcessBatchFn process = recorder_.ProcessFn();  // records, as the batch thread's
  std::vector<int> here;
  bool first = true;
  std::function<void(const std::string&, TestBatcher::Batch)> compute_here =
      [&](const std::string& key, TestBatcher::Batch batch) {
        for (const auto& t : batch) here.push_back(t->id());
        if (first) {
          first = false;
          auto task = Task(2);
          ASSERT_TRUE(batcher_->RunNowOrSchedule("k", &task, compute_here).ok());  // queued
          EXPECT_EQ(task, nullptr);
          scheduled_ids_.push_back(2);
          EXPECT_EQ(batcher_->stats().queued_requests, 1);
        }
        process(key, std::move(batch));
      };
  auto task = Task(1);
  ASSERT_TRUE(batcher_->RunNowOrSchedule("k", &task, compute_here).ok());
  scheduled_ids_.push_back(1);
  EXPECT_EQ(task, nullptr);
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(here, ElementsAre(1));  // task 2 went to process_batch, on the batch thread
  const auto batches = recorder_.batches();
  EXPECT_THAT(batches[0].ids, ElementsAre(1));
  EXPECT_THAT(batches[1].ids, ElementsAre(2));
  EXPECT_EQ(batcher_->stats().ran_on_caller, 1);
}

// With a queue delay, a lone task waits for company as Schedule() makes it; refusals are
// Schedule()'s.
TEST_F(BatcherTest, RunNowIsScheduleWhenTasksWaitForCompanyOrAreRefused) {
  Start();  // max_queue_delay 10 ms
  auto task = Task(1);
  ASSERT_TRUE(batcher_->RunNowOrSchedule("k", &task).ok());
  scheduled_ids_.push_back(1);
  ASSERT_TRUE(clock_.BlockUntilWaiting(t0_ + absl::Milliseconds(10)));
  EXPECT_TRUE(recorder_.batches().empty());
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  auto expired = Task(2, 1, 1, clock_.Now());
  DropReason why = DropReason::kInvalid;
  EXPECT_EQ(batcher_->RunNowOrSchedule("k", &expired, &why).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(why, DropReason::kExpired);
  EXPECT_NE(expired, nullptr);
  EXPECT_EQ(batcher_->stats().ran_on_caller, 0);
}

// Shutdown() returns only after a caller's batch has ended.
TEST_F(BatcherTest, ShutdownWaitsForACallersBatch) {
  options_.max_queue_delay = absl::ZeroDuration();
  Start();
  HoldBatchWith(1);
  std::thread caller([&] {
    auto task = Task(1);
    EXPECT_TRUE(batcher_->RunNowOrSchedule("k", &task).ok());
  });
  scheduled_ids_.push_back(1);
  busy_.WaitForNotification();
  std::atomic<bool> shut_down{false};
  std::thread stopper([&] {
    batcher_->Shutdown(absl::ZeroDuration());
    shut_down = true;
  });
  EXPECT_FALSE(shut_down.load()) << "Shutdown returned while a caller was computing";
  release_.Notify();
  caller.join();
  stopper.join();
  EXPECT_TRUE(shut_down.load());
  EXPECT_EQ(batcher_->stats().processed, 1);
}

}  // namespace
}  // namespace attnserve::batching
