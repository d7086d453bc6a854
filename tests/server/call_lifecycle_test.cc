// One call's life, end to end through a real server and client: what a caller sees and what the
// metrics count agree (late answers, refusals by reason), cancellation reaches the queue from
// unary calls and streams, the queue is shared fairly between connections, and the stream
// protocol's edge cases (duplicate ids, unparseable messages, empty items). A gated backend
// makes every ordering deterministic; no test depends on a timing window.
#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpc/grpc.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "server/batching/cost_model.h"
#include "server/core/call.h"
#include "server/server_host.h"
#include "server/transport/attention_service.h"
#include "server/transport/wire.h"
#include "tests/testing/exposition.h"
#include "tests/testing/gated_server.h"
#include "tests/testing/requests.h"

namespace attnserve {
namespace {

using testing::AttendCase;
using ::testing::HasSubstr;
using testing::MakeAttendCase;
using testing::MetricSample;
using testing::TestThread;

constexpr char kStreamMethod[] = "/attnserve.v1.AttentionService/AttentionStream";
constexpr char kAttendMethod[] = "/attnserve.v1.AttentionService/Attend";

// A channel with a connection of its own (channels with equal arguments share connections).
std::shared_ptr<grpc::Channel> OwnConnection(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

grpc::ByteBuffer Bytes(const google::protobuf::Message& message) {
  grpc::ByteBuffer bytes;
  server::SerializeMessage(message, &bytes);
  return bytes;
}
grpc::ByteBuffer Garbage() {
  // A tag varint that never ends: no protobuf message parses from it.
  const std::string bytes(12, '\xff');
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

using RawStream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
std::unique_ptr<RawStream> OpenRawStream(grpc::Channel* channel, grpc::ClientContext* context) {
  return std::unique_ptr<RawStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel,
          grpc::internal::RpcMethod(kStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING),
          context));
}

v1::AttentionStreamRequest StreamItem(uint64_t id, uint32_t seed) {
  v1::AttentionStreamRequest request;
  request.set_request_id(id);
  *request.mutable_attend() =
      MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false, seed).request;
  return request;
}

// Spawn(), Block(), Metric(), Dropped() and AwaitMetric() are tests/testing/gated_server.h's.
// Threads are TestThreads: a failed ASSERT that returns while they run opens the gate and joins
// them, so that the failure is reported, not a std::terminate.
class CallLifecycleTest : public testing::GatedServerTest {
 public:
  void Start(server::ServerOptions options = {}) {
    GatedServerTest::Start(std::move(options));
    stub_ = v1::AttentionService::NewStub(client_->channel().shared_from_this());
  }
  double Requests(const std::string& rpc, const std::string& code) {
    return Metric("attnserve_requests_total", {"rpc=\"" + rpc + "\"", "code=\"" + code + "\""});
  }

  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

TEST_F(CallLifecycleTest, AResultReadyAfterTheDeadlineIsCountedAsDeadlineExceeded) {
  Start();
  gate_->Close();
  const int calls_before = static_cast<int>(gate_->batch_sizes().size());  // the warm-up's
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  absl::Status seen;
  TestThread caller = Spawn([&] { seen = client_->Attend(c.request, absl::Seconds(1)).status(); });
  gate_->AwaitCalls(calls_before + 1);  // computing: past the queue, held in the backend
  // The server received the call before now, so its deadline (receipt + the 1 s the call
  // carried, rounded up by at most a unit of the timeout header) is before `bound`. Waiting
  // past it is a bound, not a window: waiting longer cannot change the outcome.
  const absl::Time bound = absl::Now() + absl::Milliseconds(1100);
  caller.join();  // the caller gave up at its deadline
  EXPECT_EQ(seen.code(), absl::StatusCode::kDeadlineExceeded);
  absl::SleepFor(bound - absl::Now());
  gate_->Open();  // the result is ready now, too late
  ASSERT_TRUE(
      AwaitMetric("attnserve_requests_total", {"rpc=\"Attend\"", "code=\"DEADLINE_EXCEEDED\""}, 1));
  EXPECT_EQ(Requests("Attend", "OK"), 0) << "counted OK although the caller never saw it";
  EXPECT_EQ(Dropped("late"), 1);
}

TEST_F(CallLifecycleTest, ACallTheQueueAheadWouldMakeLateIsRefusedAtArrivalAndCounted) {
  server::ServerOptions options;
  // Every token "costs" 1000 s: no request with a deadline can be computed in time.
  options.batching.batcher.cost_model =
      std::make_shared<batching::FixedCostModel>(absl::ZeroDuration(), absl::Seconds(1000));
  Start(options);
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  const size_t calls = gate_->batch_sizes().size();  // the warm-up's
  auto refused = client_->Attend(c.request, absl::Seconds(60));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(), HasSubstr("refused without queueing"));
  EXPECT_EQ(Requests("Attend", "DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(Dropped("unmeetable"), 1);
  EXPECT_EQ(gate_->batch_sizes().size(), calls) << "the refused request reached the backend";
  // Without a deadline nothing is unmeetable (a plain channel: the client sets a default one).
  grpc::ClientContext context;
  v1::AttendResponse response;
  const grpc::Status status =
      v1::AttentionService::NewStub(OwnConnection(target_))->Attend(&context, c.request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(CallLifecycleTest, RefusalsBeforeTheQueueAreCountedByReason) {
  server::ServerOptions options;
  options.batching.batcher.max_queued_requests = 1;
  Start(options);
  TestThread blocker = Block();
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  TestThread queued = Spawn([&] { EXPECT_TRUE(client_->Attend(c.request).ok()); });
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 1));
  // Same connection, so no fair-share room is made: refused, counted at once (not at a scrape).
  EXPECT_EQ(client_->Attend(c.request).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Dropped("queue_full"), 1);
  EXPECT_EQ(Requests("Attend", "UNAVAILABLE"), 1);
  gate_->Open();
  queued.join();
  blocker.join();
}

TEST_F(CallLifecycleTest, AFloodingConnectionCannotKeepAnotherOutOfTheQueue) {
  server::ServerOptions options;
  options.batching.batcher.max_queued_requests = 4;
  Start(options);
  TestThread blocker = Block();
  auto flooder = v1::AttentionService::NewStub(OwnConnection(target_));
  auto polite = v1::AttentionService::NewStub(OwnConnection(target_));
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  std::vector<grpc::Status> flood(4);
  std::vector<TestThread> flooding;
  for (int i = 0; i < 4; ++i) {
    flooding.push_back(Spawn([&, i] {
      grpc::ClientContext context;
      v1::AttendResponse response;
      flood[i] = flooder->Attend(&context, c.request, &response);
    }));
  }
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 4));  // the flooder filled it
  grpc::Status polite_status;
  TestThread polite_caller = Spawn([&] {
    grpc::ClientContext context;
    v1::AttendResponse response;
    polite_status = polite->Attend(&context, c.request, &response);
  });
  // The polite caller's request took the place of the flooder's newest one.
  ASSERT_TRUE(AwaitMetric("attnserve_requests_dropped_total", {"reason=\"fair_share\""}, 1));
  EXPECT_EQ(Metric("attnserve_queued_requests", {}), 4);
  gate_->Open();
  polite_caller.join();
  for (auto& t : flooding) t.join();
  blocker.join();
  EXPECT_TRUE(polite_status.ok()) << polite_status.error_message();
  int shed = 0;
  for (const grpc::Status& s : flood) {
    if (s.ok()) continue;
    ++shed;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr("shared fairly"));
  }
  EXPECT_EQ(shed, 1);
}

