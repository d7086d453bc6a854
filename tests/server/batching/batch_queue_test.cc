// The batching rules, single-threaded and exact: server/batching/batch_queue.h and
// batch_policy.h.
#include "server/batching/batch_queue.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/batch_policy.h"
#include "server/batching/cost_model.h"
#include "tests/server/batching/test_task.h"

namespace attnserve::batching {
namespace {

using ::testing::ElementsAre;
using testing::TaskRegistry;
using testing::TestTask;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

class BatchQueueTest : public ::testing::Test {
 protected:
  QueuedTask<TestTask> Make(int id, int64_t tokens, absl::Time enqueued = kT0,
                            absl::Time deadline = absl::InfiniteFuture(), int64_t bytes = 1) {
    return {std::make_unique<TestTask>(&registry_, id, tokens, bytes, deadline), tokens, bytes,
            deadline, enqueued};
  }
  static std::vector<int> Ids(const std::vector<QueuedTask<TestTask>>& batch) {
    std::vector<int> ids;
    for (const auto& t : batch) ids.push_back(t.task->id());
    return ids;
  }

  TaskRegistry registry_;
  FixedCostModel no_cost_{absl::ZeroDuration(), absl::ZeroDuration()};
  BatchLimits limits_{/*max_requests=*/3, /*max_tokens=*/10,
                      /*max_queue_delay=*/absl::Milliseconds(10)};
  BatchQueue<TestTask> queue_;
  std::vector<QueuedTask<TestTask>> batch_;
  std::vector<DroppedTask<TestTask>> dropped_;
};

TEST_F(BatchQueueTest, EmptyQueueIsNeverDue) {
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), absl::InfiniteFuture());
}

TEST_F(BatchQueueTest, PartialBatchIsDueAtOldestPlusMaxDelay) {
  queue_.Push(Make(1, 1, kT0));
  queue_.Push(Make(2, 1, kT0 + absl::Milliseconds(4)));
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), kT0 + absl::Milliseconds(10));
}

TEST_F(BatchQueueTest, FullByCountIsDueNow) {
  for (int i = 0; i < 3; ++i) queue_.Push(Make(i, 1));
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), absl::InfinitePast());
}

TEST_F(BatchQueueTest, FullByTokensIsDueNow) {
  queue_.Push(Make(1, 6));
  EXPECT_NE(queue_.DispatchTime(limits_, no_cost_), absl::InfinitePast());
  queue_.Push(Make(2, 5));  // 6 + 5 > 10: the head batch cannot grow any more.
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), absl::InfinitePast());
}

TEST_F(BatchQueueTest, ExactlyMaxTokensIsFull) {
  queue_.Push(Make(1, 4));
  queue_.Push(Make(2, 6));
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), absl::InfinitePast());
}

TEST_F(BatchQueueTest, DeadlineBringsDispatchForwardByTheEstimate) {
  FixedCostModel cost(absl::Milliseconds(1), absl::Milliseconds(1));  // 1 ms + 1 ms/token
  queue_.Push(Make(1, 2, kT0));
  queue_.Push(Make(2, 1, kT0, /*deadline=*/kT0 + absl::Milliseconds(8)));
  // Batch of 3 tokens: estimate 4 ms, so it must leave by 8 - 4 = 4 ms, before the 10 ms delay.
  EXPECT_EQ(queue_.DispatchTime(limits_, cost), kT0 + absl::Milliseconds(4));
  // A distant deadline does not matter.
  BatchQueue<TestTask> other;
  other.Push(Make(3, 1, kT0, kT0 + absl::Seconds(1)));
  EXPECT_EQ(other.DispatchTime(limits_, cost), kT0 + absl::Milliseconds(10));
}

TEST_F(BatchQueueTest, PacksByCountInArrivalOrder) {
  for (int i = 1; i <= 5; ++i) queue_.Push(Make(i, 1));
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(1, 2, 3));
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(4, 5));
  EXPECT_TRUE(queue_.empty());
  EXPECT_TRUE(dropped_.empty());
}

