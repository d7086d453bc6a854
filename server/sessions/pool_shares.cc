// What the session pool holds, overall and by tenant, and what each tenant may hold of it: the
// pool's usage (ListSessions.usage and the metrics), the tenants' shares (session_manager.h,
// TenantShares: their limits, refused with the reason counted), and eviction, which takes pages
// from tenants above their guaranteed share first and never from another tenant within it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {

std::vector<SessionManager::TenantUsage> SessionManager::UsageByTenant() {
  MutexLock lock(&mu_);
  std::vector<TenantUsage> out;
  out.reserve(table_->by_tenant().size());
  for (const auto& [tenant, sessions] : table_->by_tenant()) {
    TenantUsage& u = out.emplace_back();
    u.tenant = tenant;
    u.sessions = static_cast<int64_t>(sessions.size());
    u.bytes = TenantBytesLocked(tenant);
  }
  return out;
}

int64_t SessionManager::ReleaseIdleMemory() {
  MutexLock lock(&mu_);
  return pool_->ReleaseFreeMemory();
}

PoolUsage SessionManager::Usage() {
  MutexLock lock(&mu_);
  ExpireLocked();
  PoolUsage u;
  u.pages_total = pool_->pages_total();
  u.pages_used = pool_->pages_used();
  u.bytes_total = pool_->bytes_total();
  u.bytes_used = pool_->bytes_used();
  u.bytes_kept = pool_->bytes_kept();
  u.sessions = table_->size();
  u.pinned_sessions = table_->pinned_sessions();
  // A page's tokens count once however many sessions share it: the most any holder filled.
  absl::flat_hash_map<std::pair<const Arena*, int32_t>, int64_t> filled;
  const int64_t page_tokens = pool_->page_tokens();
  for (const auto& [serial, s] : table_->all()) {
    for (size_t i = s->dropped; i < s->pages.size(); ++i) {
      const int64_t n = std::min<int64_t>(page_tokens, s->length - int64_t(i) * page_tokens);
      int64_t& f = filled[{s->arena, s->pages[i]}];
      f = std::max(f, n);
      if (s->pinned) ++u.pinned_pages;
    }
  }
  for (const auto& [page, n] : filled) {
    u.tokens += n;
    if (page.first->refs(page.second) > 1) ++u.shared_pages;
  }
  return u;
}

TenantShares SessionManager::SharesOf(const std::string& tenant) const {
  return options_.shares_of ? options_.shares_of(tenant) : TenantShares();
}

std::string SessionManager::TenantLabel(const std::string& tenant) const {
  if (options_.tenant_label) return options_.tenant_label(tenant);
  return tenant.empty() ? "anonymous" : "other";
}

void SessionManager::RecordRefusal(const std::string& tenant, absl::string_view reason) const {
  if (metrics_ != nullptr) {
    metrics_->RecordTenantRefusal(TenantLabel(tenant),
                                  std::string_view(reason.data(), reason.size()));
  }
}

int64_t SessionManager::TenantBytesLocked(const std::string& tenant) const {
  const SessionTable::Ordered* sessions = table_->of(tenant);
  if (sessions == nullptr) return 0;
  int64_t bytes = 0;
  for (const auto& [serial, session] : *sessions) bytes += session->bytes();
  return bytes;
}

absl::Status SessionManager::CheckTenantSessionsLocked(const std::string& tenant,
                                                       int64_t more) const {
  const int64_t most = SharesOf(tenant).max_sessions;
  if (most <= 0) return absl::OkStatus();
  const SessionTable::Ordered* sessions = table_->of(tenant);
  const int64_t held = sessions == nullptr ? 0 : static_cast<int64_t>(sessions->size());
  if (held + more <= most) return absl::OkStatus();
  RecordRefusal(tenant, "sessions");
  return absl::ResourceExhaustedError(
      more == 1
          ? absl::StrCat("tenant '", tenant, "' holds ", held, " sessions, its limit (sessions=",
                         most, " in the tenants file); close sessions first")
          : absl::StrCat("tenant '", tenant, "' holds ", held, " sessions; ", more,
                         " more would exceed its limit (sessions=", most, " in the tenants file)"));
}

absl::Status SessionManager::CheckTenantPinnedLocked(const std::string& tenant,
                                                     int64_t more) const {
  const double share = SharesOf(tenant).max_pinned;
  if (share >= 1.0) return absl::OkStatus();
  int64_t held = 0;
  if (const SessionTable::Ordered* sessions = table_->of(tenant); sessions != nullptr) {
    for (const auto& [serial, session] : *sessions) {
      if (session->pinned) held += session->bytes();
    }
  }
  const int64_t cap = static_cast<int64_t>(share * pool_->bytes_total());
  if (held + more <= cap) return absl::OkStatus();
  RecordRefusal(tenant, "pinned_share");
  return absl::ResourceExhaustedError(
      absl::StrCat("tenant '", tenant, "' has ", held, " bytes in pinned sessions; ", more,
                   " more would take it over its pinned_share (", share, " of ",
                   pool_->bytes_total(), " bytes, the tenants file); leave the session unpinned"));
}

bool SessionManager::EvictForLocked(const Session& s, Arena* arena, int64_t fresh,
                                    std::vector<int32_t>* pages) {
  // What each tenant holds now, and its guarantee: a victim's tenant must be the requester or
  // hold more than its guarantee, counted again after each eviction.
  struct Holding {
    int64_t bytes = 0;
    int64_t guaranteed = 0;
  };
  absl::flat_hash_map<std::string, Holding> holding;
  for (const auto& [tenant, sessions] : table_->by_tenant()) {
    holding[tenant] = {TenantBytesLocked(tenant),
                       static_cast<int64_t>(SharesOf(tenant).guaranteed * pool_->bytes_total())};
  }
  std::vector<std::shared_ptr<Session>> candidates;
  for (Session* v : table_->lru()) {
    if (!v->busy && !v->sending && !v->pinned && v != &s) candidates.push_back(table_->Find(v->id));
  }
  // First from tenants above their guarantee (the requester too, when it is), least recently
  // used first; then the requester's own sessions, which lose nothing to another tenant.
  for (const bool own_pass : {false, true}) {
    for (auto& v : candidates) {
      if (v == nullptr) continue;
      Holding& h = holding[v->tenant];
      const bool take = own_pass ? v->tenant == s.tenant : h.bytes > h.guaranteed;
      if (!take) continue;
      h.bytes -= v->bytes();
      if (metrics_ != nullptr) metrics_->RecordTenantEviction(TenantLabel(v->tenant));
      RemoveLocked(v, "evicted");
      v = nullptr;
      if (pool_->Allocate(arena, fresh, pages)) return true;
    }
  }
  return false;
}

}  // namespace attnserve::server::sessions
