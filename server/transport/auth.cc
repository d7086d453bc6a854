#include "server/transport/auth.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "grpc/grpc_security_constants.h"

namespace attnserve::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal in time independent of where they differ.
bool SameHash(const TokenHash& a, const TokenHash& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

// Modification time of `path` in ns, or -1 when it cannot be read.
int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

absl::StatusOr<std::shared_ptr<const std::vector<TenantEntry>>> ReadTenants(
    const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--tenants_file: ", text.status().message()));
  }
  auto entries = ParseTenants(*text);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenants_file ", path, ": ", entries.status().message()));
  }
  return std::make_shared<const std::vector<TenantEntry>>(*std::move(entries));
}

// The common name of the call's verified client certificate, or "" when it has none.
std::string CertificateName(const grpc::CallbackServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  for (const grpc::string_ref& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    if (!cn.empty()) return std::string(cn.data(), cn.size());
  }
  return "";
}

}  // namespace

TokenHash HashToken(absl::string_view token) {
  TokenHash h;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), h.data());
  return h;
}

absl::StatusOr<std::vector<TenantEntry>> ParseTenants(absl::string_view text) {
  std::vector<TenantEntry> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why));
    };
    if (fields.size() < 2) return bad("want `<tenant> <credential> [<role>,...] [key=value ...]`");
    TenantEntry e;
    e.tenant = std::string(fields[0]);
    const absl::string_view credential = fields[1];
    if (credential == "cert") {
      e.cert = true;
    } else if (absl::StartsWith(credential, "token:")) {
      const absl::string_view token = credential.substr(6);
      if (token.empty()) return bad("empty token");
      e.hash = HashToken(token);
    } else if (absl::StartsWith(credential, "sha256:")) {
      const std::string hex = absl::AsciiStrToLower(credential.substr(7));
      if (hex.size() != 64 || !std::all_of(hex.begin(), hex.end(), [](char c) {
            return absl::ascii_isxdigit(static_cast<unsigned char>(c));
          })) {
        return bad("sha256: wants 64 hex digits (sha256sum of the token)");
      }
      const std::string bytes = absl::HexStringToBytes(hex);
      std::copy(bytes.begin(), bytes.end(), e.hash.begin());
    } else {
      return bad("the credential must be token:<token>, sha256:<hex> or cert");
    }
    bool roles_seen = false;
    for (size_t f = 2; f < fields.size(); ++f) {
      const size_t eq = fields[f].find('=');
      if (eq != absl::string_view::npos) {
        const absl::string_view key = fields[f].substr(0, eq), value = fields[f].substr(eq + 1);
        if (key == "sessions") {
          if (!absl::SimpleAtoi(value, &e.shares.max_sessions) || e.shares.max_sessions < 1) {
            return bad(absl::StrCat("sessions= wants a whole number >= 1; was '", value, "'"));
          }
        } else if (key == "in_flight") {
          if (!absl::SimpleAtoi(value, &e.shares.max_in_flight) || e.shares.max_in_flight < 1) {
            return bad(absl::StrCat("in_flight= wants a whole number >= 1; was '", value, "'"));
          }
        } else if (key == "share" || key == "max_share" || key == "pinned_share") {
          double x = 0;
          if (!absl::SimpleAtod(value, &x) || !(x >= 0.0 && x <= 1.0)) {
            return bad(absl::StrCat(key, "= wants a fraction in 0..1; was '", value, "'"));
          }
          (key == "share"       ? e.shares.guaranteed
           : key == "max_share" ? e.shares.max
                                : e.shares.max_pinned) = x;
        } else {
          return bad(absl::StrCat("unknown setting '", key,
                                  "' (sessions, share, max_share, pinned_share, in_flight)"));
        }
        continue;
      }
      if (roles_seen) return bad("want `<tenant> <credential> [<role>,...] [key=value ...]`");
      roles_seen = true;
      for (absl::string_view role : absl::StrSplit(fields[f], ',')) {
        if (role == "admin") {
          e.admin = true;
        } else if (role == "operator") {
          e.operator_role = true;
        } else if (role != "compute") {
          return bad(absl::StrCat("unknown role '", role, "' (admin, operator, compute)"));
        }
      }
    }
    if (e.shares.guaranteed > e.shares.max) {
      return bad(absl::StrCat("share=", e.shares.guaranteed, " is above max_share=", e.shares.max));
    }
    for (const TenantEntry& other : out) {
      if (!e.cert && !other.cert && SameHash(e.hash, other.hash)) {
        return bad(absl::StrCat("the same token as tenant '", other.tenant, "'"));
      }
      if (e.cert && other.cert && e.tenant == other.tenant) {
        return bad(absl::StrCat("tenant '", e.tenant, "' has a cert line already"));
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::unique_ptr<Authenticator> a(new Authenticator(options));
  if (!options.token.empty()) a->token_hash_ = HashToken(options.token);
  if (!options.tenants_file.empty()) {
    const int64_t mtime = MtimeNs(options.tenants_file);
    auto table = ReadTenants(options.tenants_file);
    if (!table.ok()) return table.status();
    MutexLock lock(&a->mu_);
    a->table_ = *std::move(table);
    a->loaded_mtime_ns_ = mtime;
  }
  a->next_check_ns_.store(NowNs() + 1000000000, std::memory_order_relaxed);
  return a;
}

absl::Status Authenticator::Reload() const {
  if (options_.tenants_file.empty()) return absl::OkStatus();
  const int64_t mtime = MtimeNs(options_.tenants_file);
  auto table = ReadTenants(options_.tenants_file);
  MutexLock lock(&mu_);
  loaded_mtime_ns_ = mtime;  // a bad file is not read again until it changes
  if (!table.ok()) return table.status();
  table_ = *std::move(table);
  return absl::OkStatus();
}

std::optional<TenantEntry> Authenticator::EntryOf(const std::string& tenant) const {
  // Without a tenants file there is no table: no lock on every call's path.
  if (options_.tenants_file.empty()) return std::nullopt;
  const std::shared_ptr<const std::vector<TenantEntry>> table = this->table();
  for (const TenantEntry& e : *table) {
    if (e.tenant == tenant) return e;
  }
  return std::nullopt;
}

std::string Authenticator::Label(const std::string& tenant) const {
  if (tenant.empty()) return "anonymous";
  return EntryOf(tenant).has_value() ? tenant : "other";
}

sessions::TenantShares Authenticator::SharesOf(const std::string& tenant) const {
  const std::optional<TenantEntry> e = EntryOf(tenant);
  return e.has_value() ? e->shares : sessions::TenantShares();
}

std::shared_ptr<const std::vector<TenantEntry>> Authenticator::table() const {
  MutexLock lock(&mu_);
  return table_;
}

void Authenticator::MaybeReload() const {
  const int64_t now = NowNs();
  int64_t next = next_check_ns_.load(std::memory_order_relaxed);
  if (now < next) return;
  // One caller a second checks; the others go on with the table in force.
  if (!next_check_ns_.compare_exchange_strong(next, now + 1000000000, std::memory_order_relaxed)) {
    return;
  }
  const int64_t mtime = MtimeNs(options_.tenants_file);
  {
    MutexLock lock(&mu_);
    if (mtime == loaded_mtime_ns_) return;
  }
  (void)Reload();  // a bad file keeps the last good table (and is said on SIGHUP)
}

absl::StatusOr<Identity> Authenticator::Authenticate(
    const grpc::CallbackServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  const bool has_bearer = header != metadata.end() && header->second.starts_with(grpc::string_ref(
                                                          kBearer.data(), kBearer.size()));
  const absl::string_view bearer = has_bearer
                                       ? absl::string_view(header->second.data() + kBearer.size(),
                                                           header->second.size() - kBearer.size())
                                       : absl::string_view();
  if (!options_.tenants_file.empty()) {
    MaybeReload();
    const std::shared_ptr<const std::vector<TenantEntry>> table = this->table();
    if (has_bearer) {
      const TokenHash h = HashToken(bearer);
      const TenantEntry* found = nullptr;
      for (const TenantEntry& e : *table) {  // every entry, whatever matches
        const bool match = !e.cert && SameHash(e.hash, h);
        if (match) found = &e;
      }
      if (found == nullptr) return absl::UnauthenticatedError("the bearer token is not valid");
      return Identity{found->tenant, found->admin, found->operator_role};
    }
    if (options_.client_certificates) {
      std::string name = CertificateName(context);
      if (!name.empty()) {
        for (const TenantEntry& e : *table) {
          if (e.cert && e.tenant == name) return Identity{name, e.admin, e.operator_role};
        }
        return Identity{std::move(name), false, false};
      }
    }
    return absl::UnauthenticatedError(
        options_.client_certificates
            ? "this server requires 'authorization: Bearer <token>' or a client certificate"
            : "this server requires 'authorization: Bearer <token>'");
  }
  if (!options_.token.empty()) {
    if (header == metadata.end()) {
      return absl::UnauthenticatedError("this server requires 'authorization: Bearer <token>'");
    }
    if (!has_bearer || !SameHash(HashToken(bearer), token_hash_)) {
      return absl::UnauthenticatedError("the bearer token is not valid");
    }
    return Identity{"", true, true};
  }
  if (options_.client_certificates) return Identity{CertificateName(context), true, false};
  return Identity{"", true, true};
}

}  // namespace attnserve::server
