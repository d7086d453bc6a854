// Moving sessions between replicas (issue 33): SessionManager::BeginMove/EndMove on the replica a
// session leaves, AcceptTransfer on the one it goes to. The transport (server/transport/
// session_mover.cc) carries the transfer between them.
//
// A move is a stop-and-copy under the session's own lock: BeginMove marks the session busy and
// moving (no extend, fork or close can start; an extend already in flight refuses the move) and
// encodes it; once the peer has taken it, EndMove removes it here and remembers its old id as
// moved, on both replicas, so that a call naming it learns the new id. A move that fails leaves
// the session where it was, untouched. Should the peer have taken it without the sender
// hearing so (a lost answer), the copy there is an orphan no caller knows the id of: it expires
// by its TTL. Never two live copies that callers can reach.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_codec.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {

absl::Status SessionManager::BeginMove(const std::string& id, std::string* transfer) {
  MutexLock lock(&mu_);
  ExpireLocked();
  std::shared_ptr<Session> s = table_->Find(id);
  if (s == nullptr) {
    // The answer a call of its own tenant would get (lost, moved, never issued).
    const SessionTable::LostId* lost = table_->FindLost(id);
    auto found = FindLocked(lost != nullptr ? lost->tenant : "", id, "MoveSession");
    return found.ok() ? absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"))
                      : found.status();
  }
  if (s->busy) {
    return absl::AbortedError(absl::StrCat("session '", id,
                                           "' has an extend in flight (or is moving already): "
                                           "move it once that has returned"));
  }
  transfer->clear();
  // Its pages, and well under a kilobyte of settings: one allocation.
  transfer->reserve(static_cast<size_t>(s->bytes()) + 4096 + s->mods.alibi_slopes.size() * 4);
  TransferWriter w(transfer);
  if (absl::Status st = EncodeLocked({s.get()}, w); !st.ok()) return st;
  s->busy = true;
  s->moving = true;
  return absl::OkStatus();
}

void SessionManager::EndMove(const std::string& id, const std::string& moved_to) {
  MutexLock lock(&mu_);
  std::shared_ptr<Session> s = table_->Find(id);
  if (s == nullptr || !s->moving) return;
  s->busy = false;
  s->moving = false;
  if (moved_to.empty()) {
    table_->ScheduleExpiry(*s);  // as a rolled-back lease does
    return;
  }
  RemoveLocked(s, "");
  table_->RememberMoved(id, s->tenant, moved_to);
  if (metrics_ != nullptr) metrics_->RecordSessionsMoved("out", 1);
}

absl::StatusOr<std::vector<std::string>> SessionManager::AcceptTransfer(
    absl::string_view transfer, const ModuleNamed& module_named) {
  const std::string what = "the session transfer";
  if (absl::Status st = VerifyTransfer(transfer, what); !st.ok()) return st;
  MutexLock lock(&mu_);
  ExpireLocked();
  if (leaving_) return Leaving();
  TransferReader r(transfer);
  auto decoded = DecodeLocked(r, what, module_named);
  if (!decoded.ok()) return decoded.status();
  std::vector<std::shared_ptr<Session>>& sessions = decoded->sessions;
  absl::Status refused;
  if (decoded->stats.lost > 0) {
    refused = absl::StrContains(decoded->stats.why_lost, "no room")
                  ? absl::ResourceExhaustedError(
                        absl::StrCat(what, " does not fit in this replica's session pool (",
                                     decoded->stats.why_lost, ")"))
                  : absl::FailedPreconditionError(
                        absl::StrCat(what, " cannot be taken: ", decoded->stats.why_lost));
  } else if (table_->size() + static_cast<int64_t>(sessions.size()) > options_.max_sessions) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("this replica holds ", table_->size(), " sessions; ", sessions.size(),
                     " more would exceed its limit (--max_sessions)"));
  }
  // Each tenant's shares hold on this replica as they would for its own sessions.
  int64_t pinned_bytes = 0;
  for (const auto& s : sessions) {
    if (!refused.ok()) break;
    refused = CheckTenantSessionsLocked(s->tenant);
    const TenantShares shares = SharesOf(s->tenant);
    if (refused.ok() && TenantBytesLocked(s->tenant) + s->bytes() >
                            static_cast<int64_t>(shares.max * pool_->bytes_total())) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("session '", s->id,
                       "' would take its tenant over its share of this "
                       "replica's pool (max_share)"));
    }
    if (s->pinned) pinned_bytes += s->bytes();
  }
  if (refused.ok() && pinned_bytes > 0 &&
      table_->pinned_bytes() + pinned_bytes >
          static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    refused = absl::ResourceExhaustedError(
        "the transfer's pinned sessions would take pinned sessions over their share of this "
        "replica's pool (--session_max_pinned_fraction)");
  }
  if (!refused.ok()) {
    for (const auto& s : sessions) ReleaseDecodedLocked(*s);
    return refused;
  }
  std::vector<std::string> ids;
  for (std::shared_ptr<Session>& s : sessions) {
    const std::string old_id = s->id;
    const std::string tenant = s->tenant;
    auto added = AddLocked(std::move(s));
    ids.push_back(added->id);
    table_->RememberMoved(old_id, tenant, added->id);
  }
  if (metrics_ != nullptr) metrics_->RecordSessionsMoved("in", static_cast<int64_t>(ids.size()));
  return ids;
}

void SessionManager::Leave() {
  MutexLock lock(&mu_);
  leaving_ = true;
}

absl::Status SessionManager::Leaving() {
  return absl::UnavailableError(
      "this replica is shutting down and moving its sessions to its peers: create (or fork) "
      "the session on another replica");
}

std::vector<std::string> SessionManager::Ids() {
  MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [serial, s] : table_->all()) ids.push_back(s->id);
  return ids;
}

}  // namespace attnserve::server::sessions
