// Sessions that outlive their process (issue 33), end to end through real servers: snapshots
// across a restart (--session_snapshot_dir) and moves between replicas (MoveSession, a drain
// with --session_peers, AcceptSessions). Every continued session is compared bit for bit with
// one that never stopped or moved; events (a gated backend, a peer that answers when told) order
// every step, no test depends on a timing window.
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/sessions/session_manager.h"
#include "server/transport/session_mover.h"
#include "tests/server/session_fixture.h"
#include "tests/testing/losable_store.h"
#include "tests/testing/seed_vectors.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;
using namespace session_testing;  // NOLINT: the fixture and its helpers

class SnapshotTest : public SessionTest {
 protected:
  static constexpr int64_t kHalf = 9, kEnd = 13;
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "attnserve_snapshot_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    SessionTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  server::ServerOptions Options(bool snapshots, const std::string& owner = "replica-a") {
    server::ServerOptions options = SmallPages();
    options.sessions.owner = owner;
    if (snapshots) options.session_snapshot_dir = dir_;
    return options;
  }
  std::string path() const { return dir_ + "/sessions.snapshot"; }
  // Five sessions of every sort, created and extended with tokens [0, kHalf): a pinned float32
  // one, a float16 one with a window and a soft-cap, a linear one, a module one and (after the
  // first extends) a fork of the first. Returns their ids.
  std::vector<std::string> CreateAndPrefill() {
    std::vector<std::string> ids;
    ids.push_back(CreateRaw(4, 2, 8, 6, /*pinned=*/true));
    v1::CreateSessionRequest windowed = RawLayout(4, 2, 8, 0, v1::DTYPE_FLOAT16);
    windowed.mutable_window()->set_left(5);
    windowed.set_softcap(1.5f);
    ids.push_back(Create(windowed).session_id());
    v1::CreateSessionRequest linear = windowed;
    linear.clear_window();
    linear.clear_softcap();
    linear.set_cache_dtype(v1::DTYPE_FLOAT32);
    linear.set_kind(v1::ATTENTION_KIND_LINEAR);
    ids.push_back(Create(linear).session_id());
    v1::CreateSessionRequest module;
    module.set_module("demo");
    module.set_cache_dtype(v1::DTYPE_FLOAT32);
    ids.push_back(Create(module).session_id());
    Extend(ids, 0, 5);
    ids.push_back(Fork(ids[0]));
    Extend(ids, 5, kHalf);
    return ids;
  }
  // Extends session `id`, the i-th of CreateAndPrefill's, with tokens [from, to); returns the
  // output.
  std::vector<float> ExtendOne(const std::string& id, size_t i, int64_t from, int64_t to) {
    if (i == 3) {
      const std::vector<float> input = Random(kEnd * 64, 97);
      v1::ExtendSessionRequest r;
      r.set_session_id(id);
      *r.mutable_input() = F32(Rows(input, 64, from, to), {to - from, 64});
      v1::ExtendSessionResponse response;
      const grpc::Status st = SessionTest::Extend(r, &response);
      EXPECT_TRUE(st.ok()) << st.error_message();
      return Floats(response.output());
    }
    const Sequence s(4, 2, 8, i == 1 || i == 2 ? 8 : 6, kEnd, 90 + static_cast<uint32_t>(i % 4));
    return Step(id, s, from, to);
  }
  // Extends each session with tokens [from, to); returns the outputs, session after session.
  std::vector<float> Extend(const std::vector<std::string>& ids, int64_t from, int64_t to) {
    std::vector<float> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<float> o = ExtendOne(ids[i], i, from, to);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }
  std::string dir_;
};

