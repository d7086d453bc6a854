// Tenants (server/transport/auth.h): the tenants file, and a live server on which every session
// belongs to its creator. A second tenant must not learn from any session rpc that another
// tenant's session exists: its answers are compared, code and message, with those for an id
// never issued.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/reference.h"
#include "server/core/call.h"
#include "server/server_host.h"
#include "server/transport/auth.h"
#include "tests/testing/gated_backend.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseTenantsTest, ReadsTokensHashesCertificatesAndRoles) {
  const std::string hash = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(server::HashToken("b-token").data()), 32));
  auto entries = server::ParseTenants(
      "# tenant credential roles\n"
      "alice token:a-token\n"
      "\n"
      "bob   sha256:" +
      absl::AsciiStrToUpper(hash) +
      "   compute  # the hash, not the token\n"
      "ops\ttoken:o-token\toperator,admin\n"
      "svc-7 cert admin\n");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  EXPECT_EQ((*entries)[0].tenant, "alice");
  EXPECT_EQ((*entries)[0].hash, server::HashToken("a-token"));
  EXPECT_FALSE((*entries)[0].admin || (*entries)[0].operator_role);
  EXPECT_EQ((*entries)[1].hash, server::HashToken("b-token"));
  EXPECT_TRUE((*entries)[2].admin && (*entries)[2].operator_role);
  EXPECT_TRUE((*entries)[3].cert && (*entries)[3].admin);
}

TEST(ParseTenantsTest, RefusesBadLinesNamingTheLineAndNeverTheToken) {
  struct Case {
    std::string text, says;
  };
  for (const Case& c : std::vector<Case>{
           {"alice\n", "line 1: want"},
           {"a token:x\nb password:sekrit-1\n", "line 2: the credential must be"},
           {"a token:sekrit-1 root\n", "line 1: unknown role 'root'"},
           {"a sha256:abc\n", "64 hex digits"},
           {"a token:sekrit-1\nb token:sekrit-1\n", "line 2: the same token as tenant 'a'"},
           {"a token:sekrit-1 admin extra\n", "line 1: want"}}) {
    auto entries = server::ParseTenants(c.text);
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_THAT(entries.status().message(), HasSubstr(c.says));
    EXPECT_THAT(entries.status().message(), Not(HasSubstr("sekrit")));
  }
}

