// The C++ session helpers (client/session.h) against real in-process servers: a raw session's
// prefill and steps equal causal attention over the whole sequence computed in float64 here, a
// fork diverges from its parent, ExtendSessions and the stream answer as ExtendSession does,
// and a client given two servers' addresses routes each session to the server that holds it.
#include <cmath>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/session.h"
#include "client/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "server/server_host.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr int kHq = 4, kHkv = 2, kD = 8;

// Token-major [n, h, kD] standard normals.
std::vector<float> Random(int64_t n, int h, std::mt19937* rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n * h * kD);
  for (float& x : v) x = dist(*rng);
  return v;
}

// Rows [from, to) of a token-major [L, h, kD] tensor.
v1::Tensor Rows(const std::vector<float>& all, int h, int64_t from, int64_t to) {
  return MakeTensor(v1::DTYPE_FLOAT32, {to - from, h, kD},
                    std::vector<float>(all.begin() + from * h * kD, all.begin() + to * h * kD));
}

// Causal attention of tokens [from, to) over tokens [0, to), float64, [to - from, kHq, kD].
std::vector<double> Causal64(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, int64_t from, int64_t to) {
  std::vector<double> out((to - from) * kHq * kD);
  for (int64_t i = from; i < to; ++i) {
    for (int h = 0; h < kHq; ++h) {
      const int g = h / (kHq / kHkv);
      std::vector<double> s(i + 1);
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < kD; ++d)
          dot += double{q[(i * kHq + h) * kD + d]} * k[(j * kHkv + g) * kD + d];
        s[j] = dot / std::sqrt(double{kD});
        max = std::max(max, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - max));
      for (int d = 0; d < kD; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += s[j] / sum * v[(j * kHkv + g) * kD + d];
        out[((i - from) * kHq + h) * kD + d] = acc;
      }
    }
  }
  return out;
}

double MaxError(const v1::Tensor& got, const std::vector<double>& want) {
  std::vector<float> g = TensorToFloats(got).value();
  if (g.size() != want.size()) return INFINITY;
  double e = 0;
  for (size_t i = 0; i < g.size(); ++i) e = std::max(e, std::fabs(g[i] - want[i]));
  return e;
}

struct LiveServer {
  explicit LiveServer(std::vector<std::string> peers = {}) {
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.backend = "cpu";
    options.session_peers.peers = std::move(peers);
    metrics = metrics::Metrics::Create({}).value();
    host = server::ServerHost::Start(options, metrics.get()).value();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(host->port()); }
  std::unique_ptr<metrics::Metrics> metrics;
  std::unique_ptr<server::ServerHost> host;
};

HeadLayout Layout() {
  HeadLayout l;
  l.num_heads = kHq;
  l.num_kv_heads = kHkv;
  l.head_dim = kD;
  return l;
}

TEST(SessionLiveTest, PrefillAndStepsEqualCausalAttention) {
  LiveServer server;
  auto client = Client::Create(server.address()).value();
  std::mt19937 rng(1);
  const int64_t n = 19;
  const auto q = Random(n, kHq, &rng), k = Random(n, kHkv, &rng), v = Random(n, kHkv, &rng);
  Session s = Session::CreateRaw(client.get(), Layout()).value();
  for (auto [from, to] : std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 17}, {17, 19}}) {
    auto r = s.Extend(Rows(q, kHq, from, to), Rows(k, kHkv, from, to), Rows(v, kHkv, from, to));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->length(), to);
    EXPECT_EQ(s.length(), to);
    EXPECT_LT(MaxError(r->output(), Causal64(q, k, v, from, to)), 2e-5) << from;
  }
  // A fork continues from the same 19 tokens; the parent is untouched by the child's step.
  Session child = s.Fork().value();
  const auto q2 = Random(1, kHq, &rng), k2 = Random(1, kHkv, &rng), v2 = Random(1, kHkv, &rng);
  auto c = child.Extend(Rows(q2, kHq, 0, 1), Rows(k2, kHkv, 0, 1), Rows(v2, kHkv, 0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  auto qc = q, kc = k, vc = v;
  qc.insert(qc.end(), q2.begin(), q2.end());
  kc.insert(kc.end(), k2.begin(), k2.end());
  vc.insert(vc.end(), v2.begin(), v2.end());
  EXPECT_LT(MaxError(c->output(), Causal64(qc, kc, vc, n, n + 1)), 2e-5);
  EXPECT_EQ(s.Describe().value().length(), n);
  EXPECT_EQ(child.Describe().value().parent_id(), s.id());
  // A wrong expected_length is ABORTED and appends nothing.
  v1::ExtendSessionRequest wrong;
  *wrong.mutable_query() = Rows(q, kHq, 0, 1);
  *wrong.mutable_key() = Rows(k, kHkv, 0, 1);
  *wrong.mutable_value() = Rows(v, kHkv, 0, 1);
  wrong.set_expected_length(3);
  EXPECT_EQ(s.Extend(wrong).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.Describe().value().length(), n);
}

// SessionOptions' score modifications reach the server: a window of one key (each token's own)
// makes every output row its own value row, whatever the soft-cap and ALiBi do to the scores.
TEST(SessionLiveTest, OptionsCarryTheScoreModifications) {
  LiveServer server;
  auto client = Client::Create(server.address()).value();
  std::mt19937 rng(3);
  const int64_t n = 9;
  const auto q = Random(n, kHq, &rng), k = Random(n, kHkv, &rng), v = Random(n, kHkv, &rng);
  SessionOptions options;
  options.window_left = 0;
  options.softcap = 5.0f;
  options.alibi_standard = true;
  Session s = Session::CreateRaw(client.get(), Layout(), options).value();
  EXPECT_EQ(s.info().window_left(), 0);
  EXPECT_EQ(s.info().softcap(), 5.0f);
  EXPECT_EQ(s.info().alibi_slopes_size(), kHq);
  auto r = s.Extend(Rows(q, kHq, 0, n), Rows(k, kHkv, 0, n), Rows(v, kHkv, 0, n));
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<float> own(size_t(n) * kHq * kD);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kHq; ++h) {
      for (int d = 0; d < kD; ++d) {
        own[(t * kHq + h) * kD + d] = v[(t * kHkv + h / (kHq / kHkv)) * kD + d];
      }
    }
  }
  std::vector<double> want(own.begin(), own.end());
  EXPECT_LT(MaxError(r->output(), want), 1e-6);
}