TEST_F(SnapshotTest, RestartedSessionsContinueBitForBitAsIfNeverStopped) {
  // The uninterrupted run.
  Start(Options(false));
  const std::vector<std::string> baseline = CreateAndPrefill();
  const std::vector<float> want = Extend(baseline, kHalf, kEnd);
  SessionTest::TearDown();

  Start(Options(true));
  const std::vector<std::string> ids = CreateAndPrefill();
  std::vector<v1::SessionInfo> before(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(Get(ids[i], &before[i]).ok());
  const v1::SessionPoolUsage usage = Usage();
  SessionTest::TearDown();  // the drain writes the snapshot
  ASSERT_TRUE(std::filesystem::exists(path()));
  EXPECT_EQ(std::filesystem::status(path()).permissions(),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
      << "the callers' keys and values, for this user only";
  const double file_bytes = static_cast<double>(std::filesystem::file_size(path()));
  EXPECT_EQ(Metric("attnserve_session_snapshot_bytes_total", {"op=\"written\""}), file_bytes);

  Start(Options(true));  // restores it, and removes the file
  EXPECT_FALSE(std::filesystem::exists(path()));
  EXPECT_EQ(Metric("attnserve_sessions_restored_total", {}), 5);
  EXPECT_EQ(Metric("attnserve_session_snapshot_bytes_total", {"op=\"restored\""}), file_bytes);
  EXPECT_EQ(Metric("attnserve_sessions_lost_total", {"reason=\"restart\""}), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::SessionInfo after;
    ASSERT_TRUE(Get(ids[i], &after).ok()) << i;
    after.clear_idle_us();
    before[i].clear_idle_us();
    EXPECT_EQ(after.SerializeAsString(), before[i].SerializeAsString()) << after.DebugString();
  }
  const v1::SessionPoolUsage restored = Usage();
  EXPECT_EQ(restored.SerializeAsString(), usage.SerializeAsString()) << restored.DebugString();
  v1::SessionInfo fork;
  ASSERT_TRUE(Get(ids[4], &fork).ok());
  EXPECT_GT(fork.shared_pages(), 0) << "the fork still shares pages with its parent";
  EXPECT_EQ(restored.pinned_sessions(), 1);
  // Two restarts: the ids of the first process stay valid in the third.
  std::vector<float> got = Extend(ids, kHalf, kHalf + 2);
  SessionTest::TearDown();
  Start(Options(true));
  const std::vector<float> rest = Extend(ids, kHalf + 2, kEnd);
  got.insert(got.end(), rest.begin(), rest.end());
  // Session after session in `want`; here the first two steps of every session come first.
  std::vector<float> want_in_order;
  {
    size_t at = 0;
    std::vector<std::vector<float>> per_session;
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t n = (i == 3 ? 64 : 4 * (i == 1 || i == 2 ? 8 : 6)) * (kEnd - kHalf);
      per_session.emplace_back(want.begin() + at, want.begin() + at + n);
      at += n;
    }
    ASSERT_EQ(at, want.size());
    for (int part = 0; part < 2; ++part) {
      for (const std::vector<float>& w : per_session) {
        const size_t first = w.size() / (kEnd - kHalf) * 2;
        if (part == 0) want_in_order.insert(want_in_order.end(), w.begin(), w.begin() + first);
        if (part == 1) want_in_order.insert(want_in_order.end(), w.begin() + first, w.end());
      }
    }
  }
  EXPECT_EQ(got, want_in_order);
  // An id this instance never issued still answers as lost on restart.
  std::string unknown = ids[0];
  unknown.back() = unknown.back() == '0' ? '1' : '0';
  std::string lost;
  v1::ExtendSessionResponse response;
  const grpc::Status st =
      SessionTest::Extend(Sequence(4, 2, 8, 6, 1, 1).Extend(unknown, 0, 1), &response, &lost);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(lost, "restarted");
}

// Pages a backend keeps on a device (a store without host pointers): a linear session steps its
// state through ReadPage and WriteRows, and a snapshot reads and restores them the same way;
// the rows equal, bit for bit, those of the same session on host pages, restart included.
TEST_F(SnapshotTest, LinearSessionsAndSnapshotsReachDevicePagesThroughTheStore) {
  const Sequence s(4, 2, 8, 6, 20, 77);
  v1::CreateSessionRequest create = RawLayout(4, 2, 8, 6, v1::DTYPE_FLOAT16);
  create.set_kind(v1::ATTENTION_KIND_LINEAR);
  Start(Options(false));  // host pages
  std::string id = Create(create).session_id();
  std::vector<float> want = Step(id, s, 0, 11);
  for (const auto& out : {Step(id, s, 11, 12), Step(id, s, 12, 20)}) {
    want.insert(want.end(), out.begin(), out.end());
  }
  SessionTest::TearDown();

  Start(Options(true), std::make_unique<testing::LosableStoreBackend>(/*device=*/true));
  id = Create(create).session_id();
  std::vector<float> got = Step(id, s, 0, 11);
  SessionTest::TearDown();  // the snapshot reads the device pages
  Start(Options(true), std::make_unique<testing::LosableStoreBackend>(/*device=*/true));
  for (const auto& out : {Step(id, s, 11, 12), Step(id, s, 12, 20)}) {
    got.insert(got.end(), out.begin(), out.end());
  }
  EXPECT_EQ(got, want);
}

// A module session comes back only to its module, loaded at start with the same weights: one
// whose module was loaded by LoadModule (gone with the process) is lost, and counted.
TEST_F(SnapshotTest, ASessionWhoseModuleIsNotLoadedAtStartIsLost) {
  Start(Options(true));
  auto c = testing::LoadSeedCase("seed_demo");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(LoadModule("loaded_by_rpc", c->bytes).ok());
  v1::CreateSessionRequest create;
  create.set_module("loaded_by_rpc");
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  const std::string gone = Create(create).session_id();
  const std::string kept = CreateRaw(4, 2, 8, 6);
  SessionTest::TearDown();
  Start(Options(true));
  EXPECT_EQ(Metric("attnserve_sessions_restored_total", {}), 1);
  EXPECT_EQ(Metric("attnserve_sessions_lost_total", {"reason=\"restart\""}), 1);
  EXPECT_TRUE(Get(kept).ok());
  EXPECT_EQ(Get(gone).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// A torn or corrupt snapshot, or another replica's, is refused whole (kept aside as
// sessions.snapshot.refused): its sessions are lost, never wrong, and the server serves.
TEST_F(SnapshotTest, ATornCorruptOrForeignSnapshotIsRefusedAndItsSessionsLost) {
  const std::vector<std::function<void(std::string*)>> damage = {
      [](std::string* b) { (*b)[b->size() / 2] ^= 0x10; },  // one bit of a page
      [](std::string* b) { b->resize(b->size() - 7); },     // torn
      [](std::string* b) { b->resize(b->size() / 3); },
      [](std::string* b) { (*b)[8] = 1; },  // written by a release of format version 1
      [](std::string*) {},                  // intact, but restored by another owner
  };
  for (size_t d = 0; d < damage.size(); ++d) {
    SCOPED_TRACE(d);
    Start(Options(true));
    const std::vector<std::string> ids = CreateAndPrefill();
    SessionTest::TearDown();
    std::string bytes;
    {
      std::ifstream in(path(), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    damage[d](&bytes);
    std::ofstream(path(), std::ios::binary | std::ios::trunc) << bytes;
    Start(Options(true, d + 1 == damage.size() ? "replica-b" : "replica-a"));
    EXPECT_FALSE(std::filesystem::exists(path()));
    EXPECT_TRUE(std::filesystem::exists(path() + ".refused"));
    for (const std::string& id : ids) {
      v1::SessionInfo info;
      const grpc::Status st = Get(id, &info);
      EXPECT_EQ(st.error_code(), d + 1 == damage.size() ? grpc::StatusCode::NOT_FOUND
                                                        : grpc::StatusCode::FAILED_PRECONDITION)
          << st.error_message();
    }
    EXPECT_EQ(Usage().sessions(), 0);
    EXPECT_EQ(Usage().pages_used(), 0);
    CreateRaw(4, 2, 8, 6);  // and it serves
    SessionTest::TearDown();
    std::filesystem::remove(path());
  }
}

// ---- Moves between replicas ----

// The value of trailing metadata `key` of a finished call ("" when absent).
std::string Trailer(const grpc::ClientContext& context, const std::string& key) {
  auto it = context.GetServerTrailingMetadata().find(key);
  return it == context.GetServerTrailingMetadata().end()
             ? ""
             : std::string(it->second.data(), it->second.size());
}

// The replica that sessions move from is the fixture's server (stub_); its peers are started
// here, each its own server with its own metrics.
class MoveTest : public SnapshotTest {
 protected:
  struct Peer {
    std::unique_ptr<metrics::Metrics> metrics;
    std::unique_ptr<server::ServerHost> host;
    std::unique_ptr<v1::AttentionService::Stub> stub;
    std::string address;
  };
  void TearDown() override {
    SnapshotTest::TearDown();
    peers_.clear();
  }
  // A peer owned as `owner` (its address when empty), on the reference backend.
  Peer& StartPeer(
      server::ServerOptions options,
      std::unique_ptr<kernels::Backend> backend = std::make_unique<kernels::ReferenceBackend>()) {
    options.listen_address = "127.0.0.1:0";
    Peer p;
    p.metrics = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, std::move(backend), p.metrics.get());
    EXPECT_TRUE(host.ok()) << host.status();
    p.host = *std::move(host);
    p.address = "127.0.0.1:" + std::to_string(p.host->port());
    p.stub = v1::AttentionService::NewStub(
        grpc::CreateChannel(p.address, grpc::InsecureChannelCredentials()));
    peers_.push_back(std::move(p));
    return peers_.back();
  }
  // The fixture's server (replica-a) with `peers` as its --session_peers.
  void StartWithPeers(const std::vector<std::string>& peers, bool snapshots = false) {
    server::ServerOptions options = Options(snapshots);
    options.session_peers.peers = peers;
    Start(options);
  }
  grpc::Status Move(const std::string& id, const std::string& peer,
                    v1::MoveSessionResponse* response = nullptr) {
    v1::MoveSessionRequest r;
    r.set_session_id(id);
    r.set_peer(peer);
    v1::MoveSessionResponse ignored;
    grpc::ClientContext context;
    return stub_->MoveSession(&context, r, response != nullptr ? response : &ignored);
  }
  // The new id the moved session `id` answers with on `stub` (its trailing metadata and its
  // message agree), or "" when it does not answer "moved".
  static std::string MovedTo(v1::AttentionService::Stub& stub, const std::string& id) {
    v1::GetSessionRequest r;
    r.set_session_id(id);
    v1::GetSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status st = stub.GetSession(&context, r, &response);
    const std::string to = Trailer(context, "attnserve-session-moved");
    if (to.empty()) return "";
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(st.error_message(), HasSubstr("session moved to '" + to + "'"));
    return to;
  }
  // The server's drain as SIGTERM starts it, with time to move its sessions (the fixture's
  // TearDown gives none: nothing moves).
  void Drain() {
    host_->Shutdown(absl::Seconds(60));
    SessionTest::TearDown();
  }
  // Runs `body` with stub_ talking to `peer`.
  template <typename Body>
  void On(Peer& peer, Body body) {
    stub_.swap(peer.stub);
    body();
    stub_.swap(peer.stub);
  }
  std::deque<Peer> peers_;  // StartPeer hands out references: they stay valid
};

TEST_F(MoveTest, MovedSessionsContinueBitForBitOnThePeer) {
  Start(Options(false));  // the uninterrupted run
  const std::vector<float> want = Extend(CreateAndPrefill(), kHalf, kEnd);
  SessionTest::TearDown();

  Peer& b = StartPeer(Options(false, "replica-b"));
  StartWithPeers({b.address});
  const std::vector<std::string> ids = CreateAndPrefill();
  std::vector<v1::SessionInfo> before(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(Get(ids[i], &before[i]).ok());
  std::vector<std::string> moved;
  for (const std::string& id : ids) {
    v1::MoveSessionResponse response;
    const grpc::Status st = Move(id, b.address, &response);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_THAT(response.session_id(), ::testing::StartsWith("replica-b/"));
    EXPECT_GT(response.bytes(), 0);
    moved.push_back(response.session_id());
  }
  // Gone from here, pages and all; each old id names its new one, here and on the peer.
  EXPECT_EQ(Usage().sessions(), 0);
  EXPECT_EQ(Usage().pages_used(), 0);
  EXPECT_EQ(Metric("attnserve_sessions_moved_total", {"direction=\"out\""}), 5);
  EXPECT_GT(Metric("attnserve_session_move_bytes_total", {}), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(MovedTo(*stub_, ids[i]), moved[i]);
    EXPECT_EQ(MovedTo(*b.stub, ids[i]), moved[i]) << "the peer knows the old id too";
  }
  v1::ExtendSessionResponse response;
  grpc::ClientContext context;
  const grpc::Status st = stub_->ExtendSession(
      &context, Sequence(4, 2, 8, 6, kEnd, 90).Extend(ids[0], kHalf, kEnd), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Trailer(context, "attnserve-session-moved"), moved[0]);

  std::vector<float> got;
  On(b, [&] {
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::SessionInfo after;
      ASSERT_TRUE(Get(moved[i], &after).ok());
      EXPECT_EQ(after.session_id(), moved[i]);
      // As it was, but for its id, its idle time, and pages it no longer shares (a fork moves
      // with a copy of its parent's pages).
      for (v1::SessionInfo* info : {&after, &before[i]}) {
        info->clear_session_id();
        info->clear_idle_us();
        info->clear_shared_pages();
      }
      EXPECT_EQ(after.SerializeAsString(), before[i].SerializeAsString()) << after.DebugString();
    }
    got = Extend(moved, kHalf, kEnd);
  });
  EXPECT_EQ(got, want);
  EXPECT_EQ(testing::MetricSample(b.metrics->ExpositionText(), "attnserve_sessions_moved_total",
                                  {"direction=\"in\""}),
            5);
}

TEST_F(MoveTest, ADrainMovesEverySessionToItsPeersInTurn) {
  Start(Options(false));
  const std::vector<float> want = Extend(CreateAndPrefill(), kHalf, kEnd);
  SessionTest::TearDown();

  Peer& b = StartPeer(Options(false, "replica-b"));
  Peer& c = StartPeer(Options(false, "replica-c"));
  StartWithPeers({b.address, c.address});
  const std::vector<std::string> ids = CreateAndPrefill();
  Drain();  // SIGTERM's: every session moves before the server stops
  // The old ids lead to the new ones on the peer that took each, in turn: b, c, b, c, b.
  std::vector<std::string> moved;
  for (size_t i = 0; i < ids.size(); ++i) {
    Peer& to = i % 2 == 0 ? b : c;
    Peer& other = i % 2 == 0 ? c : b;
    moved.push_back(MovedTo(*to.stub, ids[i]));
    EXPECT_THAT(moved.back(), ::testing::StartsWith(i % 2 == 0 ? "replica-b/" : "replica-c/"));
    EXPECT_EQ(MovedTo(*other.stub, ids[i]), "");
  }
  // Continued on their new replicas.
  std::vector<float> got;
  for (size_t i = 0; i < ids.size(); ++i) {
    On(i % 2 == 0 ? b : c, [&] {
      const std::vector<float> out = ExtendOne(moved[i], i, kHalf, kEnd);
      got.insert(got.end(), out.begin(), out.end());
    });
  }
  EXPECT_EQ(got, want);
}

TEST_F(MoveTest, AMoveThePeerRefusesLeavesTheSessionAsItWas) {
  Start(Options(false));
  const std::vector<float> want = Extend(CreateAndPrefill(), kHalf, kEnd);
  SessionTest::TearDown();

  server::ServerOptions no_demo = Options(false, "replica-b");
  no_demo.demo_module = false;
  Peer& b = StartPeer(no_demo);
  StartWithPeers({b.address});
  const std::vector<std::string> ids = CreateAndPrefill();
  // The module session: the peer has no module "demo".
  grpc::Status st = Move(ids[3], b.address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("module 'demo' is not loaded"));
  EXPECT_EQ(Metric("attnserve_session_move_failures_total", {"code=\"FAILED_PRECONDITION\""}), 1);
  // A peer that is not configured, an unknown session.
  st = Move(ids[0], "127.0.0.1:1");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("--session_peers"));
  std::string unknown = ids[0];
  unknown.back() = unknown.back() == '0' ? '1' : '0';
  EXPECT_EQ(Move(unknown, b.address).error_code(), grpc::StatusCode::NOT_FOUND);
  // Everything stayed, and goes on as if nothing was tried.
  EXPECT_EQ(Usage().sessions(), 5);
  EXPECT_EQ(Extend(ids, kHalf, kEnd), want);
  On(b, [&] { EXPECT_EQ(Usage().sessions(), 0); });

  // A server without peers has nothing to move to.
  SessionTest::TearDown();
  Start(Options(false));
  st = Move(CreateRaw(1, 1, 4, 4), b.address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("--session_peers"));
}

// A peer of `service` alone (a fake's AcceptSessions) on a port of its own, at *address.
std::unique_ptr<grpc::Server> StartFakePeer(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

// A peer that holds a transfer until told (its AcceptSessions, synchronous), and keeps it.
class HeldPeer final : public v1::AttentionService::Service {
 public:
  grpc::Status AcceptSessions(grpc::ServerContext*,
                              grpc::ServerReader<v1::AcceptSessionsRequest>* in,
                              v1::AcceptSessionsResponse* response) override {
    v1::AcceptSessionsRequest chunk;
    while (in->Read(&chunk)) transfer += chunk.data();
    received.Notify();
    release.WaitForNotification();
    response->add_session_ids(kNewId);
    return grpc::Status::OK;
  }
  static constexpr char kNewId[] = "replica-z/0000abcd/0123456789abcdef0123456789abcdef";
  std::string transfer;  // written before `received`
  absl::Notification received, release;
};

TEST_F(MoveTest, CallsDuringAMoveAreToldItIsMovingThenWhereItWent) {
  HeldPeer held;
  std::string address;
  std::unique_ptr<grpc::Server> peer = StartFakePeer(&held, &address);
  const Sequence s(1, 1, 4, 4, 8, 7);
  std::string id;
  grpc::Status st;
  {
    // An extend in flight that does not return: the switch waits for it until the transfer's
    // timeout (1 s here; the gate opens only after the move has answered), then gives up and
    // leaves the session as it was (ABORTED: try again).
    server::ServerOptions options = Options(false);
    options.session_peers.peers = {address};
    options.session_peers.timeout = absl::Seconds(1);
    Start(options);
    id = CreateRaw(1, 1, 4, 4);
    Step(id, s, 0, 5);
    gate_->Close();
    const int calls = static_cast<int>(gate_->batch_sizes().size());
    std::thread extend([&] { Step(id, s, 5, 6); });
    gate_->AwaitCalls(calls + 1);
    st = Move(id, address);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
    gate_->Open();
    extend.join();
    EXPECT_EQ(Step(id, s, 6, 7).size(), size_t{4}) << "it goes on where it was";
    SessionTest::TearDown();
  }
  StartWithPeers({address});
  id = CreateRaw(1, 1, 4, 4);
  Step(id, s, 0, 5);
  Step(id, s, 5, 6);

  v1::MoveSessionResponse moved;
  std::thread move([&] { st = Move(id, address, &moved); });
  held.received.WaitForNotification();  // copied; the switch waits for the peer's answer
  {
    v1::ExtendSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status refused = stub_->ExtendSession(&context, s.Extend(id, 6, 7), &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(refused.error_message(), HasSubstr("is moving"));
    EXPECT_NE(Trailer(context, "grpc-retry-pushback-ms"), "");
  }
  v1::SessionInfo info;
  EXPECT_TRUE(Get(id, &info).ok()) << "describing a moving session works";
  EXPECT_EQ(info.length(), 6);
  v1::ForkSessionRequest fork;
  fork.set_session_id(id);
  v1::ForkSessionResponse forked;
  grpc::ClientContext fork_context;
  EXPECT_EQ(stub_->ForkSession(&fork_context, fork, &forked).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Close(id).error_code(), grpc::StatusCode::UNAVAILABLE);
  held.release.Notify();
  move.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(moved.session_id(), HeldPeer::kNewId);
  EXPECT_EQ(MovedTo(*stub_, id), HeldPeer::kNewId);

  // What the peer got is one whole transfer: a real replica takes it, and refuses it torn or
  // corrupt, whole.
  Peer& b = StartPeer(Options(false, "replica-b"));
  // Sent in chunks of `chunk_bytes`: any split of the bytes is taken (the header, a page and
  // the sessions cut across chunks).
  const auto accept = [&](const std::string& transfer, v1::AcceptSessionsResponse* response,
                          size_t chunk_bytes = std::string::npos) {
    grpc::ClientContext context;
    auto writer = b.stub->AcceptSessions(&context, response);
    v1::AcceptSessionsRequest chunk;
    for (size_t at = 0; at < transfer.size(); at += chunk_bytes) {
      chunk.set_data(transfer.substr(at, chunk_bytes));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  std::string corrupt = held.transfer;
  corrupt[corrupt.size() / 2] ^= 0x10;
  for (const std::string& bad : {corrupt, held.transfer.substr(0, held.transfer.size() - 1),
                                 held.transfer.substr(0, held.transfer.size() / 2)}) {
    v1::AcceptSessionsResponse response;
    const grpc::Status refused = accept(bad, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::DATA_LOSS) << refused.error_message();
  }
  On(b, [&] { EXPECT_EQ(Usage().sessions(), 0); });
  v1::AcceptSessionsResponse response;
  ASSERT_TRUE(accept(held.transfer, &response, /*chunk_bytes=*/7).ok());
  ASSERT_EQ(response.session_ids_size(), 1);
  On(b, [&] {
    v1::SessionInfo taken;
    ASSERT_TRUE(Get(response.session_ids(0), &taken).ok());
    EXPECT_EQ(taken.length(), 6);
    // It goes on with the tokens the first replica had: a causal Attend over all of them.
    const std::vector<float> next = Step(response.session_ids(0), s, 6, 8);
    EXPECT_LE(MaxAbsDiff(next, Rows(CausalAttend(s, 8), 4, 6, 8)), 1e-6);
  });
  peer->Shutdown();
}

// A session keeps its tenant on the peer: its owner goes on with it, another tenant finds
// nothing (the old id included), and only an admin moves sessions or sends them.
TEST_F(MoveTest, AMovedSessionKeepsItsTenant) {
  const std::string tenants = dir_ + "/tenants";
  std::ofstream(tenants) << "alice token:a-token\nbob token:b-token\nroot token:r-token admin\n";
  server::ServerOptions options = Options(false, "replica-b");
  options.tenants_file = tenants;
  Peer& b = StartPeer(options);
  options = Options(false);
  options.tenants_file = tenants;
  options.session_peers.peers = {b.address};
  options.session_peers.token = "r-token";
  Start(options);
  const auto as = [](const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token);
    return context;
  };
  v1::CreateSessionResponse created;
  ASSERT_TRUE(stub_->CreateSession(as("a-token").get(), RawLayout(1, 1, 4, 4), &created).ok());
  const std::string id = created.session().session_id();
  const Sequence s(1, 1, 4, 4, 4, 3);
  v1::ExtendSessionResponse extended;
  ASSERT_TRUE(stub_->ExtendSession(as("a-token").get(), s.Extend(id, 0, 3), &extended).ok());

  v1::MoveSessionRequest move;
  move.set_session_id(id);
  move.set_peer(b.address);
  v1::MoveSessionResponse moved;
  grpc::Status st = stub_->MoveSession(as("a-token").get(), move, &moved);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("admin"));
  ASSERT_TRUE(stub_->MoveSession(as("r-token").get(), move, &moved).ok());

  v1::GetSessionRequest get;
  get.set_session_id(moved.session_id());
  v1::GetSessionResponse info;
  EXPECT_TRUE(b.stub->GetSession(as("a-token").get(), get, &info).ok());
  EXPECT_EQ(info.session().length(), 3);
  EXPECT_EQ(b.stub->GetSession(as("b-token").get(), get, &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
  get.set_session_id(id);  // the old id: moved for its tenant, never issued for another
  {
    auto context = as("a-token");
    EXPECT_EQ(b.stub->GetSession(context.get(), get, &info).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(Trailer(*context, "attnserve-session-moved"), moved.session_id());
  }
  {
    auto context = as("b-token");
    EXPECT_EQ(b.stub->GetSession(context.get(), get, &info).error_code(),
              grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(Trailer(*context, "attnserve-session-moved"), "");
    context = as("b-token");
    EXPECT_EQ(stub_->GetSession(context.get(), get, &info).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  ASSERT_TRUE(
      b.stub->ExtendSession(as("a-token").get(), s.Extend(moved.session_id(), 3, 4), &extended)
          .ok());
  EXPECT_EQ(extended.length(), 4);
  EXPECT_EQ(extended.session_id(), moved.session_id());
  // Sending sessions needs the admin role too.
  v1::AcceptSessionsResponse accepted;
  auto context = as("a-token");
  auto writer = b.stub->AcceptSessions(context.get(), &accepted);
  writer->WritesDone();
  st = writer->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("AcceptSessions needs the admin role"));
}

// A transfer of several sessions of one tenant is admitted against the tenant's limits with all
// of them together: a peer whose tenants file allows two sessions, half the pool or a quarter of
// it pinned refuses three sessions that pass each limit one at a time, and takes nothing.
TEST_F(MoveTest, ATransferIsAdmittedWithinEachTenantsLimitsCountedTogether) {
  const std::string tenants = dir_ + "/tenants";
  std::ofstream(tenants) << "alice token:a-token\nroot token:r-token admin\n";
  server::ServerOptions options = Options(true);
  options.tenants_file = tenants;
  Start(options);
  const auto as = [](const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token);
    return context;
  };
  const Sequence s(1, 1, 4, 4, 8, 5);
  for (bool pinned : {true, true, false}) {  // two pages (8 tokens) each, two of them pinned
    v1::CreateSessionRequest create = RawLayout(1, 1, 4, 4);
    create.set_pinned(pinned);
    v1::CreateSessionResponse created;
    ASSERT_TRUE(stub_->CreateSession(as("a-token").get(), create, &created).ok());
    v1::ExtendSessionResponse extended;
    const grpc::Status st = stub_->ExtendSession(
        as("a-token").get(), s.Extend(created.session().session_id(), 0, 8), &extended);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  SessionTest::TearDown();  // the drain writes the three sessions as one transfer
  std::string transfer;
  {
    std::ifstream in(path(), std::ios::binary);
    transfer.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_FALSE(transfer.empty());

  const std::vector<std::pair<std::string, std::string>> limits = {
      {"sessions=2", "sessions=2"},
      {"max_share=0.5", "max_share"},         // 4 of the 8 pages
      {"pinned_share=0.25", "pinned_share"},  // 2 of the 8 pages pinned
      {"", ""},
  };
  for (const auto& [limit, named] : limits) {
    SCOPED_TRACE(limit);
    const std::string peer_tenants = dir_ + "/peer_tenants";
    std::ofstream(peer_tenants, std::ios::trunc)
        << "alice token:a-token " << limit << "\nroot token:r-token admin\n";
    server::ServerOptions peer = Options(false, "replica-b");
    peer.tenants_file = peer_tenants;
    peer.sessions.pool_bytes = 8 * 128;  // 8 pages of 4 tokens of 1x4 float32 keys and values
    Peer& b = StartPeer(peer);
    v1::AcceptSessionsResponse accepted;
    auto context = as("r-token");
    auto writer = b.stub->AcceptSessions(context.get(), &accepted);
    v1::AcceptSessionsRequest chunk;
    chunk.set_data(transfer);
    writer->Write(chunk);
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    v1::ListSessionsResponse listed;
    ASSERT_TRUE(b.stub->ListSessions(as("a-token").get(), {}, &listed).ok());
    if (named.empty()) {
      EXPECT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(accepted.session_ids_size(), 3);
      EXPECT_EQ(listed.sessions_size(), 3);
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
      EXPECT_THAT(st.error_message(), HasSubstr(named));
      EXPECT_EQ(listed.sessions_size(), 0);
      EXPECT_EQ(listed.usage().pages_used(), 0) << "a refused transfer gives back its pages";
    }
  }
}

// A move copies the pages a session has filled while the session goes on: an extend during the
// pre-copy succeeds, and the session then continues on the peer bit for bit as if it had never
// moved. A sliding window drops pages meanwhile: they arrive, and the peer keeps only those the
// session holds; neither replica leaks a page.
TEST_F(MoveTest, ASessionGoesOnWhileTheMoveCopiesItsFilledPages) {
  for (const bool windowed : {false, true}) {
    SCOPED_TRACE(windowed ? "sliding window" : "causal");
    v1::CreateSessionRequest create = RawLayout(1, 1, 4, 4);
    if (windowed) create.mutable_window()->set_left(5);
    // 500 tokens when the move starts (125 pages filled; the window has dropped the first
    // 64: pages go back a split of 256 keys at a time), 540 when it switches (the window drops
    // pages 64-127 meanwhile, sent already), 548 on the peer.
    const Sequence s(1, 1, 4, 4, 548, 21);
    Start(Options(false));  // the uninterrupted run
    std::string id = Create(create).session_id();
    Step(id, s, 0, 500);
    std::vector<float> want = Step(id, s, 500, 540);
    for (float x : Step(id, s, 540, 548)) want.push_back(x);
    SessionTest::TearDown();

    Start(Options(false));
    Peer& b = StartPeer(Options(false, "replica-b"));
    id = Create(create).session_id();
    Step(id, s, 0, 500);
    std::string transfer;
    std::vector<float> got;
    int chunks = 0;
    absl::Duration pause;
    const absl::StatusOr<std::string> to = host_->sessions().Move(
        id, /*chunk_bytes=*/256,
        [&](std::string& chunk) {
          transfer += chunk;
          // The first chunk of the pre-copy: the session goes on meanwhile.
          if (chunks++ == 0) got = Step(id, s, 500, 540);
          return absl::OkStatus();
        },
        [&]() -> absl::StatusOr<std::string> {
          v1::AcceptSessionsResponse response;
          grpc::ClientContext context;
          auto writer = b.stub->AcceptSessions(&context, &response);
          v1::AcceptSessionsRequest chunk;
          chunk.set_data(transfer);
          writer->Write(chunk);
          writer->WritesDone();
          const grpc::Status st = writer->Finish();
          if (!st.ok()) return absl::InternalError(st.error_message());
          return response.session_ids(0);
        },
        absl::InfiniteFuture(), &pause);
    ASSERT_TRUE(to.ok()) << to.status();
    EXPECT_GT(chunks, 2) << "the pre-copy came in several chunks";
    ASSERT_EQ(got.size(), size_t{40 * 4});
    EXPECT_EQ(MovedTo(*stub_, id), *to);
    EXPECT_EQ(Usage().pages_used(), 0) << "the replica it left keeps no page of it";
    On(b, [&] {
      for (float x : Step(*to, s, 540, 548)) got.push_back(x);
      // 137 pages of four tokens; the window's session holds those from the split of key 512
      // on, and no page sent before the window dropped it.
      EXPECT_EQ(Usage().pages_used(), windowed ? 137 - 128 : 137);
    });
    EXPECT_EQ(got, want);
    SessionTest::TearDown();
    peers_.clear();
  }
}

// A peer that takes the first chunk of a transfer and then fails the call, as a peer that dies
// or refuses midway.
class CutPeer final : public v1::AttentionService::Service {
 public:
  grpc::Status AcceptSessions(grpc::ServerContext*,
                              grpc::ServerReader<v1::AcceptSessionsRequest>* in,
                              v1::AcceptSessionsResponse*) override {
    v1::AcceptSessionsRequest chunk;
    if (in->Read(&chunk)) first = chunk.data();
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "cut off");
  }
  std::string first;
};

// A transfer cut off midway, by either side: the session stays whole on the replica it was
// leaving and goes on as if nothing was tried; the other replica keeps nothing of it.
TEST_F(MoveTest, AMoveCutOffMidwayLeavesTheSessionWholeWhereItWas) {
  CutPeer cut;
  std::string address;
  std::unique_ptr<grpc::Server> peer = StartFakePeer(&cut, &address);
  server::ServerOptions options = Options(false);
  options.session_peers.peers = {address};
  options.sessions.prefill_chunk_tokens = 512;
  Start(options);
  // 2 KiB a token: 1536 tokens are three chunks of a transfer.
  const Sequence s(4, 4, 64, 64, 1540, 21);
  const std::string id = CreateRaw(4, 4, 64, 64);
  Step(id, s, 0, 1536);
  const grpc::Status st = Move(id, address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("cut off"));
  EXPECT_GT(cut.first.size(), size_t{1} << 20) << "a first chunk only: the transfer was cut";
  EXPECT_EQ(Metric("attnserve_session_move_failures_total", {"code=\"UNAVAILABLE\""}), 1);
  v1::SessionInfo info;
  ASSERT_TRUE(Get(id, &info).ok());
  EXPECT_EQ(info.length(), 1536);
  EXPECT_LE(MaxAbsDiff(Step(id, s, 1536, 1540), CausalAttendRows(s, 1536, 1540)), 1e-6);

  // The sender cut off: a real replica given the first chunk, then a cancelled call, keeps
  // nothing (what the import held goes back when the call ends).
  Peer& b = StartPeer(Options(false, "replica-b"));
  {
    grpc::ClientContext context;
    v1::AcceptSessionsResponse response;
    auto writer = b.stub->AcceptSessions(&context, &response);
    v1::AcceptSessionsRequest chunk;
    chunk.set_data(cut.first);
    ASSERT_TRUE(writer->Write(chunk));
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The call's end reaches the replica on its own threads: wait (generously) for its pages.
  v1::SessionPoolUsage usage;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
    On(b, [&] { usage = Usage(); });
    if (usage.pages_used() == 0) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(usage.pages_used(), 0);
  EXPECT_EQ(usage.sessions(), 0);
  peer->Shutdown();
}

// A peer whose pages are on a device (a store without host pointers: only WritePage and
// ReadPage reach them) takes a moved session whole, and it goes on there bit for bit as on the
// replica it left (a linear-attention session: its state is stepped through the store).
TEST_F(MoveTest, AMoveIntoDevicePagesGoesThroughTheStore) {
  v1::CreateSessionRequest linear = RawLayout(4, 2, 8, 8);
  linear.set_kind(v1::ATTENTION_KIND_LINEAR);
  const Sequence s(4, 2, 8, 8, 23, 31);
  Start(Options(false));  // the uninterrupted run
  std::string id = Create(linear).session_id();
  Step(id, s, 0, 21);
  const std::vector<float> want = Step(id, s, 21, 23);
  SessionTest::TearDown();

  Peer& b = StartPeer(Options(false, "replica-b"),
                      std::make_unique<testing::LosableStoreBackend>(/*device=*/true));
  StartWithPeers({b.address});
  id = Create(linear).session_id();
  Step(id, s, 0, 21);
  v1::MoveSessionResponse moved;
  ASSERT_TRUE(Move(id, b.address, &moved).ok());
  std::vector<float> got;
  On(b, [&] { got = Step(moved.session_id(), s, 21, 23); });
  EXPECT_EQ(got, want);
}

// While a drain moves its sessions, the replica creates and forks none (they would be left
// behind): UNAVAILABLE, create it elsewhere. Its sessions still answer meanwhile.
TEST_F(MoveTest, ADrainThatMovesSessionsCreatesNoneMeanwhile) {
  HeldPeer held;
  std::string address;
  std::unique_ptr<grpc::Server> peer = StartFakePeer(&held, &address);
  StartWithPeers({address});
  const std::string id = CreateRaw(1, 1, 4, 4);
  std::thread drain([&] { host_->Shutdown(absl::Seconds(30)); });
  held.received.WaitForNotification();  // the drain is moving the session
  v1::CreateSessionResponse created;
  grpc::ClientContext create;
  const grpc::Status st = stub_->CreateSession(&create, RawLayout(1, 1, 4, 4), &created);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("create (or fork) the session on another replica"));
  v1::ForkSessionRequest fork;
  fork.set_session_id(id);
  v1::ForkSessionResponse forked;
  grpc::ClientContext fork_context;
  EXPECT_EQ(stub_->ForkSession(&fork_context, fork, &forked).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Get(id).ok()) << "its session still answers";
  held.release.Notify();
  drain.join();
  peer->Shutdown();
}

// A drain's moves end with its grace period: a transfer the peer has not answered by then is
// given up, and its session, still whole here, goes to the snapshot like one with no peer.
TEST_F(MoveTest, ADrainStopsMovingWhenItsGracePeriodEnds) {
  HeldPeer held;  // takes the transfer and answers only when told: after the grace period
  std::string address;
  std::unique_ptr<grpc::Server> peer = StartFakePeer(&held, &address);
  server::ServerOptions options = Options(true);
  options.session_peers.peers = {address};
  options.session_peers.timeout = absl::Hours(1);  // the grace period ends the transfer
  Start(options);
  const Sequence s(1, 1, 4, 4, 8, 3);
  const std::string id = CreateRaw(1, 1, 4, 4);
  Step(id, s, 0, 5);
  host_->Shutdown(absl::Milliseconds(300));  // returns: the move was given up
  held.release.Notify();
  peer->Shutdown();
  SessionTest::TearDown();
  ASSERT_TRUE(std::filesystem::exists(path()));
  Start(Options(true));
  EXPECT_EQ(Metric("attnserve_sessions_restored_total", {}), 1);
  const std::vector<float> rest = Step(id, s, 5, 8);
  SessionTest::TearDown();
  Start(Options(false));
  const std::string again = CreateRaw(1, 1, 4, 4);
  Step(again, s, 0, 5);
  EXPECT_EQ(Step(again, s, 5, 8), rest) << "continued after the restore as if never stopped";
}

// "dns:host:port" peers: every address the name has when a move starts, this replica's own left
// out (a headless Service lists the draining pod too until it is taken out).
TEST(ResolvePeersTest, NamesResolveToEveryAddressButThisReplicas) {
  const std::vector<std::string> all = server::ResolvePeers({"dns:localhost:5", "10.0.0.7:9"}, "");
  EXPECT_THAT(all, ::testing::Contains("127.0.0.1:5"));
  EXPECT_EQ(all.back(), "10.0.0.7:9");
  const std::vector<std::string> others =
      server::ResolvePeers({"dns:localhost:5", "10.0.0.7:9", "dns:127.0.0.1:5"}, "127.0.0.1:5");
  EXPECT_THAT(others, ::testing::Not(::testing::Contains("127.0.0.1:5")));
  EXPECT_THAT(others, ::testing::Contains("10.0.0.7:9"));
  EXPECT_THAT(server::ResolvePeers({"dns:no-such-host.invalid:5"}, ""), ::testing::IsEmpty());
  // An owner that names a host (a StatefulSet pod's stable name) leaves out every address the
  // host has, at its port only.
  const std::vector<std::string> by_name =
      server::ResolvePeers({"dns:127.0.0.1:5", "127.0.0.1:6", "10.0.0.7:5"}, "localhost:5");
  EXPECT_EQ(by_name, (std::vector<std::string>{"127.0.0.1:6", "10.0.0.7:5"}));
  EXPECT_TRUE(server::CheckPeerEntries({"a:1", "dns:b.svc:50051", "[::1]:7", "dns:[::1]:7"}).ok());
  for (const char* bad : {"a", "dns:b", "a:", ":5", "dns::5", "a:5x", "[::1:7"}) {
    const absl::Status st = server::CheckPeerEntries({"a:1", bad});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
  // The TLS settings go together.
  server::PeerOptions tls;
  tls.peers = {"a:1"};
  tls.ca_pem = "roots";
  EXPECT_TRUE(server::CheckPeerOptions(tls).ok());
  tls.cert_pem = "chain";
  EXPECT_THAT(server::CheckPeerOptions(tls).message(), HasSubstr("--session_peer_key_file"));
  tls.key_pem = "key";
  tls.server_name = "attnserve-grpc.ns.svc";
  EXPECT_TRUE(server::CheckPeerOptions(tls).ok());
  tls.ca_pem.clear();
  EXPECT_THAT(server::CheckPeerOptions(tls).message(),
              HasSubstr("--session_peer_cert_file needs --session_peer_ca_file"));
  tls.cert_pem.clear();
  tls.key_pem.clear();
  EXPECT_THAT(server::CheckPeerOptions(tls).message(),
              HasSubstr("--session_peer_server_name needs --session_peer_ca_file"));
  tls.peers = {"a"};
  EXPECT_EQ(server::CheckPeerOptions(tls).code(), absl::StatusCode::kInvalidArgument);
}

// A drain resolves its "dns:" peers when it starts and moves every session to them.
TEST_F(MoveTest, ADrainMovesSessionsToThePeersANameResolvesTo) {
  Peer& b = StartPeer(Options(false, "replica-b"));
  StartWithPeers({"dns:localhost:" + std::to_string(b.host->port())});
  const Sequence s(1, 1, 4, 4, 8, 9);
  const std::string id = CreateRaw(1, 1, 4, 4);
  Step(id, s, 0, 5);
  // MoveSession takes an address the name resolves to.
  v1::MoveSessionResponse moved;
  ASSERT_TRUE(Move(id, b.address, &moved).ok());
  const std::string second = CreateRaw(1, 1, 4, 4);
  Step(second, s, 0, 5);
  Drain();
  EXPECT_EQ(testing::MetricSample(b.metrics->ExpositionText(), "attnserve_sessions_moved_total",
                                  {"direction=\"in\""}),
            2);
  EXPECT_THAT(MovedTo(*b.stub, second), ::testing::StartsWith("replica-b/"));
}

}  // namespace
}  // namespace attnserve
