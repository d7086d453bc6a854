// The client's session helpers (client/session.h) and session routing (client/client.h) against
// fake replicas that keep only each session's length: which replica each call reaches, the
// expected_length every extend carries, the answer to a repeated extend, Close on destruction,
// ExtendSessions split per replica and merged in order. The numbers a real server computes are
// checked against it in session_live_test.cc and tests/python/test_sessions_live.py.
#include "client/session.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "client/stream.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

// Sessions as lengths. Its owner is set once the port is known. `lose_first_response`: the
// first extend is applied but answered UNAVAILABLE (a response lost on the way back).
class FakeSessions final : public v1::AttentionService::Service {
 public:
  void set_owner(std::string owner) {
    MutexLock lock(&mu_);
    owner_ = std::move(owner);
  }
  void set_owner_override(std::string owner) {
    MutexLock lock(&mu_);
    override_ = std::move(owner);
  }
  bool lose_first_response = false;

  grpc::Status CreateSession(grpc::ServerContext*, const v1::CreateSessionRequest* request,
                             v1::CreateSessionResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["CreateSession"];
    const std::string id = absl::StrCat(override_.empty() ? owner_ : override_, "/inst/", ++next_);
    lengths_[id] = 0;
    response->mutable_session()->set_session_id(id);
    *response->mutable_session()->mutable_layout() = request->layout();
    return grpc::Status::OK;
  }
  grpc::Status ExtendSession(grpc::ServerContext*, const v1::ExtendSessionRequest* request,
                             v1::ExtendSessionResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["ExtendSession"];
    grpc::Status status = ExtendLocked(*request, response);
    if (status.ok() && lose_first_response) {
      lose_first_response = false;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection lost");
    }
    return status;
  }
  grpc::Status ExtendSessions(grpc::ServerContext*, const v1::ExtendSessionsRequest* request,
                              v1::ExtendSessionsResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["ExtendSessions"];
    for (const auto& step : request->steps()) {
      v1::ExtendSessionResult* r = response->add_results();
      grpc::Status s = ExtendLocked(step, r->mutable_response());
      r->set_code(s.error_code());
      r->set_message(s.error_message());
      if (!s.ok()) r->clear_response();
    }
    return grpc::Status::OK;
  }
  grpc::Status ForkSession(grpc::ServerContext*, const v1::ForkSessionRequest* request,
                           v1::ForkSessionResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["ForkSession"];
    auto it = lengths_.find(request->session_id());
    if (it == lengths_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session");
    const std::string id = absl::StrCat(owner_, "/inst/", ++next_);
    lengths_[id] = it->second;
    response->mutable_session()->set_session_id(id);
    response->mutable_session()->set_length(it->second);
    response->mutable_session()->set_parent_id(request->session_id());
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse*) override {
    MutexLock lock(&mu_);
    ++calls_["CloseSession"];
    if (lengths_.erase(request->session_id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session");
    }
    return grpc::Status::OK;
  }
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest* request,
                          v1::GetSessionResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["GetSession"];
    auto it = lengths_.find(request->session_id());
    if (it == lengths_.end()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "session lost (evicted): create a new session and prefill it again");
    }
    response->mutable_session()->set_session_id(it->first);
    response->mutable_session()->set_length(it->second);
    return grpc::Status::OK;
  }
  grpc::Status ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse* response) override {
    MutexLock lock(&mu_);
    ++calls_["ListSessions"];
    for (const auto& [id, length] : lengths_) {
      v1::SessionInfo* info = response->add_sessions();
      info->set_session_id(id);
      info->set_length(length);
    }
    return grpc::Status::OK;
  }
  grpc::Status AttentionStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::AttentionStreamResponse, v1::AttentionStreamRequest>* stream)
      override {
    v1::AttentionStreamRequest request;
    while (stream->Read(&request)) {
      v1::AttentionStreamResponse response;
      response.set_request_id(request.request_id());
      MutexLock lock(&mu_);
      ++calls_["stream"];
      grpc::Status s = ExtendLocked(request.extend_session(), response.mutable_extend_session());
      response.set_code(s.error_code());
      response.set_message(s.error_message());
      stream->Write(response);
    }
    return grpc::Status::OK;
  }

  int calls(const std::string& rpc) {
    MutexLock lock(&mu_);
    return calls_[rpc];
  }
  size_t open_sessions() {
    MutexLock lock(&mu_);
    return lengths_.size();
  }
  // The expected_length of every extend, in arrival order (-1: unset).
  std::vector<int64_t> expected_lengths() {
    MutexLock lock(&mu_);
    return expected_;
  }

 private:
  grpc::Status ExtendLocked(const v1::ExtendSessionRequest& request,
                            v1::ExtendSessionResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    expected_.push_back(request.has_expected_length() ? request.expected_length() : -1);
    auto it = lengths_.find(request.session_id());
    if (it == lengths_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no session ", request.session_id(), " on ", owner_));
    }
    if (request.has_expected_length() && request.expected_length() != it->second) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("expected_length ", request.expected_length(),
                                       " but the session holds ", it->second, " tokens"));
    }
    const v1::Tensor& t = request.has_input() ? request.input() : request.query();
    it->second += t.shape(0);
    *response->mutable_output() = t;
    response->set_length(it->second);
    return grpc::Status::OK;
  }

  Mutex mu_;
  std::string owner_ ABSL_GUARDED_BY(mu_), override_ ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> lengths_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> expected_ ABSL_GUARDED_BY(mu_);
};

