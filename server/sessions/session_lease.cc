// An extend's lease on its session (session_manager.h, Lease): taken at arrival, the pages it
// needs reserved as a transaction over the pool (fresh pages, a shared last page replaced by a
// copy, eviction of idle sessions when the pool is full), committed with the new tokens or
// rolled back.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"

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
    new_table_ = std::move(other.new_table_);
    fresh_ = std::move(other.fresh_);
    replaced_ = std::exchange(other.replaced_, std::nullopt);
  }
  return *this;
}

void Lease::End(bool keep) {
  if (manager_ == nullptr) return;
  manager_->EndLease(*this, keep);
  manager_ = nullptr;
  session_.reset();
}

absl::Status SessionManager::BeginExtend(const std::string& id,
                                         std::optional<int64_t> expected_length, int64_t new_tokens,
                                         ExtendItem* item) {
  MutexLock lock(&mu_);
  auto found = FindLocked(id);
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
  if (s.length + new_tokens > options_.max_session_tokens) {
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
  item->module_name = s.module_name;
  item->module = s.module;
  item->num_heads = s.num_heads;
  item->num_kv_heads = s.arena->layout().num_kv_heads;
  item->head_dim = s.arena->layout().head_dim;
  item->v_head_dim = s.arena->layout().v_head_dim;
  return absl::OkStatus();
}

absl::Status SessionManager::ReserveLocked(ExtendItem& item) {
  Lease& lease = item.lease;
  Session& s = *lease.session_;
  Arena* arena = s.arena;
  const int64_t page_tokens = pool_->page_tokens();
  const int64_t have = static_cast<int64_t>(s.pages.size());
  const int64_t need = CeilDiv(s.length + lease.new_tokens_, page_tokens);
  const bool copy = s.length % page_tokens != 0 && arena->refs(s.pages.back()) > 1;
  const int64_t fresh = need - have + (copy ? 1 : 0);
  if (fresh == 0) {
    lease.new_table_ = s.pages;
    lease.reserved_ = true;
    return absl::OkStatus();
  }
  if (s.pinned && pinned_bytes_ + (need - have) * arena->page_bytes() >
                      static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session '", s.id, "' is pinned, and pinned sessions would hold more than their share of ",
        "the pool (", options_.max_pinned_fraction, " of ", pool_->bytes_total(),
        " bytes, --session_max_pinned_fraction)"));
  }
  std::vector<int32_t> pages;
  bool ok = pool_->Allocate(arena, fresh, &pages);
  if (!ok && options_.when_full == WhenFull::kEvictLru) {
    std::vector<std::shared_ptr<Session>> victims;
    for (Session* v : lru_) {
      if (!v->busy && !v->pinned && v != &s) victims.push_back(sessions_.at(v->id));
    }
    for (const auto& v : victims) {
      RemoveLocked(v, "evicted");
      if ((ok = pool_->Allocate(arena, fresh, &pages))) break;
    }
  }
  if (!ok) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session pool is full (", pool_->bytes_used(), " of ", pool_->bytes_total(),
        " bytes used; ", fresh, " more pages of ", arena->page_bytes(), " bytes needed) and ",
        options_.when_full == WhenFull::kRefuse
            ? "the server refuses rather than evicts (--session_when_full=refuse)"
            : "no idle unpinned session is left to evict",
        "; close sessions or retry later"));
  }
  lease.new_table_ = s.pages;
  size_t next = 0;
  if (copy) {
    lease.replaced_ = s.pages.back();
    lease.new_table_.back() = pages[next++];
  }
  while (next < pages.size()) lease.new_table_.push_back(pages[next++]);
  lease.fresh_ = std::move(pages);
  lease.reserved_ = true;
  return absl::OkStatus();
}

void SessionManager::EndLease(Lease& lease, bool keep) {
  MutexLock lock(&mu_);
  Session& s = *lease.session_;
  const bool commit = keep && lease.computed_ && !s.removed;
  if (commit) {
    if (lease.replaced_.has_value()) pool_->Unref(s.arena, *lease.replaced_);
    if (s.pinned) {
      pinned_bytes_ +=
          (static_cast<int64_t>(lease.new_table_.size()) - static_cast<int64_t>(s.pages.size())) *
          s.arena->page_bytes();
    }
    s.pages = std::move(lease.new_table_);
    s.length += lease.new_tokens_;
    TouchLocked(s);
    if (metrics_ != nullptr) {
      metrics_->RecordSessionTokens(lease.new_tokens_ == 1 ? "decode" : "prefill",
                                    lease.new_tokens_);
    }
  } else {
    for (int32_t page : lease.fresh_) pool_->Unref(s.arena, page);
  }
  s.busy = false;
  if (s.removed) {
    FreePagesLocked(s);
    pool_->Release(s.arena);
  } else if (!commit) {
    // ExpireLocked drops a busy session's due entry: not used, it still expires at its time.
    ScheduleExpiryLocked(s);
  }
}

}  // namespace attnserve::server::sessions
