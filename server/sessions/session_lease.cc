// An extend's lease on its session (session_manager.h, Lease): taken at arrival, the pages it
// needs reserved as a transaction over the pool (a PageReservation: fresh pages, copy-on-write
// pairs; eviction, when the pool is full, in pool_shares.cc), committed with the new tokens or
// rolled back.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    End(false);
    manager_ = std::exchange(other.manager_, nullptr);
    session_ = std::move(other.session_);
    new_tokens_ = other.new_tokens_;
    reserved_ = std::exchange(other.reserved_, false);
    computed_ = std::exchange(other.computed_, false);
    pages_ = std::exchange(other.pages_, PageReservation());
  }
  return *this;
}

void Lease::End(bool keep) {
  if (manager_ == nullptr) return;
  manager_->EndLease(*this, keep);
  manager_ = nullptr;
  session_.reset();
}

absl::Status SessionManager::BeginExtend(const std::string& tenant, const std::string& id,
                                         std::optional<int64_t> expected_length, int64_t new_tokens,
                                         ExtendItem* item) {
  MutexLock lock(&mu_);
  auto found = FindLocked(tenant, id, "ExtendSession");
  if (!found.ok()) return found.status();
  Session& s = **found;
  TouchLocked(s);
  if (s.busy) {
    return absl::AbortedError(absl::StrCat(
        "an extend of session '", id,
        "' is already queued or computing; extends of one session are applied one at a time: "
        "wait for its answer"));
  }
  if (expected_length.has_value() && *expected_length != s.length) {
    return absl::AbortedError(absl::StrCat("expected_length is ", *expected_length,
                                           " but session '", id, "' holds ", s.length,
                                           " tokens; nothing was appended"));
  }
  // A linear session's length costs nothing (its state is all it keeps): only each extend is
  // bounded (by the request's limits).
  if (s.kind != kernels::AttentionKind::kLinear &&
      s.length + new_tokens > options_.max_session_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session '", id, "' holds ", s.length, " tokens; ", new_tokens,
                     " more would exceed the server's limit of ", options_.max_session_tokens,
                     " (--max_sequence_length)"));
  }
  s.busy = true;
  item->lease.End(false);
  item->lease.manager_ = this;
  item->lease.session_ = *found;
  item->lease.new_tokens_ = new_tokens;
  item->new_tokens = new_tokens;
  item->session_id = s.id;
  item->module_name = s.module_name;
  item->module = s.module;
  item->num_heads = s.num_heads;
  item->num_kv_heads = s.arena->layout().num_kv_heads;
  item->head_dim = s.arena->layout().head_dim;
  item->v_head_dim = s.arena->layout().v_head_dim;
  item->kind = s.kind;
  return absl::OkStatus();
}

absl::Status SessionManager::CheckReserveLocked(const Session& s, const Arena& arena, int64_t fresh,
                                                int64_t growth) {
  if (s.pinned && table_->pinned_bytes() + growth * arena.page_bytes() >
                      static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session '", s.id, "' is pinned, and pinned sessions would hold more than their share of ",
        "the pool (", options_.max_pinned_fraction, " of ", pool_->bytes_total(),
        " bytes, --session_max_pinned_fraction)"));
  }
  if (s.pinned) {
    if (absl::Status st = CheckTenantPinnedLocked(s.tenant, growth * arena.page_bytes());
        !st.ok()) {
      return st;
    }
  }
  const TenantShares shares = SharesOf(s.tenant);
  if (shares.max < 1.0) {
    const int64_t held = TenantBytesLocked(s.tenant);
    const int64_t cap = static_cast<int64_t>(shares.max * pool_->bytes_total());
    if (held + fresh * arena.page_bytes() > cap) {
      RecordRefusal(s.tenant, "max_share");
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", s.tenant, "' holds ", held, " bytes of the session pool; ", fresh,
          " more pages of ", arena.page_bytes(), " bytes would take it over its max_share (",
          shares.max, " of ", pool_->bytes_total(), " bytes); close sessions first"));
    }
  }
  return absl::OkStatus();
}

