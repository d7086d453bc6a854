#include "server/batching/batcher_options.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/batcher.h"
#include "tests/server/batching/test_task.h"

namespace attnserve::batching {
namespace {

using testing::TestBatcher;

void ExpectInvalid(const BatcherOptions& options, const std::string& message) {
  const absl::Status status = ValidateBatcherOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), message);
}

TEST(BatcherOptionsTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateBatcherOptions(BatcherOptions()).ok());
}

TEST(BatcherOptionsTest, MessagesNameTheFieldAndEchoTheValue) {
  BatcherOptions o;
  o.max_batch_requests = 0;
  ExpectInvalid(o, "max_batch_requests must be positive; was 0");
  o = BatcherOptions();
  o.max_batch_tokens = -5;
  ExpectInvalid(o, "max_batch_tokens must be positive; was -5");
  o = BatcherOptions();
  o.max_queue_delay = absl::Milliseconds(-1);
  ExpectInvalid(o, "max_queue_delay must be >= 0 and finite; was -1ms");
  o.max_queue_delay = absl::InfiniteDuration();
  ExpectInvalid(o, "max_queue_delay must be >= 0 and finite; was inf");
  o = BatcherOptions();
  o.max_queued_requests = 0;
  ExpectInvalid(o, "max_queued_requests must be positive; was 0");
  o = BatcherOptions();
  o.max_queued_bytes = 0;
  ExpectInvalid(o, "max_queued_bytes must be positive; was 0");
  o = BatcherOptions();
  o.num_batch_threads = 0;
  ExpectInvalid(o, "num_batch_threads must be in [1, 1024]; was 0");
  o.num_batch_threads = 5000;
  ExpectInvalid(o, "num_batch_threads must be in [1, 1024]; was 5000");
}

TEST(BatcherOptionsTest, ZeroDelayIsValid) {
  BatcherOptions o;
  o.max_queue_delay = absl::ZeroDuration();
  EXPECT_TRUE(ValidateBatcherOptions(o).ok());
}

TEST(BatcherOptionsTest, CreateValidatesOptionsAndCallbacks) {
  BatcherOptions bad;
  bad.max_batch_requests = 0;
  auto reject = [](std::unique_ptr<testing::TestTask>, absl::Status, DropReason) {};
  auto process = [](const std::string&, TestBatcher::Batch) {};
  auto batcher = TestBatcher::Create(bad, process, reject);
  ASSERT_FALSE(batcher.ok());
  EXPECT_EQ(batcher.status().message(), "max_batch_requests must be positive; was 0");

  batcher = TestBatcher::Create(BatcherOptions(), nullptr, reject);
  ASSERT_FALSE(batcher.ok());
  EXPECT_EQ(batcher.status().message(), "process_batch must be set; was empty");
  batcher = TestBatcher::Create(BatcherOptions(), process, nullptr);
  ASSERT_FALSE(batcher.ok());
  EXPECT_EQ(batcher.status().message(), "reject must be set; was empty");

  batcher = TestBatcher::Create(BatcherOptions(), process, reject);  // the real clock
  ASSERT_TRUE(batcher.ok()) << batcher.status();
}

}  // namespace
}  // namespace attnserve::batching
