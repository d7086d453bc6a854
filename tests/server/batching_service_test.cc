// The server under concurrency: batching, deadlines, cancellation, backpressure, shutdown and
// streams, made deterministic with a backend whose gate the test controls.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "server/server_host.h"
#include "tests/testing/exposition.h"
#include "tests/testing/gated_server.h"
#include "tests/testing/requests.h"

namespace attnserve {
namespace {

using testing::AttendCase;
using testing::AttendShape;
using ::testing::HasSubstr;
using testing::MakeAttendCase;
using testing::MaxAbsError;
using testing::MetricSample;
using testing::TestThread;

// Start(), Spawn(), Block(), Metric(), Dropped(), Await() and AwaitMetric() are
// tests/testing/gated_server.h's. Threads are TestThreads: a failed ASSERT that returns while they
// run opens the gate and joins them, so that the failure is reported, not a std::terminate.
class BatchingServiceTest : public testing::GatedServerTest {};

TEST_F(BatchingServiceTest, SixtyFourConcurrentCallersWithMixedShapesGetReferenceResults) {
  server::ServerOptions options;
  options.batching.batcher.max_batch_requests = 16;
  options.batching.batcher.max_queue_delay = absl::Milliseconds(5);
  options.max_concurrent_streams = 0;  // the 64 and the blocker open at once on one connection
  Start(options);
  const AttendShape shapes[] = {{1, 4, 2, 8, 12, 16, 16},
                                {2, 4, 2, 3, 20, 16, 16},
                                {1, 2, 2, 5, 5, 32, 8},
                                {3, 8, 1, 4, 9, 8, 8}};
  std::vector<AttendCase> cases;
  for (int i = 0; i < 64; ++i) {
    cases.push_back(MakeAttendCase(v1::DTYPE_FLOAT32, shapes[i % 4], i % 3 == 0, i % 5 == 0,
                                   static_cast<uint32_t>(i + 1)));
  }
  std::vector<absl::StatusOr<v1::AttendResponse>> responses(64, absl::UnknownError("unset"));
  // All 64 queued behind a parked batch before any is computed, so that batches form whatever
  // the machine's timing (left to arrive on their own, the callers of a slowed run, under
  // ThreadSanitizer say, could each find the batch thread idle and go alone).
  TestThread blocker = Block();
  std::vector<TestThread> callers;
  for (int i = 0; i < 64; ++i) {
    callers.push_back(Spawn([&, i] { responses[i] = client_->Attend(cases[i].request); }));
  }
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 64));
  gate_->Open();
  for (auto& t : callers) t.join();
  blocker.join();
  int max_batch = 0;
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(responses[i].ok()) << i << ": " << responses[i].status();
    EXPECT_LE(MaxAbsError(TensorToFloats(responses[i]->output()).value(), cases[i].expected.out),
              1e-5)
        << i;
    if (i % 5 == 0) {
      EXPECT_LE(
          MaxAbsError(TensorToFloats(responses[i]->weights()).value(), cases[i].expected.weights),
          1e-6);
    }
    max_batch = std::max(max_batch, responses[i]->timing().batch_size());
  }
  EXPECT_GT(max_batch, 1) << "64 concurrent callers never shared a batch";
  // The 64 and the blocker.
  EXPECT_EQ(Metric("attnserve_requests_total", {"rpc=\"Attend\"", "code=\"OK\""}), 65);
}

// A request's bits do not depend on its batch: computed alone, then among companions.
void ExpectBatchInvariance(BatchingServiceTest* t, testing::GatedBackend* gate, Client* client) {
  AttendCase probe = MakeAttendCase(v1::DTYPE_FLOAT32, {2, 4, 2, 9, 17, 32, 32}, true, false, 7);
  auto alone = client->Attend(probe.request);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(alone->timing().batch_size(), 1);

  // Hold the batch thread, queue the probe among 15 companions of its signature, release.
  TestThread blocker = t->Block();
  std::vector<AttendCase> companions;
  for (int i = 0; i < 15; ++i) {
    companions.push_back(MakeAttendCase(v1::DTYPE_FLOAT32, {1 + i % 3, 4, 2, 3 + i, 20 - i, 32, 32},
                                        i % 2 == 0, false, 100 + i));
  }
  std::vector<TestThread> callers;
  absl::StatusOr<v1::AttendResponse> batched = absl::UnknownError("unset");
  for (int i = 0; i < 8; ++i) {
    callers.push_back(
        t->Spawn([&, i] { EXPECT_TRUE(client->Attend(companions[i].request).ok()); }));
  }
  callers.push_back(t->Spawn([&] { batched = client->Attend(probe.request); }));
  for (int i = 8; i < 15; ++i) {
    callers.push_back(
        t->Spawn([&, i] { EXPECT_TRUE(client->Attend(companions[i].request).ok()); }));
  }
  ASSERT_TRUE(t->AwaitMetric("attnserve_queued_requests", {}, 16));
  gate->Open();
  for (auto& c : callers) c.join();
  blocker.join();
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ(batched->timing().batch_size(), 16);
  EXPECT_EQ(batched->output().data(), alone->output().data()) << "bits differ batched vs alone";
}

