#include "server/sessions/session_import.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_codec.h"

namespace attnserve::server::sessions {
namespace {

// A header larger than this is not one (its layouts: 13 bytes each, at most max_layouts); nor
// are sessions whose settings and page tables take more (under a kilobyte a session and 8
// bytes a page).
constexpr size_t kMaxHeadBytes = size_t{1} << 20;
constexpr size_t kMaxTailBytes = size_t{256} << 20;

}  // namespace

std::unique_ptr<SessionImport> SessionManager::BeginImport(ModuleNamed module_named) {
  return std::unique_ptr<SessionImport>(new SessionImport(*this, std::move(module_named)));
}

SessionImport::~SessionImport() {
  if (committed_) return;
  MutexLock lock(&m_.mu_);
  decoder_.AbandonLocked();
}

absl::Status SessionImport::Consume(absl::string_view bytes) {
  if (failed_.ok()) failed_ = ConsumeOnce(bytes);
  return failed_;
}

absl::Status SessionImport::BeginPage(uint32_t layout) {
  auto sizes = decoder_.PageBytes(layout);
  if (!sizes.ok()) return sizes.status();
  {
    MutexLock lock(&m_.mu_);
    page_ = decoder_.NextPageLocked(layout);
  }
  if (page_.store == nullptr) {
    return absl::ResourceExhaustedError(
        "the session transfer does not fit in this replica's session pool");
  }
  // The page is the import's alone: written without the lock.
  k_bytes_ = sizes->first;
  record_bytes_ = sizes->first + sizes->second;
  record_at_ = 0;
  in_record_ = true;
  if (page_.store->on_device()) {
    k_page_ = v_page_ = nullptr;
    pending_.reserve(record_bytes_);
  } else {
    k_page_ = static_cast<char*>(page_.store->k_base()) + page_.page * sizes->first;
    v_page_ = static_cast<char*>(page_.store->v_base()) + page_.page * sizes->second;
  }
  return absl::OkStatus();
}

absl::Status SessionImport::ConsumeOnce(absl::string_view bytes) {
  bytes_ += bytes.size();
  while (!bytes.empty()) {
    if (phase_ == Phase::kHead) {
      // Parsed from the chunk itself when it holds the whole header (the first chunk does),
      // else from what has been gathered.
      const bool gathered = !pending_.empty();
      if (gathered) pending_.append(bytes.data(), bytes.size());
      const absl::string_view head = gathered ? absl::string_view(pending_) : bytes;
      MutexLock lock(&m_.mu_);
      if (m_.leaving_) return SessionManager::Leaving();
      TransferReader r(head);
      const absl::Status st = decoder_.HeadLocked(r);
      if (absl::IsOutOfRange(st)) {
        if (!gathered) pending_.assign(bytes.data(), bytes.size());
        if (pending_.size() > kMaxHeadBytes) {
          return absl::DataLossError("the session transfer's header does not parse");
        }
        return absl::OkStatus();  // more to come
      }
      if (!st.ok()) return st;
      const size_t used = static_cast<size_t>(r.position());
      crc_ = Crc32c(crc_, head.data(), used);
      if (gathered) {
        carry_.assign(pending_, used);
        pending_.clear();
        bytes = carry_;
      } else {
        bytes.remove_prefix(used);
      }
      phase_ = decoder_.records() == 0 ? Phase::kTail : Phase::kPages;
      continue;
    }
    if (phase_ == Phase::kTail) {
      if (pending_.size() + bytes.size() > kMaxTailBytes) {
        return absl::DataLossError("the session transfer's sessions do not parse");
      }
      pending_.append(bytes.data(), bytes.size());
      return absl::OkStatus();
    }
    // A page record: its u32 layout, then K and V; or kMoreRecords and a u64 count.
    if (!in_record_) {
      uint32_t layout = 0;
      if (pending_.size() >= sizeof layout) std::memcpy(&layout, pending_.data(), sizeof layout);
      const size_t want =
          sizeof layout +
          (pending_.size() >= sizeof layout && layout == kMoreRecords ? sizeof(uint64_t) : 0);
      const size_t take = std::min(want - pending_.size(), bytes.size());
      pending_.append(bytes.data(), take);
      bytes.remove_prefix(take);
      if (pending_.size() < sizeof layout) continue;
      std::memcpy(&layout, pending_.data(), sizeof layout);
      if (layout == kMoreRecords && pending_.size() < sizeof layout + sizeof(uint64_t)) continue;
      crc_ = Crc32c(crc_, pending_.data(), pending_.size());
      if (layout == kMoreRecords) {
        uint64_t more;
        std::memcpy(&more, pending_.data() + sizeof layout, sizeof more);
        pending_.clear();
        if (absl::Status st = decoder_.MoreRecords(more); !st.ok()) return st;
        if (decoder_.records_taken() == decoder_.records()) phase_ = Phase::kTail;
        continue;
      }
      pending_.clear();
      if (absl::Status st = BeginPage(layout); !st.ok()) return st;
      continue;
    }
    // Its bytes, as they come: into the page itself in host memory (its K, then its V:
    // contiguous in the store, page_layout.h), or gathered for a store on a device.
    const size_t n = std::min(record_bytes_ - record_at_, bytes.size());
    crc_ = Crc32c(crc_, bytes.data(), n);
    if (k_page_ != nullptr) {
      const size_t in_k = record_at_ < k_bytes_ ? std::min(n, k_bytes_ - record_at_) : 0;
      if (in_k > 0) std::memcpy(k_page_ + record_at_, bytes.data(), in_k);
      if (n > in_k) {
        std::memcpy(v_page_ + (record_at_ + in_k - k_bytes_), bytes.data() + in_k, n - in_k);
      }
    } else {
      pending_.append(bytes.data(), n);
    }
    record_at_ += n;
    bytes.remove_prefix(n);
    if (record_at_ < record_bytes_) continue;
    if (k_page_ == nullptr) {
      const absl::Status st =
          page_.store->WritePage(page_.page, pending_.data(), pending_.data() + k_bytes_);
      pending_.clear();
      if (!st.ok()) return st;
    }
    in_record_ = false;
    if (decoder_.records_taken() == decoder_.records()) phase_ = Phase::kTail;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> SessionImport::Commit() {
  if (!failed_.ok()) return failed_;
  const std::string what = "the session transfer";
  if (phase_ != Phase::kTail || pending_.size() < kTransferTrailer) {
    return failed_ = absl::DataLossError(absl::StrCat(
               what, " is torn: it ends before its sessions and trailer (", bytes_, " bytes)"));
  }
  const size_t body = pending_.size() - kTransferTrailer;
  const uint32_t actual = Crc32c(crc_, pending_.data(), body);
  if (absl::Status st = CheckTransferTrailer(pending_.data() + body, bytes_, actual, what);
      !st.ok()) {
    return failed_ = st;
  }
  MutexLock lock(&m_.mu_);
  if (m_.leaving_) return failed_ = SessionManager::Leaving();
  m_.ExpireLocked();
  TransferReader r(absl::string_view(pending_.data(), body));
  absl::Status st = decoder_.SessionsLocked(r);
  if (st.ok() && r.position() != body) {
    st = absl::DataLossError(absl::StrCat(what, " does not parse (its checksum holds)"));
  }
  if (st.ok()) {
    std::vector<std::shared_ptr<Session>> sessions = decoder_.CommitLocked();
    committed_ = true;
    st = Admit(sessions);
    if (!st.ok()) {
      for (const auto& s : sessions) {
        for (size_t i = s->dropped; i < s->pages.size(); ++i)
          m_.pool_->Unref(s->arena, s->pages[i]);
        m_.pool_->Release(s->arena);
      }
      return failed_ = st;
    }
    std::vector<std::string> ids;
    for (std::shared_ptr<Session>& s : sessions) {
      // The id it had there joins the ids it had before (the oldest go beyond kMaxAliases);
      // each answers "session moved to" the new one here.
      s->aliases.push_back(s->id);
      if (s->aliases.size() > Session::kMaxAliases) s->aliases.erase(s->aliases.begin());
      const std::vector<std::string> aliases = s->aliases;
      const std::string tenant = s->tenant;
      auto added = m_.AddLocked(std::move(s));
      ids.push_back(added->id);
      for (const std::string& alias : aliases) m_.table_->RememberMoved(alias, tenant, added->id);
    }
    if (m_.metrics_ != nullptr) {
      m_.metrics_->RecordSessionsMoved("in", static_cast<int64_t>(ids.size()));
    }
    return ids;
  }
  return failed_ = st;
}

absl::Status SessionImport::Admit(const std::vector<std::shared_ptr<Session>>& sessions) {
  const std::string what = "the session transfer";
  const SessionManager::SnapshotStats& stats = decoder_.stats();
  if (stats.lost > 0) {
    return absl::StrContains(stats.why_lost, "no room")
               ? absl::ResourceExhaustedError(absl::StrCat(
                     what, " does not fit in this replica's session pool (", stats.why_lost, ")"))
               : absl::FailedPreconditionError(
                     absl::StrCat(what, " cannot be taken: ", stats.why_lost));
  }
  if (m_.table_->size() + static_cast<int64_t>(sessions.size()) > m_.options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this replica holds ", m_.table_->size(), " sessions; ", sessions.size(),
                     " more would exceed its limit (--max_sessions)"));
  }
  // Each tenant's shares hold on this replica as they would for its own sessions, over all of
  // its sessions in the transfer together.
  struct Adding {
    int64_t sessions = 0, bytes = 0, pinned_bytes = 0;
  };
  std::map<std::string, Adding> adding;  // by tenant, in order: the first refusal is stable
  int64_t pinned_bytes = 0;
  for (const auto& s : sessions) {
    Adding& a = adding[s->tenant];
    ++a.sessions;
    a.bytes += s->bytes();
    if (s->pinned) {
      a.pinned_bytes += s->bytes();
      pinned_bytes += s->bytes();
    }
  }
  for (const auto& [tenant, a] : adding) {
    if (absl::Status st = m_.CheckTenantSessionsLocked(tenant, a.sessions); !st.ok()) return st;
    const TenantShares shares = m_.SharesOf(tenant);
    if (m_.TenantBytesLocked(tenant) + a.bytes >
        static_cast<int64_t>(shares.max * m_.pool_->bytes_total())) {
      m_.RecordRefusal(tenant, "max_share");
      return absl::ResourceExhaustedError(absl::StrCat(
          "the transfer's ", a.sessions, " sessions of tenant '", tenant, "' (", a.bytes,
          " bytes) would take it over its share of this replica's pool (max_share)"));
    }
    if (a.pinned_bytes > 0) {
      if (absl::Status st = m_.CheckTenantPinnedLocked(tenant, a.pinned_bytes); !st.ok()) {
        return st;
      }
    }
  }
  if (pinned_bytes > 0 &&
      m_.table_->pinned_bytes() + pinned_bytes >
          static_cast<int64_t>(m_.options_.max_pinned_fraction * m_.pool_->bytes_total())) {
    return absl::ResourceExhaustedError(
        "the transfer's pinned sessions would take pinned sessions over their share of this "
        "replica's pool (--session_max_pinned_fraction)");
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server::sessions
