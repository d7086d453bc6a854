// Who is calling, and what they may do: the server's authentication of a call from its metadata
// (bearer tokens) or its TLS peer (a client certificate's common name under mutual TLS, which
// gRPC itself has verified before any handler runs).
//
// A caller is a tenant. Every stateful resource belongs to one: a decode session to the tenant
// that created (or forked) it, and another tenant's session answers as an id that does not
// exist. Roles say what a tenant may do beyond computing and its own sessions:
//   admin      LoadModule and UnloadModule (where --allow_module_rpc lets anyone at all)
//   operator   ListSessions lists every tenant's sessions, not only its own
//
// Where tenants come from (AuthOptions):
//   tenants_file   one tenant a line: `<tenant> <credential> [<role>,...]`, '#' starts a comment.
//                  <credential> is `token:<bearer token>`, `sha256:<hex of the token's SHA-256>`
//                  (the file need not hold the token itself), or `cert` (the client certificate
//                  whose common name is <tenant>, under mutual TLS). Roles: admin, operator,
//                  compute (none beyond computing; the default). Shares, as key=value fields:
//                  sessions=<n> (most sessions held at once), share=<f> (the fraction of the
//                  session pool guaranteed: never evicted for another tenant while within it),
//                  max_share=<f> (the most of the pool it may hold), pinned_share=<f> (the
//                  most its pinned sessions may hold), in_flight=<n> (its most calls in
//                  flight: server/core/tenant_calls.h); see
//                  sessions::TenantShares. Tenants not listed have no limit and no guarantee;
//                  a tenant on several lines (several tokens) has the shares of its first.
//                  Read again on Reload (SIGHUP),
//                  and when the file changes (checked at most once a second, on a call); a file
//                  that does not parse leaves the last good table in force.
//                  A call must carry a listed token ('authorization: Bearer <token>'), or, with
//                  none, a client certificate: a listed one gets its roles, any other (gRPC has
//                  verified it against --tls_client_ca_file) is a tenant named by its common
//                  name with no role.
//   token          the one shared token of --auth_token_file: every caller that has it is the
//                  same tenant (""), with every role (today's single-tenant server).
//   mutual TLS without a tenants file: each client certificate's common name is a tenant, with
//                  the admin role (module rpcs stay as --allow_module_rpc says) but not operator.
//   nothing configured: every caller is the one anonymous tenant "", with every role.
//
// Tokens are kept only as their SHA-256, compared in constant time over every entry, and never
// logged or echoed in a status message.
#ifndef ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
#define ATTNSERVE_SERVER_TRANSPORT_AUTH_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "grpcpp/server_context.h"
#include "server/sessions/session_manager.h"

namespace attnserve::server {

struct Identity {
  std::string tenant;  // "" is the anonymous (or shared-token) tenant
  bool admin = false;
  bool operator_role = false;
};

struct AuthOptions {
  std::string token;                 // --auth_token_file's token
  std::string tenants_file;          // --tenants_file
  bool client_certificates = false;  // mutual TLS (--tls_client_ca_file)
};

using TokenHash = std::array<uint8_t, 32>;
TokenHash HashToken(absl::string_view token);

// One line of a tenants file, parsed.
struct TenantEntry {
  std::string tenant;
  bool cert = false;  // else `hash` is its token's
  TokenHash hash{};
  bool admin = false;
  bool operator_role = false;
  sessions::TenantShares shares;
};
// INVALID_ARGUMENT naming the line and what is wrong with it (never the token).
absl::StatusOr<std::vector<TenantEntry>> ParseTenants(absl::string_view text);

// Thread-safe.
class Authenticator {
 public:
  // INVALID_ARGUMENT / NOT_FOUND when the tenants file cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);

  // The caller's identity, or UNAUTHENTICATED saying what was expected.
  absl::StatusOr<Identity> Authenticate(const grpc::CallbackServerContext& context) const;

  // Reads the tenants file again (SIGHUP). On an error the table in force stays, and the error
  // says why. OK and nothing to do without a tenants file.
  absl::Status Reload() const ABSL_LOCKS_EXCLUDED(mu_);
  // The metrics label of `tenant` (server/metrics/metrics.h: bounded): its name when the table
  // in force lists it, "anonymous" for "", "other" otherwise.
  std::string Label(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  // The shares of `tenant` in the table in force (the defaults when it is not listed).
  sessions::TenantShares SharesOf(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit Authenticator(const AuthOptions& options) : options_(options) {}
  // The first line of `tenant` in the table in force (none without a tenants file).
  std::optional<TenantEntry> EntryOf(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  // Reloads when the file's modification time changed, at most once a second.
  void MaybeReload() const;
  std::shared_ptr<const std::vector<TenantEntry>> table() const ABSL_LOCKS_EXCLUDED(mu_);

  const AuthOptions options_;
  TokenHash token_hash_{};
  mutable Mutex mu_;
  mutable std::shared_ptr<const std::vector<TenantEntry>> table_ ABSL_GUARDED_BY(mu_);
  mutable int64_t loaded_mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<int64_t> next_check_ns_{0};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