TEST_F(CallLifecycleTest, CancellingAStreamTakesItsRequestsOutOfTheQueueAtOnce) {
  Start();
  TestThread blocker = Block();
  grpc::ClientContext context;
  auto stream = stub_->AttentionStream(&context);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(stream->Write(StreamItem(id, id)));
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 3));
  context.TryCancel();
  // Left the queue while the batch thread is still held: the stream told the batcher.
  EXPECT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 0));
  EXPECT_TRUE(AwaitMetric("attnserve_requests_dropped_total", {"reason=\"cancelled\""}, 3));
  EXPECT_EQ(Requests("Attend", "CANCELLED"), 3);
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  gate_->Open();
  blocker.join();
}

TEST_F(CallLifecycleTest, ADuplicateInFlightRequestIdIsRefusedAndTheStreamGoesOn) {
  Start();
  TestThread blocker = Block();
  grpc::ClientContext context;
  auto stream = stub_->AttentionStream(&context);
  ASSERT_TRUE(stream->Write(StreamItem(7, 1)));  // queued behind the blocker
  ASSERT_TRUE(stream->Write(StreamItem(7, 2)));  // the same id while the first is in flight
  v1::AttentionStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));  // the first answer can only be the duplicate's
  EXPECT_EQ(response.request_id(), 7u);
  EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(response.message(), HasSubstr("request_id 7 is already in flight"));
  gate_->Open();
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 7u);
  EXPECT_EQ(response.code(), 0) << response.message();
  // Answered, the id is free again.
  ASSERT_TRUE(stream->Write(StreamItem(7, 3)));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.code(), 0) << response.message();
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
  blocker.join();
}

