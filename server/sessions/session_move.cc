// Moving sessions between replicas (issue 33): SessionManager::Move on the replica a session
// leaves (SessionImport, session_import.h, on the one it goes to). The transport
// (server/transport/session_mover.cc) carries the transfer between them.
//
// A move copies one session in two phases. The pre-copy, while the session goes on: under the
// manager's lock, Move takes a reference to each page the session has filled (such a page
// never changes again: extends write the rows after its length, and a fork or a copy-on-write
// leaves it as it is; the reference keeps a page a sliding window drops from going back to the
// pool meanwhile) and sends them outside the lock, chunk by chunk, while the session extends.
// Then the switch: the session is marked moving (its calls answer UNAVAILABLE "moving"), Move
// waits for an extend in flight to return, encodes the session's settings and its pages filled
// since (the last, partly filled page included) and sends them and the trailer: the caller's
// pause is that tail, not the whole session. A linear session's state changes at every step:
// all of it moves at the switch (it is small).
//
// Once the peer has taken it, EndMove removes the session here and remembers its old id as
// moved, on both replicas, so that a call naming it learns the new id. A move that fails leaves
// the session where it was, untouched. Should the peer have taken it without the sender hearing
// so (a lost answer), the copy there is an orphan no caller knows the id of: it expires by its
// TTL. Never two live copies that callers can reach.
#include <string>
#include <thread>
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

absl::Status SessionManager::NotHereLocked(const std::string& id) {
  const SessionTable::LostId* lost = table_->FindLost(id);
  auto found = FindLocked(lost != nullptr ? lost->tenant : "", id, "MoveSession");
  return found.ok() ? absl::NotFoundError(absl::StrCat("session '", id, "' does not exist"))
                    : found.status();
}

absl::StatusOr<std::string> SessionManager::Move(
    const std::string& id, size_t chunk_bytes, const TransferSink& send,
    const std::function<absl::StatusOr<std::string>()>& finish, absl::Time wait_until,
    absl::Duration* pause) {
  // The pre-copy: the pages the session has filled, referenced so that none goes back to the
  // pool before the move ends.
  std::shared_ptr<Session> s;
  std::vector<Encoding::Page> early;
  std::string head;
  {
    MutexLock lock(&mu_);
    ExpireLocked();
    s = table_->Find(id);
    if (s == nullptr) return NotHereLocked(id);
    if (s->sending) {
      return absl::AbortedError(
          absl::StrCat("session '", id, "' is moving already: wait for that move to end"));
    }
    s->sending = true;
    if (s->kind != kernels::AttentionKind::kLinear) {
      const size_t filled = static_cast<size_t>(s->length / pool_->page_tokens());
      for (size_t i = static_cast<size_t>(s->dropped); i < filled; ++i) {
        pool_->Ref(s->arena, s->pages[i]);
        early.push_back({s->arena, s->pages[i], 0});
      }
    }
    pool_->AddUser(s->arena);  // the pages' arena stays while they are referenced
    head = TransferHeadLocked({s->arena}, early.size() + 1);  // + the kMoreRecords record
  }
  Arena* const arena = s->arena;
  const auto let_go = [&] {
    MutexLock lock(&mu_);
    for (const Encoding::Page& p : early) pool_->Unref(arena, p.page);
    pool_->Release(arena);
    s->sending = false;
  };
  std::string chunk;
  chunk.reserve(chunk_bytes * 2);
  TransferWriter w(&chunk);
  const auto flush = [&](bool last) -> absl::Status {
    if (chunk.size() < chunk_bytes && !last) return absl::OkStatus();
    absl::Status st = send(chunk);
    chunk.clear();  // its memory kept for the next chunk
    return st;
  };
  w.Put(head.data(), head.size());
  if (absl::Status st = WritePages(early, w, flush); !st.ok()) {
    let_go();
    return st;
  }

  // The switch: no call starts on the session from now on; an extend in flight returns first.
  const absl::Time switch_start = absl::Now();
  Encoding tail;
  absl::Status gone;
  for (bool switched = false; !switched && gone.ok();) {
    {
      MutexLock lock(&mu_);
      if (table_->Find(id) != s || s->removed) {  // closed, expired or lost meanwhile
        s->moving = false;
        gone = NotHereLocked(id);
      } else if (!s->busy) {
        s->moving = true;
        s->busy = true;
        tail = EncodeLocked({s.get()}, early);
        switched = true;
      } else if (absl::Now() >= wait_until) {
        s->moving = false;
        gone = absl::AbortedError(absl::StrCat(
            "session '", id,
            "' has an extend in flight that did not return in time: move it once it has"));
      } else {
        s->moving = true;  // refuses the calls after the one in flight
      }
    }
    if (!switched && gone.ok()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!gone.ok()) {
    let_go();
    return gone;
  }
  // Outside the lock: the session is busy and moving, its pages do not change.
  w.Num(kMoreRecords);
  w.Num(static_cast<uint64_t>(tail.pages.size()));
  absl::Status sent = WritePages(tail.pages, w, flush);
  if (sent.ok()) {
    w.Put(tail.tail.data(), tail.tail.size());
    w.Trailer();
    sent = flush(/*last=*/true);
  }
  absl::StatusOr<std::string> to = sent.ok() ? finish() : sent;
  if (pause != nullptr) *pause = absl::Now() - switch_start;
  EndMove(id, to.ok() ? *to : "");
  let_go();
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
