// attnserve::Client beyond the unary calls service_test.cc covers: async calls, the stream,
// retries and round_robin through the service config (against fake servers that count calls),
// the target helpers, and tensors packed and unpacked in fp16/bf16.
#include "client/client.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "base/mutex.h"
#include "client/stream.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/server_host.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

v1::AttendRequest SmallAttend(uint32_t seed, int64_t lq = 4) {
  v1::AttendRequest r;
  *r.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, lq, 8}, Random(2 * lq * 8, seed));
  *r.mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 6, 8}, Random(2 * 6 * 8, seed + 1));
  *r.mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 6, 8}, Random(2 * 6 * 8, seed + 2));
  return r;
}

// --- Against a real in-process server ---

class LiveClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.backend = "reference";
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    target_ = "127.0.0.1:" + std::to_string(host_->port());
    ClientOptions copts;
    copts.channels = 2;
    client_ = Client::Create(target_, copts).value();
  }
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
  std::string target_;
  std::unique_ptr<Client> client_;
};

TEST_F(LiveClientTest, FutureAndCallbackMatchTheSyncCall) {
  const v1::AttendRequest request = SmallAttend(1);
  auto sync = client_->Attend(request);
  ASSERT_TRUE(sync.ok()) << sync.status();
  auto future = client_->AttendAsync(request);
  std::promise<absl::StatusOr<v1::AttendResponse>> got;
  client_->AttendAsync(request,
                       [&](absl::StatusOr<v1::AttendResponse> r) { got.set_value(std::move(r)); });
  auto a = future.get();
  auto b = got.get_future().get();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->output().data(), sync->output().data());
  EXPECT_EQ(b->output().data(), sync->output().data());
}

TEST_F(LiveClientTest, AsyncErrorsCarryTheServersCodeAndMessage) {
  v1::AttendRequest bad = SmallAttend(2);
  bad.mutable_key()->set_shape(3, 4);  // D mismatch
  auto r = client_->AttendAsync(bad).get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("key"));
  v1::MultiHeadAttentionRequest mha;
  mha.set_module("no-such-module");
  *mha.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 64}, Random(128, 3));
  EXPECT_EQ(client_->MultiHeadAttentionAsync(mha).get().status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(LiveClientTest, ManyAsyncCallsInFlightAllComplete) {
  constexpr int kCalls = 64;
  std::vector<std::future<absl::StatusOr<v1::AttendResponse>>> futures;
  for (int i = 0; i < kCalls; ++i) futures.push_back(client_->AttendAsync(SmallAttend(i)));
  for (int i = 0; i < kCalls; ++i) {
    auto r = futures[i].get();
    ASSERT_TRUE(r.ok()) << r.status();
    auto sync = client_->Attend(SmallAttend(i));
    EXPECT_EQ(r->output().data(), sync->output().data()) << i;
  }
}

TEST_F(LiveClientTest, StreamAnswersEveryIdOnceIncludingErrors) {
  std::unique_ptr<AttentionStream> stream = client_->OpenStream();
  constexpr uint64_t kRequests = 40;
  for (uint64_t id = 0; id < kRequests; ++id) {
    v1::AttendRequest r = SmallAttend(static_cast<uint32_t>(id), 1 + id % 5);
    if (id == 7) r.mutable_value()->set_shape(2, 5);  // Lk mismatch: an error, not the end
    ASSERT_TRUE(stream->Send(1000 + id, r));
  }
  v1::MultiHeadAttentionRequest mha;
  mha.set_module("demo");
  *mha.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 3, 64}, Random(192, 9));
  ASSERT_TRUE(stream->Send(5000, mha));
  stream->CloseSend();
  EXPECT_FALSE(stream->Send(9999, mha));  // after CloseSend
  std::set<uint64_t> ids;
  v1::AttentionStreamResponse response;
  while (stream->Read(&response)) {
    EXPECT_TRUE(ids.insert(response.request_id()).second) << response.request_id();
    if (response.request_id() == 1007) {
      EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(response.message(), HasSubstr("value"));
    } else if (response.request_id() == 5000) {
      EXPECT_EQ(response.code(), 0) << response.message();
      EXPECT_TRUE(response.has_multi_head_attention());
    } else {
      ASSERT_EQ(response.code(), 0) << response.message();
      auto sync = client_->Attend(SmallAttend(static_cast<uint32_t>(response.request_id() - 1000),
                                              1 + (response.request_id() - 1000) % 5));
      EXPECT_EQ(response.attend().output().data(), sync->output().data());
    }
  }
  EXPECT_TRUE(stream->Finish().ok()) << stream->Finish();
  EXPECT_EQ(ids.size(), kRequests + 1);
}

