// Moving decode sessions to other replicas (issue 33): the sending side of a move, over the peer's
// AcceptSessions rpc. A move streams one session to the peer while it cannot be extended
// (SessionManager::Move: its extends answer UNAVAILABLE "moving" meanwhile), its pages read
// straight into chunks of 1 MiB as they are sent, and switches: the session is gone here, its old
// id answers "session moved to '<new id>'" on both replicas, which the bundled clients follow.
// A move that fails leaves the session here, untouched, and is counted by the code of its
// failure.
//
// Used by the MoveSession rpc (an operator's move) and by a drain with --session_peers, which
// moves every session before the server stops (ServerHost::Shutdown).
#ifndef ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_
#define ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"

namespace attnserve::server {

struct PeerOptions {
  // The replicas sessions may be moved to, as host:port (--session_peers).
  std::vector<std::string> peers;
  // The bearer token sent to them (--session_peer_token_file; else --auth_token_file's): their
  // AcceptSessions needs the admin role. Empty: none.
  std::string token;
  // PEM roots that verify the peers' TLS certificates (--session_peer_ca_file). Empty:
  // plaintext.
  std::string ca_pem;
  // One transfer's deadline.
  absl::Duration timeout = absl::Seconds(30);
};

// Thread-safe.
class SessionMover {
 public:
  // `sessions` and `metrics` (may be null) outlive the mover.
  SessionMover(sessions::SessionManager* sessions, PeerOptions options, metrics::Metrics* metrics);

  const std::vector<std::string>& peers() const { return options_.peers; }

  struct Moved {
    std::string id;  // on the peer
    int64_t bytes = 0;
    absl::Duration pause;  // from the move's start to its switch
  };
  // Moves session `id` to `peer` (one of peers(): INVALID_ARGUMENT otherwise). The errors of
  // SessionManager::Move, and the peer's (named): the session is then still here.
  absl::StatusOr<Moved> Move(const std::string& id, const std::string& peer);

  struct Report {
    int64_t moved = 0, failed = 0, bytes = 0;
    absl::Duration longest_pause;
    std::string first_failure;  // for the log
  };
  // Moves every session to the peers, each to the next peer in turn that takes it; a session
  // with an extend in flight is tried again until `deadline`. For a drain: call
  // SessionManager::Leave() first, so that no session is created meanwhile.
  Report MoveAll(absl::Time deadline);

 private:
  sessions::SessionManager* const sessions_;
  const PeerOptions options_;
  metrics::Metrics* const metrics_;
  std::vector<std::unique_ptr<v1::AttentionService::Stub>> stubs_;  // one per peer
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_
