// TLS, mutual TLS and bearer tokens, with certificates made by openssl for this test.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/file.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server_host.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A CA, a server certificate for "localhost" and 127.0.0.1, a client certificate signed by the
// CA, and one signed by an unrelated CA.
class Certificates {
 public:
  Certificates() {
    dir_ = fs::temp_directory_path() / ("attnserve-tls-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string d = dir_.string();
    const std::string script = "set -e; cd '" + d + "'\n" +
                               R"(
mkca() { openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$1" -keyout $1.key -out $1.pem 2>/dev/null; }
mkcert() {  # name ca extensions
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout $1.key -out $1.csr 2>/dev/null
  printf '%s\n' "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -days 2 -extfile $1.ext -out $1.pem 2>/dev/null
}
mkca ca; mkca otherca
mkcert server ca "subjectAltName=DNS:localhost,IP:127.0.0.1"
mkcert client ca "extendedKeyUsage=clientAuth"
mkcert stranger otherca "extendedKeyUsage=clientAuth"
mkcert service ca "subjectAltName=DNS:attnserve-grpc.test"
)";
    ok_ = std::system(("bash -c \"$(cat <<'EOS'\n" + script + "\nEOS\n)\"").c_str()) == 0;
  }
  ~Certificates() { fs::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string pem(const std::string& name) const { return ReadFileToString(path(name)).value(); }

 private:
  fs::path dir_;
  bool ok_ = false;
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new Certificates(); }
  static void TearDownTestSuite() { delete certs_; }
  void SetUp() override { ASSERT_TRUE(certs_->ok()) << "openssl could not make certificates"; }

  void Start(server::ServerOptions options) {
    options.listen_address = "127.0.0.1:0";
    host_.reset();  // a server started before, with the metrics it reports to
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
  }
  absl::Status Call(const ClientOptions& options) {
    ClientOptions o = options;
    o.timeout = absl::Seconds(10);
    auto client = Client::Create("127.0.0.1:" + std::to_string(host_->port()), o);
    if (!client.ok()) return client.status();
    return (*client)->ListModules().status();
  }
  ClientOptions TlsClient(const std::string& client_name = "") const {
    ClientOptions o;
    o.tls = true;
    o.tls_root_certs = certs_->pem("ca.pem");
    o.tls_server_name = "localhost";
    if (!client_name.empty()) {
      o.tls_client_cert = certs_->pem(client_name + ".pem");
      o.tls_client_key = certs_->pem(client_name + ".key");
    }
    return o;
  }

  static Certificates* certs_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
};
Certificates* SecurityTest::certs_ = nullptr;

TEST_F(SecurityTest, TlsRoundTripAndPlaintextClientsAreRefused) {
  server::ServerOptions options;
  options.tls.cert_file = certs_->path("server.pem");
  options.tls.key_file = certs_->path("server.key");
  Start(options);
  EXPECT_TRUE(Call(TlsClient()).ok());
  EXPECT_EQ(Call(ClientOptions()).code(), absl::StatusCode::kUnavailable);
  ClientOptions wrong_ca = TlsClient();
  wrong_ca.tls_root_certs = certs_->pem("otherca.pem");
  EXPECT_EQ(Call(wrong_ca).code(), absl::StatusCode::kUnavailable);
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateFromTheConfiguredCa) {
  server::ServerOptions options;
  options.tls.cert_file = certs_->path("server.pem");
  options.tls.key_file = certs_->path("server.key");
  options.tls.client_ca_file = certs_->path("ca.pem");
  Start(options);
  EXPECT_TRUE(Call(TlsClient("client")).ok());
  EXPECT_EQ(Call(TlsClient()).code(), absl::StatusCode::kUnavailable);  // no client certificate
  EXPECT_EQ(Call(TlsClient("stranger")).code(), absl::StatusCode::kUnavailable);
}

TEST_F(SecurityTest, BearerTokenIsCheckedOnEveryCall) {
  server::ServerOptions options;
  options.auth_token = "s3cret-token";
  Start(options);
  ClientOptions good;
  good.auth_token = "s3cret-token";
  EXPECT_TRUE(Call(good).ok());
  const absl::Status missing = Call(ClientOptions());
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("authorization: Bearer"));
  ClientOptions wrong;
  wrong.auth_token = "s3cret-tokeN";
  EXPECT_EQ(Call(wrong).code(), absl::StatusCode::kUnauthenticated);
  wrong.auth_token = "s3cret";
  EXPECT_EQ(Call(wrong).code(), absl::StatusCode::kUnauthenticated);
}