TEST_F(LiveClientTest, StreamCallbackGetsEveryResponse) {
  Mutex mu;
  std::vector<uint64_t> ids;
  auto stream = client_->OpenStream([&](v1::AttentionStreamResponse r) {
    MutexLock lock(&mu);
    ids.push_back(r.request_id());
  });
  for (uint64_t id = 0; id < 300; ++id) ASSERT_TRUE(stream->Send(id, SmallAttend(1)));
  stream->CloseSend();
  ASSERT_TRUE(stream->Finish().ok());
  MutexLock lock(&mu);
  EXPECT_EQ(ids.size(), 300u);
}

TEST_F(LiveClientTest, DroppingAnOpenStreamCancelsIt) {
  auto stream = client_->OpenStream();
  ASSERT_TRUE(stream->Send(1, SmallAttend(1)));
  stream.reset();  // no CloseSend: the destructor cancels and waits; must not hang
  SUCCEED();
}

TEST_F(LiveClientTest, ShortDeadlineIsDeadlineExceeded) {
  v1::AttendRequest big;
  const int64_t l = 1024;
  *big.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 8, l, 64}, Random(8 * l * 64, 1));
  *big.mutable_key() = big.query();
  *big.mutable_value() = big.query();
  auto r = client_->AttendAsync(big, absl::Microseconds(200)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
}

// --- Against fake servers: retries and load balancing ---

// Answers GetServerInfo with its name; fails the first `failures` calls UNAVAILABLE.
class FakeService final : public v1::AttentionService::Service {
 public:
  FakeService(std::string name, int failures) : name_(std::move(name)), failures_(failures) {}
  grpc::Status GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse* response) override {
    const int n = calls_.fetch_add(1);
    if (n < failures_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
    response->set_version(name_);
    return grpc::Status::OK;
  }
  grpc::Status ListModules(grpc::ServerContext*, const v1::ListModulesRequest*,
                           v1::ListModulesResponse*) override {
    calls_.fetch_add(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "a limit");
  }
  // Holds every Attend until Release() (ClientLifetimeTest).
  grpc::Status Attend(grpc::ServerContext*, const v1::AttendRequest*,
                      v1::AttendResponse*) override {
    MutexLock lock(&mu_);
    ++attends_;
    changed_.NotifyAll();
    while (!released_) changed_.Wait(&mu_);
    return grpc::Status(grpc::StatusCode::ABORTED, "released");
  }
  void AwaitAttends(int n) {
    MutexLock lock(&mu_);
    while (attends_ < n) changed_.Wait(&mu_);
  }
  void Release() {
    MutexLock lock(&mu_);
    released_ = true;
    changed_.NotifyAll();
  }
  int calls() const { return calls_.load(); }

 private:
  const std::string name_;
  const int failures_;
  std::atomic<int> calls_{0};
  Mutex mu_;
  CondVar changed_;
  int attends_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

struct FakeServer {
  FakeServer(std::string name, int failures) : service(std::move(name), failures) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeServer() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  FakeService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// A client destroyed with calls in flight cancels them and returns only after every callback
// has: no callback may run against a destroyed client, and the last reference to a channel
// must not be dropped on a gRPC thread (~Client in client.h says why).
TEST(ClientLifetimeTest, DestroyingTheClientCancelsItsCallsAndWaitsForTheirCallbacks) {
  FakeServer fake("a", 0);
  auto client = Client::Create(fake.address()).value();  // no deadline: only a cancel ends them
  constexpr int kCalls = 3;
  Mutex mu;
  std::vector<absl::StatusCode> codes;
  for (int i = 0; i < kCalls; ++i) {
    client->AttendAsync(SmallAttend(i), [&](absl::StatusOr<v1::AttendResponse> r) {
      MutexLock lock(&mu);
      codes.push_back(r.status().code());
    });
  }
  fake.service.AwaitAttends(kCalls);
  client.reset();
  {
    MutexLock lock(&mu);
    EXPECT_EQ(codes, std::vector<absl::StatusCode>(kCalls, absl::StatusCode::kCancelled));
  }
  fake.service.Release();
}

TEST(RetryTest, UnavailableIsRetriedWithBackoff) {
  FakeServer fake("a", 2);
  ClientOptions options;
  options.retry.max_attempts = 4;
  options.retry.initial_backoff = absl::Milliseconds(10);
  auto client = Client::Create(fake.address(), options).value();
  auto r = client->GetServerInfo();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), "a");
  EXPECT_EQ(fake.service.calls(), 3);
}