TEST_F(BatchingServiceTest, OutputBitsAreTheSameBatchedOrAlone) {
  server::ServerOptions options;
  options.batching.batcher.max_batch_requests = 32;
  options.batching.batcher.max_queue_delay = absl::Milliseconds(1);
  Start(options);
  ExpectBatchInvariance(this, gate_, client_.get());
}

TEST_F(BatchingServiceTest, OutputBitsAreTheSameBatchedOrAloneOnTheDefaultBackend) {
  server::ServerOptions options;
  options.batching.batcher.max_batch_requests = 32;
  options.batching.batcher.max_queue_delay = absl::Milliseconds(1);
  auto inner = kernels::MakeBackend("auto", {.threads = 2});
  ASSERT_TRUE(inner.ok());
  auto gated = std::make_unique<testing::GatedBackend>(*std::move(inner));
  gate_ = gated.get();
  Start(options, std::move(gated));
  ExpectBatchInvariance(this, gate_, client_.get());
}

TEST_F(BatchingServiceTest, ADeadlineThatPassesInTheQueueIsAnsweredWithoutComputing) {
  Start({});
  TestThread blocker = Block();
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  auto r = client_->Attend(c.request, absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  const size_t calls = gate_->batch_sizes().size();
  // The backend stays blocked until the server has dropped the request: the server learns of the
  // deadline by its own timer or by the client's cancel, whichever comes first (on a loaded
  // machine the call may even reach the server after the client gave up), and either one takes
  // the request out of the queue while the batch thread is busy. It is counted as a drop in the
  // queue ("deadline"), as refused at arrival because the queue ahead outlasts its deadline
  // ("unmeetable"), or, when the client's cancel arrives before the server's own deadline by
  // more than call.h's skew allows, as "cancelled": which one depends on scheduling; that it is
  // counted once, and never computed, does not.
  EXPECT_TRUE(Await([&] {
    return Dropped("deadline") + Dropped("unmeetable") + Dropped("cancelled") == 1;
  })) << "the expired request was not counted as dropped";
  gate_->Open();
  blocker.join();
  EXPECT_EQ(gate_->batch_sizes().size(), calls) << "the expired request reached the backend";
}

TEST_F(BatchingServiceTest, ACancelledCallLeavesTheQueueAtOnce) {
  Start({});
  TestThread blocker = Block();
  auto stub = v1::AttentionService::NewStub(client_->channel().shared_from_this());
  grpc::ClientContext context;
  TestThread caller = Spawn([&] {
    v1::AttendResponse response;
    AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
    EXPECT_EQ(stub->Attend(&context, c.request, &response).error_code(),
              grpc::StatusCode::CANCELLED);
  });
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 1));
  context.TryCancel();
  caller.join();
  // Dropped while the batch thread is still busy: the cancellation swept the queue.
  EXPECT_TRUE(AwaitMetric("attnserve_requests_dropped_total", {"reason=\"cancelled\""}, 1));
  EXPECT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 0));
  gate_->Open();
  blocker.join();
}

TEST_F(BatchingServiceTest, AFullQueueAnswersUnavailableAtOnceAndRecovers) {
  server::ServerOptions options;
  options.batching.batcher.max_queued_requests = 2;
  Start(options);
  TestThread blocker = Block();
  std::vector<TestThread> queued;
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  for (int i = 0; i < 2; ++i) {
    queued.push_back(Spawn([&] { EXPECT_TRUE(client_->Attend(c.request).ok()); }));
  }
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 2));
  // The gate is closed: only an answer that does not wait for the queue can arrive.
  // Through a stub, to read the trailers: the refusal asks for a retry pushback (gRFC A6).
  auto stub = v1::AttentionService::NewStub(client_->channel().shared_from_this());
  grpc::ClientContext context;
  v1::AttendResponse response;
  const grpc::Status refused = stub->Attend(&context, c.request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("retry with backoff"));
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto pushback = trailers.find("grpc-retry-pushback-ms");
  ASSERT_NE(pushback, trailers.end());
  EXPECT_GE(std::stoll(std::string(pushback->second.data(), pushback->second.size())), 1);
  EXPECT_TRUE(AwaitMetric("attnserve_requests_dropped_total", {"reason=\"queue_full\""}, 1));
  gate_->Open();
  for (auto& t : queued) t.join();
  blocker.join();
  EXPECT_TRUE(client_->Attend(c.request).ok());
}