absl::Status SessionManager::AllocateLocked(const Session& s, Arena* arena, int64_t fresh,
                                            std::vector<int32_t>* pages) {
  bool ok = pool_->Allocate(arena, fresh, pages);
  if (!ok && options_.when_full == WhenFull::kEvictLru) ok = EvictForLocked(s, arena, fresh, pages);
  if (ok) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the session pool is full (", pool_->bytes_used(), " of ", pool_->bytes_total(),
      " bytes used; ", fresh, " more pages of ", arena->page_bytes(), " bytes needed) and ",
      options_.when_full == WhenFull::kRefuse
          ? "the server refuses rather than evicts (--session_when_full=refuse)"
          : "no idle unpinned session is left to evict",
      "; close sessions or retry later"));
}

absl::Status SessionManager::ReserveLocked(ExtendItem& item) {
  Lease& lease = item.lease;
  Session& s = *lease.session_;
  Arena* arena = s.arena;
  const int64_t page_tokens = pool_->page_tokens();
  const int64_t have = static_cast<int64_t>(s.pages.size());
  PageReservation& r = lease.pages_;
  if (s.kind == kernels::AttentionKind::kLinear) {
    // The new state goes to fresh pages, and each old page (shared with forks, perhaps) is
    // released when the extend commits: a rollback leaves the old state untouched.
    const int64_t n = LinearStatePages(arena->layout());
    if (absl::Status st = CheckReserveLocked(s, *arena, n, n - have); !st.ok()) return st;
    std::vector<int32_t> pages;
    if (absl::Status st = AllocateLocked(s, arena, n, &pages); !st.ok()) return st;
    r = PageReservation{pages, pages, {}};
    for (int64_t i = 0; i < have; ++i) r.copies.push_back({s.pages[i], pages[i]});
    lease.reserved_ = true;
    return absl::OkStatus();
  }
  const int64_t need = CeilDiv(s.length + lease.new_tokens_, page_tokens);
  const bool copy = s.length % page_tokens != 0 && arena->refs(s.pages.back()) > 1;
  const int64_t fresh = need - have + (copy ? 1 : 0);
  if (fresh == 0) {
    r = PageReservation{s.pages, {}, {}};
    lease.reserved_ = true;
    return absl::OkStatus();
  }
  if (absl::Status st = CheckReserveLocked(s, *arena, fresh, need - have); !st.ok()) return st;
  std::vector<int32_t> pages;
  if (absl::Status st = AllocateLocked(s, arena, fresh, &pages); !st.ok()) return st;
  r = PageReservation{s.pages, {}, {}};
  size_t next = 0;
  if (copy) {  // the shared last page, partly filled, gets a private copy to write into
    r.copies.push_back({s.pages.back(), pages[next]});
    r.table.back() = pages[next++];
  }
  while (next < pages.size()) r.table.push_back(pages[next++]);
  r.fresh = std::move(pages);
  lease.reserved_ = true;
  return absl::OkStatus();
}

void SessionManager::EndLease(Lease& lease, bool keep) {
  MutexLock lock(&mu_);
  Session& s = *lease.session_;
  const bool commit = keep && lease.computed_ && !s.removed;
  if (commit) {
    for (const PageReservation::Copy& c : lease.pages_.copies) pool_->Unref(s.arena, c.from);
    if (s.pinned) {
      table_->AddPinnedBytes(
          (static_cast<int64_t>(lease.pages_.table.size()) - static_cast<int64_t>(s.pages.size())) *
          s.arena->page_bytes());
    }
    s.pages = std::move(lease.pages_.table);
    s.length += lease.new_tokens_;
    DropPagesBeforeWindowLocked(s);
    TouchLocked(s);
    if (metrics_ != nullptr) {
      metrics_->RecordSessionTokens(lease.new_tokens_ == 1 ? "decode" : "prefill",
                                    lease.new_tokens_);
    }
  } else {
    for (int32_t page : lease.pages_.fresh) pool_->Unref(s.arena, page);
  }
  s.busy = false;
  if (s.removed) {
    FreePagesLocked(s);
    pool_->Release(s.arena);
  } else if (!commit) {
    // ExpireLocked drops a busy session's due entry: not used, it still expires at its time.
    table_->ScheduleExpiry(s);
  }
}

}  // namespace attnserve::server::sessions