TEST(SessionLiveTest, BatchAndStreamAnswerAsExtendDoes) {
  LiveServer server;
  auto client = Client::Create(server.address()).value();
  std::mt19937 rng(2);
  const int64_t n = 6;
  std::vector<std::vector<float>> qs, ks, vs;
  std::vector<Session> sessions;
  for (int i = 0; i < 3; ++i) {
    qs.push_back(Random(n, kHq, &rng));
    ks.push_back(Random(n, kHkv, &rng));
    vs.push_back(Random(n, kHkv, &rng));
    sessions.push_back(Session::CreateRaw(client.get(), Layout()).value());
    ASSERT_TRUE(
        sessions[i]
            .Extend(Rows(qs[i], kHq, 0, 4), Rows(ks[i], kHkv, 0, 4), Rows(vs[i], kHkv, 0, 4))
            .ok());
  }
  std::vector<std::pair<Session*, v1::ExtendSessionRequest>> steps;
  for (int i = 0; i < 3; ++i) {
    v1::ExtendSessionRequest r;
    *r.mutable_query() = Rows(qs[i], kHq, 4, 5);
    *r.mutable_key() = Rows(ks[i], kHkv, 4, 5);
    *r.mutable_value() = Rows(vs[i], kHkv, 4, 5);
    steps.emplace_back(&sessions[i], r);
  }
  auto results = ExtendSessions(client.get(), steps);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*results)[i].ok()) << (*results)[i].status();
    EXPECT_LT(MaxError((*results)[i]->output(), Causal64(qs[i], ks[i], vs[i], 4, 5)), 2e-5);
    EXPECT_EQ(sessions[i].length(), 5);
  }
  std::unique_ptr<AttentionStream> stream = client->OpenStream();
  for (int i = 0; i < 3; ++i) {
    v1::ExtendSessionRequest r;
    *r.mutable_query() = Rows(qs[i], kHq, 5, 6);
    *r.mutable_key() = Rows(ks[i], kHkv, 5, 6);
    *r.mutable_value() = Rows(vs[i], kHkv, 5, 6);
    ASSERT_TRUE(stream->Send(i, sessions[i].Prepare(r)));
  }
  stream->CloseSend();
  v1::AttentionStreamResponse response;
  int answered = 0;
  while (stream->Read(&response)) {
    const int i = static_cast<int>(response.request_id());
    ASSERT_EQ(response.code(), 0) << response.message();
    EXPECT_LT(MaxError(response.extend_session().output(), Causal64(qs[i], ks[i], vs[i], 5, 6)),
              2e-5);
    sessions[i].Applied(response.extend_session());
    ++answered;
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answered, 3);
  for (Session& s : sessions) EXPECT_EQ(s.Describe().value().length(), 6);
}

