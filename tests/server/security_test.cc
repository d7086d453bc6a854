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