struct FakeReplica {
  FakeReplica() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    service.set_owner(address());
  }
  ~FakeReplica() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  FakeSessions service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

v1::Tensor Tokens(int64_t n, float first = 0) {
  std::vector<float> values(n * 2 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = first + static_cast<float>(i);
  return MakeTensor(v1::DTYPE_FLOAT32, {n, 2, 4}, values);
}

HeadLayout Layout() {
  HeadLayout l;
  l.num_heads = 2;
  l.head_dim = 4;
  return l;
}

TEST(SessionOwnerTest, SplitsFromTheRight) {
  EXPECT_EQ(SessionOwner("10.0.0.1:50051/abc/7").value(), "10.0.0.1:50051");
  EXPECT_EQ(SessionOwner("dns:///attnserve-0.attnserve:50051/abc/7").value(),
            "dns:///attnserve-0.attnserve:50051");
  for (const char* bad : {"", "abc", "a/b", "/b/c", "a//c", "a/b/"}) {
    absl::StatusOr<std::string> r = SessionOwner(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("was '", bad, "'")));
  }
}

TEST(SessionOwnerTest, LostSessionsAreRecognisedByCodeAndPrefix) {
  const absl::Status lost =
      absl::FailedPreconditionError("session lost (expired): create a new session");
  EXPECT_TRUE(IsSessionLost(lost));
  EXPECT_EQ(SessionLostReason(lost), "expired");
  EXPECT_FALSE(IsSessionLost(absl::FailedPreconditionError("something else")));
  EXPECT_FALSE(IsSessionLost(absl::AbortedError("session lost (expired): no")));
  EXPECT_EQ(SessionLostReason(absl::NotFoundError("session lost (evicted)")), "");
}

TEST(SessionTest, ExtendsCarryTheKnownLengthAndDestructionCloses) {
  FakeReplica replica;
  auto client = Client::Create(replica.address()).value();
  {
    absl::StatusOr<Session> s = Session::CreateRaw(client.get(), Layout());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->length(), 0);
    ASSERT_TRUE(s->Extend(Tokens(5), Tokens(5), Tokens(5)).ok());
    EXPECT_EQ(s->length(), 5);
    auto step = s->Extend(Tokens(1, 100), Tokens(1), Tokens(1));
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->length(), 6);
    EXPECT_EQ(TensorToFloats(step->output()).value()[0], 100.0f);
    EXPECT_EQ(s->length(), 6);
    absl::StatusOr<Session> child = s->Fork();
    ASSERT_TRUE(child.ok()) << child.status();
    EXPECT_EQ(child->length(), 6);
    ASSERT_TRUE(child->Extend(Tokens(1), Tokens(1), Tokens(1)).ok());
    EXPECT_EQ(child->length(), 7);
    EXPECT_EQ(s->Describe().value().length(), 6);
    EXPECT_EQ(replica.service.open_sessions(), 2u);
  }
  EXPECT_EQ(replica.service.open_sessions(), 0u);
  EXPECT_EQ(replica.service.calls("CloseSession"), 2);
  EXPECT_EQ(replica.service.expected_lengths(), (std::vector<int64_t>{0, 5, 6}));
}