// The batcher's fair share goes by Caller::connection(): a named tenant's calls share one key
// whatever connection they come on; the anonymous tenant's keep their connection's.
TEST(CallerTest, ANamedTenantIsOneFairShareKeyOverItsConnections) {
  server::Caller a(absl::InfiniteFuture(), 1, nullptr), b(absl::InfiniteFuture(), 2, nullptr);
  server::Caller anonymous(absl::InfiniteFuture(), 3, nullptr);
  a.set_tenant("team-a");
  b.set_tenant("team-a");
  anonymous.set_tenant("");
  EXPECT_EQ(a.connection(), b.connection());
  EXPECT_EQ(a.tenant(), "team-a");
  EXPECT_EQ(anonymous.connection(), 3u);
  server::Caller c(absl::InfiniteFuture(), 1, nullptr);
  c.set_tenant("team-b");
  EXPECT_NE(c.connection(), a.connection());  // same connection, another tenant
}

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Start(
        "alice token:a-token\n"
        "bob sha256:" +
        absl::BytesToHexString(absl::string_view(
            reinterpret_cast<const char*>(server::HashToken("b-token").data()), 32)) +
        "\n"
        "ops token:o-token operator\n"
        "root token:r-token admin\n");
  }
  // A server reading `tenants` as its tenants file, with `options` otherwise.
  void Start(
      const std::string& tenants, server::ServerOptions options = {},
      std::unique_ptr<kernels::Backend> backend = std::make_unique<kernels::ReferenceBackend>()) {
    file_ = fs::temp_directory_path() / ("attnserve-tenants-" + std::to_string(::getpid()));
    Write(tenants);
    options.listen_address = "127.0.0.1:0";
    options.tenants_file = file_.string();
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, std::move(backend), metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    stub_ = v1::AttentionService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(host_->port()), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (host_ != nullptr) host_->Shutdown(absl::ZeroDuration());
    host_.reset();  // before the metrics it records in (a test may Start again)
    fs::remove(file_);
  }
  void Write(const std::string& text) { std::ofstream(file_) << text; }
  // A context carrying `token` (none when empty).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }
  // A raw session of one head of 4, float32.
  static v1::CreateSessionRequest RawRequest(bool pinned = false) {
    v1::CreateSessionRequest r;
    r.mutable_layout()->set_num_heads(1);
    r.mutable_layout()->set_num_kv_heads(1);
    r.mutable_layout()->set_head_dim(4);
    r.mutable_layout()->set_v_head_dim(4);
    r.set_cache_dtype(v1::DTYPE_FLOAT32);
    r.set_pinned(pinned);
    return r;
  }
  std::string Create(const std::string& token) {
    v1::CreateSessionResponse response;
    const grpc::Status s = stub_->CreateSession(As(token).get(), RawRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.session().session_id();
  }
  grpc::Status Get(const std::string& token, const std::string& id) {
    v1::GetSessionRequest r;
    r.set_session_id(id);
    v1::GetSessionResponse response;
    return stub_->GetSession(As(token).get(), r, &response);
  }
  grpc::Status Fork(const std::string& token, const std::string& id, std::string* fork = nullptr) {
    v1::ForkSessionRequest r;
    r.set_session_id(id);
    v1::ForkSessionResponse response;
    const grpc::Status s = stub_->ForkSession(As(token).get(), r, &response);
    if (fork != nullptr) *fork = response.session().session_id();
    return s;
  }
  grpc::Status Close(const std::string& token, const std::string& id) {
    v1::CloseSessionRequest r;
    r.set_session_id(id);
    v1::CloseSessionResponse response;
    return stub_->CloseSession(As(token).get(), r, &response);
  }
  // `tokens` new tokens (one head of 4).
  grpc::Status Extend(const std::string& token, const std::string& id, int tokens = 1) {
    v1::ExtendSessionRequest r;
    r.set_session_id(id);
    for (v1::Tensor* t : {r.mutable_query(), r.mutable_key(), r.mutable_value()}) {
      t->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : {int64_t{tokens}, int64_t{1}, int64_t{4}}) t->add_shape(d);
      std::vector<float> x(4 * tokens);
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
      t->set_data(std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
    }
    v1::ExtendSessionResponse response;
    return stub_->ExtendSession(As(token).get(), r, &response);
  }
  // The same extend on an AttentionStream: the item's code and message.
  std::pair<int, std::string> StreamExtend(const std::string& token, const std::string& id) {
    auto context = As(token);
    auto stream = stub_->AttentionStream(context.get());
    v1::AttentionStreamRequest request;
    request.set_request_id(1);
    request.mutable_extend_session()->set_session_id(id);
    for (v1::Tensor* t : {request.mutable_extend_session()->mutable_query(),
                          request.mutable_extend_session()->mutable_key(),
                          request.mutable_extend_session()->mutable_value()}) {
      t->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : {1, 1, 4}) t->add_shape(d);
      t->set_data(std::string(16, '\0'));
    }
    EXPECT_TRUE(stream->Write(request));
    v1::AttentionStreamResponse response;
    EXPECT_TRUE(stream->Read(&response));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    return {response.code(), response.message()};
  }
  grpc::Status Attend(const std::string& token) {
    v1::AttendRequest r;
    for (v1::Tensor* t : {r.mutable_query(), r.mutable_key(), r.mutable_value()}) {
      t->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : {1, 1, 1, 4}) t->add_shape(d);
      t->set_data(std::string(16, '\0'));
    }
    v1::AttendResponse response;
    return stub_->Attend(As(token).get(), r, &response);
  }
  std::vector<std::string> List(const std::string& token) {
    std::vector<std::string> ids;
    std::string page;
    do {
      v1::ListSessionsRequest r;
      r.set_page_size(2);
      r.set_page_token(page);
      v1::ListSessionsResponse response;
      const grpc::Status s = stub_->ListSessions(As(token).get(), r, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& info : response.sessions()) ids.push_back(info.session_id());
      page = response.next_page_token();
    } while (!page.empty());
    return ids;
  }

  fs::path file_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

// The value of the series of `name` whose labels include every one of `labels` ("k=\"v\""), or
// -1 when there is none.
double Metric(const std::string& text, const std::string& name,
              const std::vector<std::string>& labels) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// What an rpc answers for `id`, with the id itself taken out of the message, so that the
// answers for two ids can be compared.
std::string Shape(const grpc::Status& s, const std::string& id) {
  return std::to_string(s.error_code()) + " " +
         absl::StrReplaceAll(s.error_message(), {{id, "ID"}});
}