// Under mutual TLS with a tenants file, a call without a token is the tenant its certificate's
// common name names (with its `cert` line's roles), and one with a token is the token's tenant.
TEST_F(SecurityTest, ACertificateNamesItsTenantAndATokenOverridesIt) {
  const std::string file = certs_->path("tenants");
  std::ofstream(file) << "client cert operator\nalice token:a-token\n";
  server::ServerOptions options;
  options.tls.cert_file = certs_->path("server.pem");
  options.tls.key_file = certs_->path("server.key");
  options.tls.client_ca_file = certs_->path("ca.pem");
  options.tenants_file = file;
  Start(options);
  const auto client_as = [&](const std::string& token) {
    ClientOptions o = TlsClient("client");
    o.auth_token = token;
    o.timeout = absl::Seconds(10);
    return Client::Create("127.0.0.1:" + std::to_string(host_->port()), o).value();
  };
  auto cert = client_as("");
  auto alice = client_as("a-token");
  v1::CreateSessionRequest create;
  create.mutable_layout()->set_num_heads(1);
  create.mutable_layout()->set_num_kv_heads(1);
  create.mutable_layout()->set_head_dim(4);
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  auto alices = alice->CreateSession(create);
  ASSERT_TRUE(alices.ok()) << alices.status();
  auto certs = cert->CreateSession(create);
  ASSERT_TRUE(certs.ok()) << certs.status();
  v1::GetSessionRequest get;
  get.set_session_id(certs->session().session_id());
  EXPECT_EQ(alice->GetSession(get).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cert->GetSession(get).ok());
  // "client" is an operator: it lists alice's session too; alice lists only hers.
  auto listed = cert->ListSessions(v1::ListSessionsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->sessions_size(), 2);
  listed = alice->ListSessions(v1::ListSessionsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->sessions_size(), 1);
  EXPECT_EQ(listed->sessions(0).session_id(), alices->session().session_id());
  ClientOptions wrong = TlsClient("client");
  wrong.auth_token = "not-a-token";  // a token that is not listed is refused, certificate or not
  EXPECT_EQ(Call(wrong).code(), absl::StatusCode::kUnauthenticated);
}

// Session moves to a peer that requires client certificates: the replica presents its own
// (--session_peer_cert_file) and checks the peer's against the name its certificate is for
// (--session_peer_server_name), not the address it dials, as a "dns:" entry's pod IPs need.
TEST_F(SecurityTest, SessionsMoveToPeersThatRequireClientCertificates) {
  // The peer: TLS for "attnserve-grpc.test" only, client certificates of the CA required.
  server::ServerOptions peer_options;
  peer_options.listen_address = "127.0.0.1:0";
  peer_options.tls.cert_file = certs_->path("service.pem");
  peer_options.tls.key_file = certs_->path("service.key");
  peer_options.tls.client_ca_file = certs_->path("ca.pem");
  auto peer_metrics = metrics::Metrics::Create({}).value();
  auto peer = server::ServerHost::Start(peer_options, peer_metrics.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  const std::string peer_address = "127.0.0.1:" + std::to_string((*peer)->port());

  // This replica serves as the peer does; its caller (tenant "client", the certificate's common
  // name) finds its session on the peer under the same tenant.
  ClientOptions as_client = TlsClient("client");
  as_client.tls_server_name = "attnserve-grpc.test";
  as_client.timeout = absl::Seconds(10);
  const auto start = [&](server::PeerOptions peers) {
    server::ServerOptions options = peer_options;
    options.session_peers = std::move(peers);
    options.session_peers.peers = {peer_address};
    Start(options);
  };
  const auto client_here = [&] {
    return Client::Create("127.0.0.1:" + std::to_string(host_->port()), as_client).value();
  };
  const auto create_and_move = [&]() -> absl::StatusOr<v1::MoveSessionResponse> {
    auto client = client_here();
    v1::CreateSessionRequest create;
    create.mutable_layout()->set_num_heads(1);
    create.mutable_layout()->set_num_kv_heads(1);
    create.mutable_layout()->set_head_dim(4);
    create.set_cache_dtype(v1::DTYPE_FLOAT32);
    auto created = client->CreateSession(create);
    if (!created.ok()) return created.status();
    v1::ExtendSessionRequest extend;
    extend.set_session_id(created->session().session_id());
    const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    *extend.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {3, 1, 4}, rows);
    *extend.mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {3, 1, 4}, rows);
    *extend.mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {3, 1, 4}, rows);
    if (auto extended = client->ExtendSession(extend); !extended.ok()) return extended.status();
    v1::MoveSessionRequest move;
    move.set_session_id(created->session().session_id());
    move.set_peer(peer_address);
    return client->MoveSession(move);
  };
  server::PeerOptions tls;
  tls.ca_pem = certs_->pem("ca.pem");
  tls.cert_pem = certs_->pem("client.pem");
  tls.key_pem = certs_->pem("client.key");
  tls.server_name = "attnserve-grpc.test";
  start(tls);
  auto moved = create_and_move();
  ASSERT_TRUE(moved.ok()) << moved.status();
  auto on_peer = Client::Create(peer_address, as_client).value();
  v1::GetSessionRequest get;
  get.set_session_id(moved->session_id());
  auto described = on_peer->GetSession(get);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->session().length(), 3);

  // Without the certificate, or checking the peer's against the address dialled, the peer
  // cannot be reached, and the session stays where it was.
  for (const bool with_certificate : {false, true}) {
    server::PeerOptions wrong = tls;
    if (with_certificate) {
      wrong.server_name.clear();
    } else {
      wrong.cert_pem.clear();
      wrong.key_pem.clear();
    }
    start(wrong);
    const absl::Status refused = create_and_move().status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << with_certificate << refused;
    EXPECT_THAT(refused.message(), HasSubstr(peer_address)) << refused;
    auto listed = client_here()->ListSessions(v1::ListSessionsRequest());
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->sessions_size(), 1);
    EXPECT_EQ(listed->sessions(0).length(), 3) << "untouched";
  }
}

TEST_F(SecurityTest, HalfConfiguredTlsFailsStartup) {
  server::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.tls.cert_file = certs_->path("server.pem");
  auto metrics = metrics::Metrics::Create({}).value();
  auto host = server::ServerHost::Start(options, metrics.get());
  ASSERT_FALSE(host.ok());
  EXPECT_THAT(host.status().message(), HasSubstr("--tls_key_file"));
}

}  // namespace
}  // namespace attnserve