TEST(SessionTest, CloseAndReleaseLeaveNothingForTheDestructor) {
  FakeReplica replica;
  auto client = Client::Create(replica.address()).value();
  std::string released;
  {
    Session a = Session::CreateRaw(client.get(), Layout()).value();
    Session b = Session::CreateRaw(client.get(), Layout()).value();
    ASSERT_TRUE(a.Close().ok());
    EXPECT_TRUE(a.Close().ok());  // idempotent on the client side
    EXPECT_EQ(a.Extend(Tokens(1), Tokens(1), Tokens(1)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    released = b.Release();
  }
  EXPECT_EQ(replica.service.calls("CloseSession"), 1);
  EXPECT_EQ(replica.service.open_sessions(), 1u);
  v1::GetSessionRequest get;
  get.set_session_id(released);
  EXPECT_TRUE(client->GetSession(get).ok());
}

TEST(SessionTest, MovedFromSessionsDoNotClose) {
  FakeReplica replica;
  auto client = Client::Create(replica.address()).value();
  {
    Session a = Session::CreateRaw(client.get(), Layout()).value();
    Session b = std::move(a);
    Session c = Session::CreateRaw(client.get(), Layout()).value();
    c = std::move(b);  // closes c's own session first
    EXPECT_EQ(replica.service.calls("CloseSession"), 1);
  }
  EXPECT_EQ(replica.service.calls("CloseSession"), 2);
  EXPECT_EQ(replica.service.open_sessions(), 0u);
}

TEST(SessionTest, ARetryAfterALostResponseIsRefusedAndReported) {
  FakeReplica replica;
  replica.service.lose_first_response = true;
  ClientOptions options;
  options.retry.max_attempts = 2;
  options.retry.initial_backoff = absl::Milliseconds(1);
  auto client = Client::Create(replica.address(), options).value();
  Session s = Session::CreateRaw(client.get(), Layout()).value();
  auto r = s.Extend(Tokens(3), Tokens(3), Tokens(3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r.status().message(), HasSubstr("applied by an earlier attempt"));
  EXPECT_THAT(r.status().message(), HasSubstr("now holds 3 tokens"));
  EXPECT_EQ(s.length(), 3);
  // Both attempts carried expected_length 0: the repeat could not append twice.
  EXPECT_EQ(replica.service.expected_lengths(), (std::vector<int64_t>{0, 0}));
  ASSERT_TRUE(s.Extend(Tokens(1), Tokens(1), Tokens(1)).ok());
  EXPECT_EQ(s.length(), 4);
}

TEST(SessionTest, AConflictingExtendIsAbortedWithoutClaimingIt) {
  FakeReplica replica;
  auto client = Client::Create(replica.address()).value();
  Session s = Session::CreateRaw(client.get(), Layout()).value();
  v1::ExtendSessionRequest request;
  *request.mutable_query() = Tokens(2);
  request.set_expected_length(7);  // the caller's own, kept
  auto r = s.Extend(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r.status().message(), HasSubstr("expected_length 7"));
  EXPECT_EQ(s.length(), 0);
}

TEST(RoutingTest, SessionCallsGoToTheOwnerAndCreatesAreSpread) {
  FakeReplica a, b;
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  EXPECT_EQ(client->replicas(), (std::vector<std::string>{a.address(), b.address()}));
  std::vector<Session> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(Session::CreateRaw(client.get(), Layout()).value());
  }
  EXPECT_EQ(a.service.calls("CreateSession"), 2);
  EXPECT_EQ(b.service.calls("CreateSession"), 2);
  for (int step = 0; step < 3; ++step) {
    for (Session& s : sessions) {
      auto r = s.Extend(Tokens(1), Tokens(1), Tokens(1));
      ASSERT_TRUE(r.ok()) << r.status();  // a misrouted call would be NOT_FOUND
    }
  }
  EXPECT_EQ(a.service.calls("ExtendSession"), 6);
  EXPECT_EQ(b.service.calls("ExtendSession"), 6);
  for (Session& s : sessions) ASSERT_TRUE(s.Fork().ok());
  EXPECT_EQ(a.service.calls("ForkSession"), 2);
  EXPECT_EQ(b.service.calls("ForkSession"), 2);
  EXPECT_EQ(client->ListSessions({}, a.address()).value().sessions_size(), 2);
  EXPECT_EQ(client->ListSessions({}, "10.9.9.9:1").status().code(),
            absl::StatusCode::kInvalidArgument);
  sessions.clear();
  EXPECT_EQ(a.service.open_sessions() + b.service.open_sessions(), 0u);
}

TEST(RoutingTest, AnUnknownOwnerIsAClearErrorAndNothingIsSent) {
  FakeReplica a, b;
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  v1::ExtendSessionRequest request;
  request.set_session_id("10.1.2.3:50051/x/1");
  auto r = client->ExtendSession(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("names owner '10.1.2.3:50051'"));
  EXPECT_THAT(r.status().message(), HasSubstr(a.address()));
  request.set_session_id("garbage");
  EXPECT_THAT(client->ExtendSession(request).status().message(),
              HasSubstr("<owner>/<instance>/<key>"));
  EXPECT_EQ(a.service.calls("ExtendSession") + b.service.calls("ExtendSession"), 0);
}

TEST(RoutingTest, AReplicaWhoseOwnerIsNotItsAddressIsRefusedAtCreate) {
  FakeReplica a, b;
  a.service.set_owner_override("attnserve-0.internal:50051");
  b.service.set_owner_override("attnserve-1.internal:50051");
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  auto s = Session::CreateRaw(client.get(), Layout());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("whose owner is not that address"));
}

TEST(RoutingTest, OneTargetSendsEverythingThereWhateverTheOwner) {
  FakeReplica a;
  a.service.set_owner_override("somewhere-else:1");
  auto client = Client::Create(a.address()).value();
  Session s = Session::CreateRaw(client.get(), Layout()).value();
  EXPECT_THAT(s.id(), HasSubstr("somewhere-else:1/"));
  ASSERT_TRUE(s.Extend(Tokens(1), Tokens(1), Tokens(1)).ok());
}

TEST(RoutingTest, ExtendSessionsIsSplitPerReplicaAndMergedInOrder) {
  FakeReplica a, b;
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  std::vector<Session> sessions;
  for (int i = 0; i < 5; ++i) {
    sessions.push_back(Session::CreateRaw(client.get(), Layout()).value());
  }
  std::vector<std::pair<Session*, v1::ExtendSessionRequest>> steps;
  for (int i = 0; i < 5; ++i) {
    v1::ExtendSessionRequest r;
    *r.mutable_query() = Tokens(i + 1, 10.0f * i);
    steps.emplace_back(&sessions[i], r);
  }
  auto results = ExtendSessions(client.get(), steps);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*results)[i].ok()) << (*results)[i].status();
    EXPECT_EQ((*results)[i]->length(), i + 1);
    EXPECT_EQ(TensorToFloats((*results)[i]->output()).value()[0], 10.0f * i);
    EXPECT_EQ(sessions[i].length(), i + 1);
  }
  EXPECT_EQ(a.service.calls("ExtendSessions"), 1);
  EXPECT_EQ(b.service.calls("ExtendSessions"), 1);
  // A failing item fails alone; a session twice is refused before sending.
  steps[2].second.set_expected_length(99);
  results = ExtendSessions(client.get(), steps);
  ASSERT_TRUE(results.ok());
  EXPECT_EQ((*results)[2].status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*results)[3].ok());
  EXPECT_EQ(sessions[2].length(), 3);
  steps.push_back(steps[0]);
  EXPECT_THAT(ExtendSessions(client.get(), steps).status().message(), HasSubstr("a second time"));
}

TEST(RoutingTest, AStreamForASessionReachesItsReplica) {
  FakeReplica a, b;
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  Session s0 = Session::CreateRaw(client.get(), Layout()).value();
  Session s1 = Session::CreateRaw(client.get(), Layout()).value();
  for (Session* s : {&s0, &s1}) {
    auto stream = client->OpenStreamForSession(s->id());
    ASSERT_TRUE(stream.ok()) << stream.status();
    v1::ExtendSessionRequest r;
    *r.mutable_query() = Tokens(2);
    (*stream)->Send(7, s->Prepare(r));
    (*stream)->CloseSend();
    v1::AttentionStreamResponse response;
    ASSERT_TRUE((*stream)->Read(&response));
    EXPECT_EQ(response.request_id(), 7u);
    EXPECT_EQ(response.code(), 0) << response.message();
    s->Applied(response.extend_session());
    EXPECT_EQ(s->length(), 2);
    EXPECT_TRUE((*stream)->Finish().ok());
  }
  EXPECT_EQ(a.service.calls("stream"), 1);
  EXPECT_EQ(b.service.calls("stream"), 1);
  EXPECT_EQ(client->OpenStreamForSession("nowhere:1/x/1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve
