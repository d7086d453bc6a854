// TransferDecoder: the transfer format (session_codec.h) read back into sessions of a
// SessionManager, for a snapshot's restore (session_snapshot.cc: a file) and a move's import
// (session_import.h: chunks as they arrive). It holds what it decoded (arenas, pages, sessions)
// until CommitLocked hands the sessions over or AbandonLocked gives everything back.
//
// Every method whose name ends in Locked requires the manager's lock. The pages NextPageLocked
// hands out are the decoder's alone: their K and V are written without the lock. Not for use
// outside server/sessions/.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_DECODER_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_DECODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/page_store.h"
#include "server/sessions/session_codec.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {

class TransferDecoder {
 public:
  // `what` names the transfer in errors ("session snapshot <path>", "the session transfer").
  TransferDecoder(SessionManager& manager, std::string what,
                  SessionManager::ModuleNamed module_named)
      : m_(manager), what_(std::move(what)), module_named_(std::move(module_named)) {}
  TransferDecoder(const TransferDecoder&) = delete;
  TransferDecoder& operator=(const TransferDecoder&) = delete;

  // The header and the layouts, through the page count. OUT_OF_RANGE when `r` ran out of bytes
  // (nothing taken: call again with more of them), DATA_LOSS (not a transfer),
  // FAILED_PRECONDITION (another page size), or the pool's error for a layout.
  absl::Status HeadLocked(TransferReader& r);
  // The sender's owner (after HeadLocked).
  const std::string& owner() const { return owner_; }
  // Records of the page section (pages, and kMoreRecords announcing more) known so far, and
  // how many NextPageLocked and MoreRecords have taken.
  uint64_t records() const { return n_records_; }
  uint64_t records_taken() const { return records_taken_; }
  // A kMoreRecords record: `n` more records follow. DATA_LOSS for an absurd n.
  absl::Status MoreRecords(uint64_t n);
  // The bytes of K and of V of a page of layout `layout`; DATA_LOSS for an index not in the
  // header.
  absl::StatusOr<std::pair<size_t, size_t>> PageBytes(uint32_t layout) const;

  // The next page of the transfer, of layout `layout` (checked by PageBytes): allocated, to be
  // written with store->WritePage; or store null when the pool has no room (the sessions that
  // need it are lost).
  struct Target {
    kernels::PageStore* store = nullptr;
    int32_t page = -1;
  };
  Target NextPageLocked(uint32_t layout);

  // The sessions (after every page): built holding their pages; one whose module is missing
  // or changed, or whose pages did not fit, is counted lost in stats() instead. DATA_LOSS when
  // they do not parse.
  absl::Status SessionsLocked(TransferReader& r);
  SessionManager::SnapshotStats& stats() { return stats_; }

  // The decoded sessions, holding their pages and arenas; the decoder lets go of the rest.
  std::vector<std::shared_ptr<Session>> CommitLocked();
  // Gives back everything it holds (a failure; idempotent).
  void AbandonLocked();

 private:
  absl::Status Torn() const;

  SessionManager& m_;
  const std::string what_;
  const SessionManager::ModuleNamed module_named_;
  std::string owner_;
  uint32_t version_ = 0;
  uint64_t n_records_ = 0, records_taken_ = 0;
  std::vector<Arena*> arenas_;
  // In the transfer's order; {null, -1} for a page the pool had no room for.
  std::vector<std::pair<Arena*, int32_t>> pages_;
  std::vector<std::shared_ptr<Session>> sessions_;
  SessionManager::SnapshotStats stats_;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_DECODER_H_
