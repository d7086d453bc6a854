// SessionImport: the receiving side of a move (the AcceptSessions rpc), the transfer
// (session_codec.h) taken in as its chunks arrive. A page's bytes go straight into the page, in
// the pool's host memory, as they come (a store on a device: gathered, then written whole), so
// that decoding overlaps the transfer instead of following it, with one copy; the header and
// the sessions, small, are gathered first.
// The CRC-32C runs over the bytes as they come. Nothing is visible before Commit, which checks
// the checksum and the trailer and takes the sessions all or none; an import destroyed without a
// successful Commit (a failure, a cut connection) gives back everything it held.
//
// Not thread-safe: one caller feeds it (the call's reactor), in order.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_IMPORT_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/sessions/session_decoder.h"
#include "server/sessions/session_manager.h"

namespace attnserve::server::sessions {

class SessionImport {
 public:
  ~SessionImport();
  SessionImport(const SessionImport&) = delete;
  SessionImport& operator=(const SessionImport&) = delete;

  // The next bytes of the transfer. An error ends the import (every later call answers it):
  // DATA_LOSS (not a transfer), FAILED_PRECONDITION (another page size), RESOURCE_EXHAUSTED (no
  // room in the pool: the sender need not send the rest), UNAVAILABLE (this replica is leaving).
  absl::Status Consume(absl::string_view bytes);
  // The transfer is whole: its sessions under new ids of this replica, in its order, with their
  // tenants, settings, lengths and pages; their old ids answer "moved" here too. All or none:
  // DATA_LOSS (torn or corrupt), FAILED_PRECONDITION (a module not loaded here with the same
  // weights), RESOURCE_EXHAUSTED (no room in the pool, in max_sessions, or in a tenant's
  // shares), UNAVAILABLE (leaving).
  absl::StatusOr<std::vector<std::string>> Commit();

 private:
  friend class SessionManager;  // BeginImport
  SessionImport(SessionManager& manager, SessionManager::ModuleNamed module_named)
      : m_(manager), decoder_(manager, "the session transfer", std::move(module_named)) {}
  absl::Status ConsumeOnce(absl::string_view bytes);
  // The next page record, of `layout`: its page allocated, its bytes to come.
  absl::Status BeginPage(uint32_t layout);
  // Checks the transfer's sessions against this replica before they join it.
  absl::Status Admit(const std::vector<std::shared_ptr<Session>>& sessions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_);

  enum class Phase { kHead, kPages, kTail };
  SessionManager& m_;
  TransferDecoder decoder_;
  Phase phase_ = Phase::kHead;
  std::string pending_;  // the header so far; a page's layout index; a device page; the tail
  // The page record being taken in: its page, where its K and V go in host memory (null for a
  // store on a device: gathered in pending_), its bytes (K and V) and how many are in.
  bool in_record_ = false;
  TransferDecoder::Target page_;
  char* k_page_ = nullptr;
  char* v_page_ = nullptr;
  size_t k_bytes_ = 0, record_bytes_ = 0, record_at_ = 0;
  std::string carry_;   // what followed the header in its chunk
  uint32_t crc_ = 0;    // of the bytes before pending_
  uint64_t bytes_ = 0;  // consumed
  absl::Status failed_;
  bool committed_ = false;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_IMPORT_H_