TEST_F(CallLifecycleTest, AnUnparseableStreamMessageEndsTheStreamAfterTheAnswersBeforeIt) {
  Start();
  auto channel = OwnConnection(target_);
  grpc::ClientContext context;
  auto stream = OpenRawStream(channel.get(), &context);
  ASSERT_TRUE(stream->Write(Bytes(StreamItem(1, 1))));
  ASSERT_TRUE(stream->Write(Garbage()));
  stream->Write(Bytes(StreamItem(3, 3)));  // never read by the server
  stream->WritesDone();
  std::vector<uint64_t> answered;
  grpc::ByteBuffer bytes;
  while (stream->Read(&bytes)) {
    v1::AttentionStreamResponse response;
    ASSERT_TRUE(server::ParseMessage(bytes, &response));
    EXPECT_EQ(response.code(), 0) << response.message();
    answered.push_back(response.request_id());
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("message 2 of the stream"));
  EXPECT_THAT(answered, ::testing::ElementsAre(1u));
  EXPECT_EQ(Requests("AttentionStream", "INVALID_ARGUMENT"), 1);
  EXPECT_EQ(Requests("Attend", "OK"), 1);
}

TEST_F(CallLifecycleTest, AnUnparseableUnaryMessageIsInvalidArgumentAndCounted) {
  Start();
  auto channel = OwnConnection(target_);
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod(kAttendMethod, grpc::internal::RpcMethod::NORMAL_RPC), &context,
      Garbage(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("is not a valid attnserve.v1.AttendRequest"));
  EXPECT_EQ(Requests("Attend", "INVALID_ARGUMENT"), 1);
}

// The server checks --max_message_bytes itself (gRPC is told twice as much), so that an
// oversized request is refused with a message naming the flag and counted as the caller saw it.
TEST_F(CallLifecycleTest, AMessageOverTheSizeLimitIsRefusedNamingTheFlagAndCounted) {
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 16, 16, 8, 8}, false, false);
  const int64_t size = static_cast<int64_t>(c.request.ByteSizeLong());
  server::ServerOptions options;
  options.limits.max_message_bytes = size - 1;
  Start(options);
  const size_t calls = gate_->batch_sizes().size();  // the warm-up's
  const absl::Status refused = client_->Attend(c.request).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("the AttendRequest is ", size,
                                                        " bytes, over the server's limit of ",
                                                        size - 1, " (--max_message_bytes)")));
  EXPECT_EQ(Requests("Attend", "RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(gate_->batch_sizes().size(), calls) << "the refused request reached the backend";

  // In a stream: the request before it is answered, then the stream ends with the refusal.
  grpc::ClientContext context;
  auto stream = stub_->AttentionStream(&context);
  v1::AttentionStreamRequest small = StreamItem(1, 1);
  v1::AttentionStreamRequest big;
  big.set_request_id(2);
  *big.mutable_attend() = c.request;
  ASSERT_TRUE(stream->Write(small));
  v1::AttentionStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));  // answered before the big one is sent
  EXPECT_EQ(response.request_id(), 1u);
  EXPECT_EQ(response.code(), 0);
  stream->Write(big);
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("message 2 of the stream"));
  EXPECT_THAT(ended.error_message(), HasSubstr("(--max_message_bytes)"));
  EXPECT_EQ(Requests("AttentionStream", "RESOURCE_EXHAUSTED"), 1);
}

TEST(LimitsTest, GrpcIsToldTwiceTheMessageLimitAtMostIntMax) {
  server::Limits limits;
  limits.max_message_bytes = 4096;
  EXPECT_EQ(server::GrpcReceiveLimit(limits), 8192);
  limits.max_message_bytes = std::numeric_limits<int>::max() / 2 + 1;
  EXPECT_EQ(server::GrpcReceiveLimit(limits), std::numeric_limits<int>::max());
  limits.max_message_bytes = std::numeric_limits<int64_t>::max();  // no overflow (UBSan)
  EXPECT_EQ(server::GrpcReceiveLimit(limits), std::numeric_limits<int>::max());
}