TEST_F(TenantsTest, AnotherTenantsSessionAnswersAsAnIdNeverIssued) {
  const std::string mine = Create("a-token");
  ASSERT_TRUE(Extend("a-token", mine).ok());
  // A well-formed id of this replica and instance that was never issued.
  std::string never = mine;
  never.back() = never.back() == '0' ? '1' : '0';
  EXPECT_EQ(Get("b-token", never).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Shape(Get("b-token", mine), mine), Shape(Get("b-token", never), never));
  EXPECT_EQ(Shape(Extend("b-token", mine), mine), Shape(Extend("b-token", never), never));
  EXPECT_EQ(Shape(Fork("b-token", mine), mine), Shape(Fork("b-token", never), never));
  EXPECT_EQ(Shape(Close("b-token", mine), mine), Shape(Close("b-token", never), never));
  const auto streamed = StreamExtend("b-token", mine);
  const auto streamed_never = StreamExtend("b-token", never);
  EXPECT_EQ(streamed.first, grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(absl::StrReplaceAll(streamed.second, {{mine, "ID"}}),
            absl::StrReplaceAll(streamed_never.second, {{never, "ID"}}));
  // None of that touched it: its owner still extends it from where it was.
  v1::GetSessionRequest get;
  get.set_session_id(mine);
  v1::GetSessionResponse info;
  ASSERT_TRUE(stub_->GetSession(As("a-token").get(), get, &info).ok());
  EXPECT_EQ(info.session().length(), 1);
  // Nor does an operator reach into it: operators only list.
  EXPECT_EQ(Get("o-token", mine).error_code(), grpc::StatusCode::NOT_FOUND);
  // ExtendSessions: the other tenant's step fails on its own, as a never-issued one does.
  v1::ExtendSessionsRequest batch;
  v1::ExtendSessionRequest step;
  step.set_session_id(mine);
  for (v1::Tensor* t : {step.mutable_query(), step.mutable_key(), step.mutable_value()}) {
    t->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : {1, 1, 4}) t->add_shape(d);
    t->set_data(std::string(16, '\0'));
  }
  *batch.add_steps() = step;
  step.set_session_id(never);
  *batch.add_steps() = step;
  v1::ExtendSessionsResponse results;
  ASSERT_TRUE(stub_->ExtendSessions(As("b-token").get(), batch, &results).ok());
  ASSERT_EQ(results.results_size(), 2);
  EXPECT_EQ(results.results(0).code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(results.results(0).code(), results.results(1).code());
  EXPECT_EQ(absl::StrReplaceAll(results.results(0).message(), {{mine, "ID"}}),
            absl::StrReplaceAll(results.results(1).message(), {{never, "ID"}}));
  // No token, or a wrong one: refused before any session is looked at.
  for (const std::string& token : {std::string(), std::string("a-tokeN")}) {
    EXPECT_EQ(Get(token, mine).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Extend(token, mine).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Fork(token, mine).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Close(token, mine).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Counted by tenant (bob: Get, Extend, Fork, Close, the stream's and the batch's extend; the
  // operator's Get), and bounded: only tenants of the file are named.
  const std::string text = metrics_->ExpositionText();
  EXPECT_EQ(Metric(text, "attnserve_tenant_refusals_total",
                   {"tenant=\"bob\"", "reason=\"cross_tenant\""}),
            6);
  EXPECT_EQ(Metric(text, "attnserve_tenant_refusals_total",
                   {"tenant=\"ops\"", "reason=\"cross_tenant\""}),
            1);
  EXPECT_EQ(Metric(text, "attnserve_tenant_sessions", {"tenant=\"alice\""}), 1);
  // Once closed by its owner, it is gone for everyone alike.
  ASSERT_TRUE(Close("a-token", mine).ok());
  EXPECT_EQ(Shape(Get("a-token", mine), mine), Shape(Get("b-token", never), never));
}

TEST_F(TenantsTest, ListShowsTheCallersOwnSessionsAndAnOperatorEveryones) {
  const std::vector<std::string> alices = {Create("a-token"), Create("a-token"), Create("a-token")};
  const std::vector<std::string> bobs = {Create("b-token")};
  std::string fork;
  ASSERT_TRUE(Fork("a-token", alices[1], &fork).ok());
  EXPECT_EQ(List("a-token"),
            (std::vector<std::string>{alices[0], alices[1], alices[2], fork}));  // creation order
  EXPECT_EQ(List("b-token"), bobs);
  EXPECT_EQ(List("r-token"), std::vector<std::string>{});  // admin, not operator
  EXPECT_EQ(List("o-token"),
            (std::vector<std::string>{alices[0], alices[1], alices[2], bobs[0], fork}));
  // Ids give nothing away: 32 random hex digits after the instance.
  for (const std::string& id : alices) {
    EXPECT_THAT(id, ::testing::MatchesRegex(".*/[0-9a-f]+/[0-9a-f]{32}"));
  }
}

TEST_F(TenantsTest, ModulesAreForAdminsAndUnknownTokensAreRefusedWithoutEchoingThem) {
  v1::UnloadModuleRequest unload;
  unload.set_name("no-such-module");
  v1::UnloadModuleResponse unloaded;
  const grpc::Status denied = stub_->UnloadModule(As("a-token").get(), unload, &unloaded);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("admin role"));
  EXPECT_EQ(stub_->UnloadModule(As("r-token").get(), unload, &unloaded).error_code(),
            grpc::StatusCode::NOT_FOUND);  // allowed: there is no such module
  v1::LoadModuleRequest load;
  load.set_name("m");
  v1::LoadModuleResponse loaded;
  EXPECT_EQ(stub_->LoadModule(As("o-token").get(), load, &loaded).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  for (const std::string& token : {std::string("guess-1234"), std::string()}) {
    v1::ListSessionsResponse response;
    const grpc::Status s =
        stub_->ListSessions(As(token).get(), v1::ListSessionsRequest(), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), Not(HasSubstr("guess")));
  }
}

TEST_F(TenantsTest, ReloadTakesANewFileAndKeepsTheOldOneWhenTheNewOneIsBad) {
  const std::string alices = Create("a-token");
  Write("alice token:a-token\ncarol token:c-token\n");  // bob's token withdrawn
  ASSERT_TRUE(host_->ReloadTenants().ok());
  EXPECT_EQ(Get("b-token", alices).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(List("c-token"), std::vector<std::string>{});
  EXPECT_EQ(List("a-token"), std::vector<std::string>{alices});  // sessions outlive a reload

  Write("alice token:a-token\ncarol\n");  // does not parse
  const absl::Status bad = host_->ReloadTenants();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("line 2"));
  EXPECT_EQ(List("c-token"), std::vector<std::string>{});  // the last good table stays
}

// A pool of 8 pages of 4 tokens (one head of 4: 128 bytes a page), and tenants with shares.
class TenantSharesTest : public TenantsTest {
 protected:
  void SetUp() override {
    server::ServerOptions options;
    options.sessions.page_tokens = 4;
    options.sessions.pool_bytes = 8 * 128;
    Start(
        "alice token:a-token share=0.5\n"  // 4 pages guaranteed
        "bob token:b-token\n"
        "carol token:c-token max_share=0.25\n"  // 2 pages at most
        "dave token:d-token sessions=1\n"
        "frank token:f-token pinned_share=0.25\n",  // 2 pages pinned at most
        options);
  }
  // A session of `token`'s holding two pages (8 tokens).
  std::string TwoPages(const std::string& token) {
    const std::string id = Create(token);
    const grpc::Status s = Extend(token, id, 8);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return id;
  }
};

TEST_F(TenantSharesTest, ATenantWithinItsShareLosesNoSessionToAnother) {
  // (Listing does not count as using a session: the LRU order below is the order of creation.)
  using Ids = std::vector<std::string>;
  const std::string a1 = TwoPages("a-token"), a2 = TwoPages("a-token");  // alice: 4 pages
  const std::string b1 = TwoPages("b-token"), b2 = TwoPages("b-token");  // the pool is full
  // Bob needs two more pages: alice's sessions are older, but within her share; bob's own
  // least recently used one goes.
  const std::string b3 = TwoPages("b-token");
  EXPECT_EQ(List("a-token"), (Ids{a1, a2}));
  EXPECT_EQ(List("b-token"), (Ids{b2, b3}));
  // Alice takes from bob, who holds more than his share (none)...
  const std::string a3 = TwoPages("a-token");
  EXPECT_EQ(List("b-token"), (Ids{b3}));
  // ...and, above her share now (6 pages), loses her least recently used one to him, but only
  // down to her share.
  const std::string b4 = TwoPages("b-token");
  EXPECT_EQ(List("a-token"), (Ids{a2, a3}));
  const std::string b5 = TwoPages("b-token");
  EXPECT_EQ(List("a-token"), (Ids{a2, a3}));
  EXPECT_EQ(List("b-token"), (Ids{b4, b5}));
  EXPECT_EQ(Get("b-token", b3).error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // evicted
}

TEST_F(TenantSharesTest, AQuietTenantWithinItsShareKeepsEverySessionWhileAnotherFloods) {
  const std::string a1 = TwoPages("a-token"), a2 = TwoPages("a-token");  // alice's share, full
  // Bob writes ten times alice's share through the pool, one session after another.
  for (int i = 0; i < 10; ++i) {
    const std::string b = Create("b-token");
    ASSERT_TRUE(Extend("b-token", b, 8).ok()) << i;
    ASSERT_TRUE(Extend("b-token", b, 8).ok()) << i;  // 4 pages: more than is left without alice's
  }
  EXPECT_EQ(List("a-token"), (std::vector<std::string>{a1, a2}));
  const std::string text = metrics_->ExpositionText();
  EXPECT_LE(Metric(text, "attnserve_tenant_sessions_evicted_total", {"tenant=\"alice\""}),
            0);  // no series, or 0
  EXPECT_GE(Metric(text, "attnserve_tenant_sessions_evicted_total", {"tenant=\"bob\""}), 8);
}

TEST_F(TenantSharesTest, IdsShareNothingButTheReplicaAndInstance) {
  std::vector<std::string> keys;
  for (int i = 0; i < 400; ++i) {
    const std::string id = Create("b-token");
    keys.push_back(id.substr(id.rfind('/') + 1));
    ASSERT_TRUE(Close("b-token", id).ok());
  }
  std::sort(keys.begin(), keys.end());
  // Neighbours in sorted order share the longest prefixes: of 400 random keys, about 4 hex
  // digits; 12 would happen by chance about once in 10^9 runs.
  size_t longest = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    ASSERT_NE(keys[i], keys[i - 1]);
    size_t n = 0;
    while (n < 32 && keys[i][n] == keys[i - 1][n]) ++n;
    longest = std::max(longest, n);
  }
  EXPECT_LT(longest, 12u);
  // Every digit position takes many values (a counter would fix the leading ones).
  for (size_t pos = 0; pos < 32; ++pos) {
    std::set<char> seen;
    for (const std::string& k : keys) seen.insert(k[pos]);
    EXPECT_GE(seen.size(), 12u) << "position " << pos;
  }
}

TEST_F(TenantSharesTest, MaxShareAndSessionLimitsAreRefusedNamingThem) {
  const std::string c = TwoPages("c-token");  // carol's 2 pages: her max_share
  const grpc::Status over = Extend("c-token", c, 1);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("max_share"));
  EXPECT_TRUE(
      Extend("b-token", TwoPages("b-token"), 4).ok());  // the pool has room: only hers is full

  const std::string d = Create("d-token");
  v1::CreateSessionRequest r = RawRequest();
  v1::CreateSessionResponse response;
  const grpc::Status second = stub_->CreateSession(As("d-token").get(), r, &response);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(), HasSubstr("sessions=1"));
  EXPECT_EQ(Fork("d-token", d).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Create("b-token").size() > 0);  // others are not held to dave's limit
}

TEST_F(TenantSharesTest, PinnedShareBoundsATenantsPinnedSessions) {
  v1::CreateSessionRequest r = RawRequest(/*pinned=*/true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(stub_->CreateSession(As("f-token").get(), r, &created).ok());
  const std::string id = created.session().session_id();
  ASSERT_TRUE(Extend("f-token", id, 8).ok());  // 2 pages: the share
  const grpc::Status over = Extend("f-token", id, 1);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("pinned_share"));
  const grpc::Status second = stub_->CreateSession(As("f-token").get(), r, &created);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(), HasSubstr("pinned_share"));
  r.set_pinned(false);  // unpinned sessions are not held to it
  EXPECT_TRUE(stub_->CreateSession(As("f-token").get(), r, &created).ok());
}

TEST_F(TenantsTest, InFlightLimitRefusesTheTenantsNextCallNotAnothers) {
  TearDown();
  auto gated = std::make_unique<testing::GatedBackend>();
  testing::GatedBackend* gate = gated.get();
  Start("erin token:e-token in_flight=1\nbob token:b-token\n", {}, std::move(gated));
  gate->Close();
  const int before = static_cast<int>(gate->batch_sizes().size());
  grpc::Status first, bobs;
  std::thread erin([&] { first = Attend("e-token"); });
  gate->AwaitCalls(before + 1);  // erin's call is in the backend: in flight
  const grpc::Status refused = Attend("e-token");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("in_flight=1"));
  std::thread bob([&] { bobs = Attend("b-token"); });  // not erin's limit
  gate->Open();
  erin.join();
  bob.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(bobs.ok()) << bobs.error_message();
  EXPECT_TRUE(Attend("e-token").ok());  // answered: her slot is free again
}

}  // namespace
}  // namespace attnserve