TEST(RetryTest, RetriesAreOffByDefault) {
  FakeServer fake("a", 2);
  ClientOptions options;
  auto client = Client::Create(fake.address(), options).value();
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake.service.calls(), 1);
}

TEST(RetryTest, AttemptsAreBoundedAndOtherCodesAreNotRetried) {
  FakeServer fake("a", 100);
  ClientOptions options;
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(5);
  auto client = Client::Create(fake.address(), options).value();
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake.service.calls(), 3);
  EXPECT_EQ(client->ListModules().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fake.service.calls(), 4);
}

TEST(LoadBalancingTest, RoundRobinSpreadsCallsOverEveryAddress) {
  FakeServer a("a", 0), b("b", 0), c("c", 0);
  auto client = Client::CreateBalanced({a.address(), b.address(), c.address()}).value();
  std::map<std::string, int> seen;
  for (int i = 0; i < 60; ++i) {
    auto r = client->GetServerInfo();
    ASSERT_TRUE(r.ok()) << r.status();
    ++seen[r->version()];
  }
  EXPECT_EQ(seen.size(), 3u);
  for (const auto& [name, n] : seen) EXPECT_GE(n, 10) << name;
}

TEST(LoadBalancingTest, PickFirstSticksToOneAddress) {
  FakeServer a("a", 0), b("b", 0);
  ClientOptions options;
  options.load_balancing = "pick_first";
  auto client = Client::CreateBalanced({a.address(), b.address()}, options).value();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client->GetServerInfo().ok());
  EXPECT_TRUE(a.service.calls() == 10 || b.service.calls() == 10);
}

TEST(TargetTest, MultiAddressTarget) {
  EXPECT_EQ(MultiAddressTarget({"127.0.0.1:1", "10.0.0.2:2"}).value(),
            "ipv4:127.0.0.1:1,10.0.0.2:2");
  EXPECT_EQ(MultiAddressTarget({"[::1]:1", "[::1]:2"}).value(), "ipv6:[::1]:1,[::1]:2");
  EXPECT_EQ(MultiAddressTarget({"localhost:5"}).value(), "localhost:5");
  EXPECT_FALSE(MultiAddressTarget({}).ok());
  EXPECT_THAT(MultiAddressTarget({"a.example:1", "127.0.0.1:2"}).status().message(),
              HasSubstr("dns:///"));
}

TEST(TargetTest, ServiceConfigJson) {
  ClientOptions o;
  EXPECT_EQ(ServiceConfigJson(o), "{}");  // defaults: no retries, gRPC's own balancing
  o.retry.max_attempts = 4;
  o.load_balancing = "round_robin";
  const std::string json = ServiceConfigJson(o);
  EXPECT_THAT(json, HasSubstr("\"maxAttempts\": 4"));
  EXPECT_THAT(json, HasSubstr("\"retryableStatusCodes\": [\"UNAVAILABLE\"]"));
  EXPECT_THAT(json, HasSubstr("\"initialBackoff\": \"0.100000s\""));
  EXPECT_THAT(json, HasSubstr("\"loadBalancingConfig\": [{\"round_robin\": {}}]"));
  o.retry.max_attempts = 1;
  o.load_balancing.clear();
  EXPECT_EQ(ServiceConfigJson(o), "{}");
}

TEST(TargetTest, BadOptionsAreRejected) {
  ClientOptions o;
  o.channels = 0;
  EXPECT_THAT(Client::Create("127.0.0.1:1", o).status().message(), HasSubstr("channels"));
  EXPECT_FALSE(Client::Create("").ok());
}

// --- Tensors packed and unpacked by the client (the element codec is base/float16.h) ---

TEST(FloatCodecTest, MakeTensorAndBackAreExactForRepresentableValues) {
  const std::vector<float> v = {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f};
  for (v1::Dtype t : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16}) {
    auto back = TensorToFloats(MakeTensor(t, {7}, v));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, v) << v1::Dtype_Name(t);
  }
  EXPECT_FALSE(TensorToFloats(MakeMask({2}, {1, 0})).ok());
}

}  // namespace
}  // namespace attnserve