TEST(SessionLiveTest, TwoServersEachSessionReachesItsOwner) {
  LiveServer a, b;
  auto client = Client::CreateBalanced({a.address(), b.address()}).value();
  std::mt19937 rng(3);
  const int64_t n = 4;
  std::vector<std::vector<float>> qs, ks, vs;
  std::vector<Session> sessions;
  for (int i = 0; i < 4; ++i) {
    qs.push_back(Random(n, kHq, &rng));
    ks.push_back(Random(n, kHkv, &rng));
    vs.push_back(Random(n, kHkv, &rng));
    sessions.push_back(Session::CreateRaw(client.get(), Layout()).value());
  }
  EXPECT_EQ(SessionOwner(sessions[0].id()).value(), a.address());
  EXPECT_EQ(SessionOwner(sessions[1].id()).value(), b.address());
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < 4; ++i) {
      auto r = sessions[i].Extend(Rows(qs[i], kHq, t, t + 1), Rows(ks[i], kHkv, t, t + 1),
                                  Rows(vs[i], kHkv, t, t + 1));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LT(MaxError(r->output(), Causal64(qs[i], ks[i], vs[i], t, t + 1)), 2e-5);
    }
  }
  for (const std::string& replica : {a.address(), b.address()}) {
    auto listed = client->ListSessions({}, replica);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->sessions_size(), 2) << replica;
  }
  // A server asked about another's session says where it lives.
  auto direct = Client::Create(b.address()).value();
  v1::GetSessionRequest get;
  get.set_session_id(sessions[0].id());
  auto r = direct->GetSession(get);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(a.address()));
  sessions.clear();  // closes them all, each on its own server
  for (const std::string& replica : {a.address(), b.address()}) {
    EXPECT_EQ(client->ListSessions({}, replica).value().usage().pages_used(), 0) << replica;
  }
}