// Beyond twice the limit gRPC refuses the message before the server sees it: the caller gets
// RESOURCE_EXHAUSTED, and the server, told only that the message did not arrive, counts a
// cancelled call (as server/transport/limits.h documents).
TEST_F(CallLifecycleTest, AMessageOverTwiceTheLimitIsRefusedByGrpc) {
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 16, 16, 8, 8}, false, false);
  server::ServerOptions options;
  options.limits.max_message_bytes = static_cast<int64_t>(c.request.ByteSizeLong()) / 3;
  Start(options);
  const absl::Status refused = client_->Attend(c.request).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("larger than max"));
  ASSERT_TRUE(AwaitMetric("attnserve_requests_total", {"rpc=\"Attend\"", "code=\"CANCELLED\""}, 1));
}

TEST_F(CallLifecycleTest, AStreamItemWithNeitherRequestIsInvalidAndNotCountedAsMultiHead) {
  Start();
  grpc::ClientContext context;
  auto stream = stub_->AttentionStream(&context);
  v1::AttentionStreamRequest empty;
  empty.set_request_id(42);
  ASSERT_TRUE(stream->Write(empty));
  stream->WritesDone();
  v1::AttentionStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 42u);
  EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(response.message(), HasSubstr("attend or multi_head_attention"));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Requests("AttentionStream", "INVALID_ARGUMENT"), 1);
  EXPECT_LE(Requests("MultiHeadAttention", "INVALID_ARGUMENT"), 0);  // -1: no such series
}

TEST_F(CallLifecycleTest, CallsOverAConnectionsStreamLimitWaitInTheClientNotTheServer) {
  server::ServerOptions options;
  options.max_concurrent_streams = 2;
  Start(options);
  TestThread blocker = Block();  // on client_'s connection
  auto channel = OwnConnection(target_);
  auto stub = v1::AttentionService::NewStub(channel);
  {
    // One finished call first: the client has the server's SETTINGS (the limit) from then on.
    grpc::ClientContext context;
    v1::GetServerInfoResponse info;
    ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  }
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 2, 2, 4, 4, 8, 8}, false, false);
  std::vector<TestThread> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(Spawn([&] {
      grpc::ClientContext context;
      v1::AttendResponse response;
      EXPECT_TRUE(stub->Attend(&context, c.request, &response).ok());
    }));
  }
  ASSERT_TRUE(AwaitMetric("attnserve_queued_requests", {}, 2));
  // Both of the connection's streams are taken: a third call cannot reach the server, whatever
  // the timing, and ends at its deadline in the client.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::AttendResponse response;
  EXPECT_EQ(stub->Attend(&context, c.request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  gate_->Open();
  for (auto& t : held) t.join();
  blocker.join();
  EXPECT_EQ(Requests("Attend", "OK"), 3);
  EXPECT_LE(Requests("Attend", "DEADLINE_EXCEEDED"), 0) << "the third call reached the server";
}

// The client cancels at its own deadline, which comes before the server's (the server's is the
// timeout header's arrival plus the timeout): a cancel that close to the server's deadline is the
// deadline, as the caller saw it. Deadlines here are relative to the call's construction and
// time only moves towards them, so neither case depends on timing.
TEST(CallTest, ACancelCloseToTheDeadlineIsCountedAsTheDeadline) {
  auto metrics = metrics::Metrics::Create({}).value();
  auto finish_cancelled = [&](absl::Duration timeout) {
    server::Caller caller(absl::Now() + timeout, /*connection=*/1, /*dispatcher=*/nullptr);
    absl::Status seen;
    server::Call call(metrics.get(), metrics::Rpc::kAttend, &caller,
                      [&](const absl::Status& status, server::Job*, absl::Time) { seen = status; });
    caller.Cancel();
    call.Finish(absl::CancelledError("the call was cancelled while the request was queued"),
                nullptr, metrics::DropReason::kCancelled);
    return seen.code();
  };
  auto dropped = [&](const std::string& reason) {
    return MetricSample(metrics->ExpositionText(), "attnserve_requests_dropped_total",
                        {"reason=\"" + reason + "\""});
  };
  // 30 ms before the deadline: within the 50 ms the skew allows at least.
  EXPECT_EQ(finish_cancelled(absl::Milliseconds(30)), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(dropped("deadline"), 1);
  EXPECT_EQ(dropped("cancelled"), 0);
  // An hour before the deadline: the caller cancelled.
  EXPECT_EQ(finish_cancelled(absl::Hours(1)), absl::StatusCode::kCancelled);
  EXPECT_EQ(dropped("deadline"), 1);
  EXPECT_EQ(dropped("cancelled"), 1);
}

}  // namespace
}  // namespace attnserve