TEST_F(BatchQueueTest, TaskThatWouldOverflowTokensStartsTheNextBatch) {
  queue_.Push(Make(1, 4));
  queue_.Push(Make(2, 4));
  queue_.Push(Make(3, 4));  // 12 > 10
  queue_.Push(Make(4, 1));  // would fit, but does not overtake task 3
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(1, 2));
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(3, 4));
}

TEST_F(BatchQueueTest, TaskLargerThanMaxTokensGoesAlone) {
  queue_.Push(Make(1, 25));
  queue_.Push(Make(2, 1));
  EXPECT_EQ(queue_.DispatchTime(limits_, no_cost_), absl::InfinitePast());
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(1));
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(2));
}

TEST_F(BatchQueueTest, ExpiredAndCancelledTasksAreDroppedNotBatched) {
  queue_.Push(Make(1, 1, kT0, /*deadline=*/kT0 + absl::Milliseconds(5)));
  queue_.Push(Make(2, 1));
  queue_.Push(Make(3, 1));
  queue_.Push(Make(4, 1, kT0, /*deadline=*/kT0 + absl::Milliseconds(6)));  // exactly now
  queue_.Push(Make(5, 1));
  batch_.clear();
  std::vector<QueuedTask<TestTask>> all;
  // Cancel task 3 through a peek at the queue's tasks: pop all, cancel, push back.
  queue_.PopAll(&all);
  all[2].task->Cancel();
  for (auto& t : all) queue_.Push(std::move(t));

  queue_.PopBatch(kT0 + absl::Milliseconds(6), limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(2, 5));
  ASSERT_EQ(dropped_.size(), 3u);
  EXPECT_EQ(dropped_[0].queued.task->id(), 1);
  EXPECT_EQ(dropped_[0].reason, DropReason::kExpired);
  EXPECT_EQ(dropped_[1].queued.task->id(), 3);
  EXPECT_EQ(dropped_[1].reason, DropReason::kCancelled);
  EXPECT_EQ(dropped_[2].queued.task->id(), 4);
  EXPECT_EQ(dropped_[2].reason, DropReason::kExpired);
}

TEST_F(BatchQueueTest, RemoveCancelledSweepsTheWholeQueueKeepingOrder) {
  std::vector<TestTask*> tasks;
  for (int i = 1; i <= 6; ++i) {
    auto t = Make(i, 1);
    tasks.push_back(t.task.get());
    queue_.Push(std::move(t));
  }
  tasks[1]->Cancel();
  tasks[4]->Cancel();
  queue_.RemoveCancelled(&dropped_);
  ASSERT_EQ(dropped_.size(), 2u);
  EXPECT_EQ(dropped_[0].queued.task->id(), 2);
  EXPECT_EQ(dropped_[1].queued.task->id(), 5);
  EXPECT_EQ(queue_.size(), 4u);
  queue_.PopBatch(kT0, limits_, &batch_, &dropped_);
  EXPECT_THAT(Ids(batch_), ElementsAre(1, 3, 4));
}

using Policy = BatchPolicy<std::string, TestTask, absl::Hash<std::string>, std::equal_to<>>;

TEST_F(BatchQueueTest, AdmissionCountsRequestsAndBytesOverAllKeys) {
  Policy policy(limits_, /*max_queued_requests=*/3, /*max_queued_bytes=*/100);
  EXPECT_EQ(policy.CanAdmit(101), Admission::kLargerThanBudget);
  policy.Add("a", Make(1, 1, kT0, absl::InfiniteFuture(), /*bytes=*/60));
  EXPECT_EQ(policy.CanAdmit(41), Admission::kOverByteBudget);
  EXPECT_EQ(policy.CanAdmit(40), Admission::kOk);
  policy.Add("b", Make(2, 1, kT0, absl::InfiniteFuture(), 20));
  policy.Add("c", Make(3, 1, kT0, absl::InfiniteFuture(), 20));
  EXPECT_EQ(policy.CanAdmit(0), Admission::kQueueFull);
  EXPECT_EQ(policy.queued_requests(), 3);
  EXPECT_EQ(policy.queued_bytes(), 100);
}