// Sessions moved to other replicas, by an operator and by a drain, are followed by the client:
// the Session wrapper's extends, ExtendSessions and an asynchronous extend of a client that
// never saw the move all reach the session on its new replica, which goes on as before; after
// a replica's drain, also a batch and an extend naming its sessions by their ids there.
TEST(SessionLiveTest, CallsFollowMovedSessions) {
  LiveServer b, c;
  LiveServer a({b.address(), c.address()});
  auto client = Client::CreateBalanced({a.address(), b.address(), c.address()}).value();
  std::mt19937 rng(5);
  const int64_t n = 6;
  std::vector<std::vector<float>> qs, ks, vs;
  std::vector<Session> sessions;
  for (int i = 0; i < 7; ++i) {  // in turn: a, b, c, a, b, c, a
    qs.push_back(Random(n, kHq, &rng));
    ks.push_back(Random(n, kHkv, &rng));
    vs.push_back(Random(n, kHkv, &rng));
    sessions.push_back(Session::CreateRaw(client.get(), Layout()).value());
  }
  const auto step = [&](int i, int64_t t) {
    auto r = sessions[i].Extend(Rows(qs[i], kHq, t, t + 1), Rows(ks[i], kHkv, t, t + 1),
                                Rows(vs[i], kHkv, t, t + 1));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(MaxError(r->output(), Causal64(qs[i], ks[i], vs[i], t, t + 1)), 2e-5);
    EXPECT_EQ(r->session_id(), sessions[i].id());
  };
  for (int i : {0, 3, 6}) {
    ASSERT_EQ(SessionOwner(sessions[i].id()).value(), a.address());
    step(i, 0);
    step(i, 1);
  }
  const std::string first_id = sessions[0].id();

  // An operator moves session 0 to b and session 3 to c.
  v1::MoveSessionRequest move;
  move.set_session_id(sessions[0].id());
  move.set_peer(b.address());
  auto moved = client->MoveSession(move);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(SessionOwner(moved->session_id()).value(), b.address());
  move.set_session_id(sessions[3].id());
  move.set_peer(c.address());
  ASSERT_TRUE(client->MoveSession(move).ok());

  // A client that never saw the moves: its calls are answered "moved", and it follows.
  auto other = Client::CreateBalanced({a.address(), b.address(), c.address()}).value();
  v1::GetSessionRequest get;
  get.set_session_id(first_id);
  auto described = other->GetSession(get);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->session().session_id(), moved->session_id());
  EXPECT_EQ(described->session().length(), 2);
  auto request = std::make_shared<v1::ExtendSessionRequest>();
  request->set_session_id(first_id);
  request->set_expected_length(2);
  *request->mutable_query() = Rows(qs[0], kHq, 2, 3);
  *request->mutable_key() = Rows(ks[0], kHkv, 2, 3);
  *request->mutable_value() = Rows(vs[0], kHkv, 2, 3);
  std::promise<absl::StatusOr<v1::ExtendSessionResponse>> answered;
  other->ExtendSessionAsync(request, [&](absl::StatusOr<v1::ExtendSessionResponse> r) {
    answered.set_value(std::move(r));
  });
  auto async = answered.get_future().get();
  ASSERT_TRUE(async.ok()) << async.status();
  EXPECT_EQ(async->session_id(), moved->session_id());
  EXPECT_LT(MaxError(async->output(), Causal64(qs[0], ks[0], vs[0], 2, 3)), 2e-5);
  sessions[0].Applied(*async);
  EXPECT_EQ(sessions[0].id(), moved->session_id());
  step(0, 3);

  // Session 3 in a batch, still named by its old id: the item follows to c.
  std::vector<std::pair<Session*, v1::ExtendSessionRequest>> batch(2);
  for (int j = 0; j < 2; ++j) {
    const int i = j == 0 ? 3 : 0;
    const int64_t t = j == 0 ? 2 : 4;
    batch[j].first = &sessions[i];
    *batch[j].second.mutable_query() = Rows(qs[i], kHq, t, t + 1);
    *batch[j].second.mutable_key() = Rows(ks[i], kHkv, t, t + 1);
    *batch[j].second.mutable_value() = Rows(vs[i], kHkv, t, t + 1);
  }
  auto results = ExtendSessions(client.get(), batch);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].status();
  EXPECT_LT(MaxError((*results)[0]->output(), Causal64(qs[3], ks[3], vs[3], 2, 3)), 2e-5);
  EXPECT_EQ(SessionOwner(sessions[3].id()).value(), c.address());

  // a drains: its last session moves (to b, the next peer in turn) before a stops. The client
  // finds a gone, asks b and c, and sends the extend again (it carries expected_length).
  const std::string id_on_a = sessions[6].id();
  a.host->Shutdown(absl::Seconds(10));
  step(6, 2);
  EXPECT_NE(SessionOwner(sessions[6].id()).value(), a.address());

  // Clients that saw none of it. A batch naming 6 by its id on a and 3 by its id on c: the
  // call to a fails as a whole, 6 is looked for on b and c and sent again, both answered. An
  // extend of 6 by its id on a likewise; the attempt sent again is not judged by the throttle
  // (the first one's refusal counts, the second's success too).
  const auto extend_request = [&](int i, const std::string& id, int64_t t) {
    v1::ExtendSessionRequest r;
    r.set_session_id(id);
    r.set_expected_length(t);
    *r.mutable_query() = Rows(qs[i], kHq, t, t + 1);
    *r.mutable_key() = Rows(ks[i], kHkv, t, t + 1);
    *r.mutable_value() = Rows(vs[i], kHkv, t, t + 1);
    return r;
  };
  {
    auto fresh = Client::CreateBalanced({a.address(), b.address(), c.address()}).value();
    v1::ExtendSessionsRequest both;
    *both.add_steps() = extend_request(6, id_on_a, 3);
    *both.add_steps() = extend_request(3, sessions[3].id(), 3);
    auto answered = fresh->ExtendSessions(both);
    ASSERT_TRUE(answered.ok()) << answered.status();
    ASSERT_EQ(answered->results_size(), 2);
    for (int j = 0; j < 2; ++j) {
      const int i = j == 0 ? 6 : 3;
      const v1::ExtendSessionResult& r = answered->results(j);
      ASSERT_EQ(r.code(), 0) << "item " << j << ": " << r.message();
      EXPECT_LT(MaxError(r.response().output(), Causal64(qs[i], ks[i], vs[i], 3, 4)), 2e-5);
      EXPECT_EQ(r.response().session_id(), sessions[i].id());
      sessions[i].Applied(r.response());
    }
    EXPECT_EQ(fresh->throttle()->Counts(), std::make_pair(int64_t{3}, int64_t{2}));
  }
  {
    auto fresh = Client::CreateBalanced({a.address(), b.address(), c.address()}).value();
    auto r = fresh->ExtendSession(extend_request(6, id_on_a, 4));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(MaxError(r->output(), Causal64(qs[6], ks[6], vs[6], 4, 5)), 2e-5);
    EXPECT_EQ(r->session_id(), sessions[6].id());
    sessions[6].Applied(*r);
    EXPECT_EQ(fresh->throttle()->Counts(), std::make_pair(int64_t{2}, int64_t{1}));
  }
  step(6, 5);
  step(3, 4);
  sessions.clear();  // closes them all, each on its replica now
  for (const std::string& replica : {b.address(), c.address()}) {
    EXPECT_EQ(client->ListSessions({}, replica).value().usage().pages_used(), 0) << replica;
  }
}

}  // namespace
}  // namespace attnserve