TEST_F(BatchingServiceTest, ShutdownFinishesTheRunningBatchAndAnswersTheQueueUnavailable) {
  Start({});
  TestThread blocker = Block();
  std::vector<absl::Status> results(3);
  std::vector<TestThread> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(Spawn([&, i] {
      AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false, i + 1);
      results[i] = client_->Attend(c.request).status();
    }));
  }
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 3));
  TestThread shutdown = Spawn([&] { host_->Shutdown(absl::Milliseconds(200)); });
  // The grace period ends with the running batch still held at the gate: the queue is answered
  // UNAVAILABLE (an event to wait for, not a time: a busy machine may start the thread late).
  ASSERT_TRUE(AwaitMetric("attnserve_requests_dropped_total", {"reason=\"shutdown\""}, 3));
  gate_->Open();  // the running batch completes
  shutdown.join();
  blocker.join();  // EXPECTs the blocker's OK
  for (auto& t : queued) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  EXPECT_EQ(Metric("attnserve_requests_dropped_total", {"reason=\"shutdown\""}), 3);
}

TEST_F(BatchingServiceTest, StreamAnswersEveryRequestWithItsIdAndKeepsGoingAfterAnError) {
  server::ServerOptions options;
  options.limits.max_stream_in_flight = 4;  // exercise the read pause
  Start(options);
  auto stub = v1::AttentionService::NewStub(client_->channel().shared_from_this());
  grpc::ClientContext context;
  auto stream = stub->AttentionStream(&context);
  std::vector<AttendCase> cases;
  for (int i = 0; i < 20; ++i) {
    cases.push_back(
        MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 1, 3 + i % 4, 6, 8, 8}, i % 2 == 1, false, i + 1));
  }
  TestThread writer = Spawn([&] {
    for (int i = 0; i < 20; ++i) {
      v1::AttentionStreamRequest request;
      request.set_request_id(1000 + i);
      *request.mutable_attend() = cases[i].request;
      if (i == 7) request.mutable_attend()->clear_key();  // invalid
      ASSERT_TRUE(stream->Write(request));
    }
    v1::AttentionStreamRequest mha;
    mha.set_request_id(5000);
    mha.mutable_multi_head_attention()->set_module("demo");
    *mha.mutable_multi_head_attention()->mutable_query() =
        MakeTensor(v1::DTYPE_FLOAT32, {1, 3, 64}, testing::RandomNormal(192, 5));
    ASSERT_TRUE(stream->Write(mha));
    stream->WritesDone();
  });
  std::map<uint64_t, v1::AttentionStreamResponse> got;
  v1::AttentionStreamResponse response;
  while (stream->Read(&response)) {
    EXPECT_TRUE(got.emplace(response.request_id(), response).second) << "duplicate id";
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(got.size(), 21u);
  for (int i = 0; i < 20; ++i) {
    const v1::AttentionStreamResponse& r = got.at(1000 + i);
    if (i == 7) {
      EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_THAT(r.message(), HasSubstr("key is required"));
      continue;
    }
    ASSERT_EQ(r.code(), 0) << r.message();
    EXPECT_LE(MaxAbsError(TensorToFloats(r.attend().output()).value(), cases[i].expected.out),
              1e-5);
  }
  EXPECT_EQ(got.at(5000).code(), 0);
  EXPECT_THAT(got.at(5000).multi_head_attention().output().shape(),
              ::testing::ElementsAre(1, 3, 64));
}

TEST_F(BatchingServiceTest, WithBatchingOffEveryBatchHoldsOneRequest) {
  server::ServerOptions options;
  options.batching.enabled = false;
  Start(options);
  std::vector<TestThread> callers;
  for (int i = 0; i < 8; ++i) {
    callers.push_back(Spawn([&, i] {
      AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false, i + 1);
      auto r = client_->Attend(c.request);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->timing().batch_size(), 1);
    }));
  }
  for (auto& t : callers) t.join();
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->batching().enabled());
  EXPECT_EQ(info->batching().max_batch_requests(), 1);
  EXPECT_EQ(info->batching().inline_max_flops(), server::BatchingOptions{}.inline_max_flops);
}

TEST(BatchingOptionsTest, ANegativeOrNanInlineMaxFlopsIsRefusedAtStart) {
  auto metrics = metrics::Metrics::Create({}).value();
  for (double bad : {-1.0, std::nan("")}) {
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.batching.inline_max_flops = bad;
    auto host = server::ServerHost::Start(options, metrics.get());
    ASSERT_FALSE(host.ok()) << "started with inline_max_flops " << bad;
    EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(host.status().message(), HasSubstr("inline_max_flops must be >= 0; was "));
  }
}

}  // namespace
}  // namespace attnserve