TEST_F(BatchQueueTest, PolicyKeepsKeysApartAndPicksTheEarliestDueQueue) {
  Policy policy(limits_, 100, 1000);
  policy.Add("b", Make(1, 1, kT0 + absl::Milliseconds(2)));
  policy.Add("a", Make(2, 1, kT0));
  policy.Add("b", Make(3, 1, kT0 + absl::Milliseconds(3)));
  EXPECT_EQ(policy.NextDispatchTime(no_cost_, false), kT0 + absl::Milliseconds(10));
  EXPECT_FALSE(
      policy.PopReadyBatch(kT0 + absl::Milliseconds(9), no_cost_, false, &batch_, &dropped_)
          .has_value());
  auto key =
      policy.PopReadyBatch(kT0 + absl::Milliseconds(12), no_cost_, false, &batch_, &dropped_);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(*key, "a");
  EXPECT_THAT(Ids(batch_), ElementsAre(2));
  key = policy.PopReadyBatch(kT0 + absl::Milliseconds(12), no_cost_, false, &batch_, &dropped_);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(*key, "b");
  EXPECT_THAT(Ids(batch_), ElementsAre(1, 3));
  EXPECT_TRUE(policy.empty());
  EXPECT_EQ(policy.NextDispatchTime(no_cost_, false), absl::InfiniteFuture());
  EXPECT_EQ(policy.queued_bytes(), 0);
}

TEST_F(BatchQueueTest, DrainingMakesEveryQueueDueNow) {
  Policy policy(limits_, 100, 1000);
  policy.Add("a", Make(1, 1));
  EXPECT_EQ(policy.NextDispatchTime(no_cost_, /*draining=*/true), absl::InfinitePast());
  auto key = policy.PopReadyBatch(kT0, no_cost_, /*draining=*/true, &batch_, &dropped_);
  ASSERT_TRUE(key.has_value());
  EXPECT_THAT(Ids(batch_), ElementsAre(1));
}

TEST_F(BatchQueueTest, PolicyAccountsForDroppedTasks) {
  Policy policy(limits_, 100, 1000);
  policy.Add("a", Make(1, 1, kT0, kT0 + absl::Milliseconds(1), /*bytes=*/7));
  auto key = policy.PopReadyBatch(kT0 + absl::Seconds(1), no_cost_, false, &batch_, &dropped_);
  ASSERT_TRUE(key.has_value());
  EXPECT_TRUE(batch_.empty());
  ASSERT_EQ(dropped_.size(), 1u);
  EXPECT_EQ(policy.queued_requests(), 0);
  EXPECT_EQ(policy.queued_bytes(), 0);
}

TEST(EwmaCostModelTest, LearnsTimePerToken) {
  EwmaCostModel model(/*margin=*/absl::Milliseconds(1));
  EXPECT_EQ(model.Estimate(100), absl::Milliseconds(1));
  model.Record(100, absl::Milliseconds(10));  // first sample: 100 us/token
  EXPECT_EQ(model.Estimate(10), absl::Milliseconds(2));
  model.Record(100, absl::Milliseconds(20));  // 200 us/token sample: 100 + 0.2 * 100 = 120
  EXPECT_NEAR(absl::ToDoubleMicroseconds(model.time_per_token()), 120.0, 1e-6);
  model.Record(0, absl::Seconds(1));  // ignored
  EXPECT_NEAR(absl::ToDoubleMicroseconds(model.time_per_token()), 120.0, 1e-6);
}

}  // namespace
}  // namespace attnserve::batching
