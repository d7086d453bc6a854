// Moving sessions between replicas (issue 33): SessionManager::Move on the replica a session
// leaves (SessionImport, session_import.h, on the one it goes to). The transport
// (server/transport/session_mover.cc) carries the transfer between them.
//
// A move is a stop-and-copy of one session: Move marks it busy and moving under the manager's
// lock (no extend, fork or close can start; an extend already in flight refuses the move) and
// encodes its settings; its pages are then read and sent outside the lock, chunk by chunk, so
// that the other sessions go on meanwhile. Once the peer has taken it, EndMove removes it here
// and remembers its old id as moved, on both replicas, so that a call naming it learns the new
// id. A move that fails leaves the session where it was, untouched. Should the peer have taken
// it without the sender hearing so (a lost answer), the copy there is an orphan no caller knows
// the id of: it expires by its TTL. Never two live copies that callers can reach.
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

absl::StatusOr<std::string> SessionManager::Move(
    const std::string& id, size_t chunk_bytes, const TransferSink& send,
    const std::function<absl::StatusOr<std::string>()>& finish) {
  Encoding encoding;
  {
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
    encoding = EncodeLocked({s.get()});
    s->busy = true;
    s->moving = true;
  }
  // Outside the lock: no extend, fork or close of the session starts while it moves, so its
  // pages do not change (a fork that shares one writes into a copy of its own), and the other
  // sessions go on meanwhile.
  std::string chunk;
  chunk.reserve(chunk_bytes * 2);
  TransferWriter w(&chunk);
  absl::Status sent = WriteEncoding(encoding, w, [&](bool last) -> absl::Status {
    if (chunk.size() < chunk_bytes && !last) return absl::OkStatus();
    absl::Status st = send(chunk);
    chunk.clear();  // its memory kept for the next chunk
    return st;
  });
  absl::StatusOr<std::string> to = sent.ok() ? finish() : sent;
  EndMove(id, to.ok() ? *to : "");
  return to;
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
