// Moving decode sessions to other replicas (issue 33): the sending side of a move, over the peer's
// AcceptSessions rpc. A move streams one session to the peer in chunks of 1 MiB, its pages read
// straight into them: first the pages it has filled, while it goes on extending, then, at the
// switch (SessionManager::Move: its calls answer UNAVAILABLE "moving" meanwhile), the pages
// filled since and its settings. Then the session is gone here, its old id answers "session
// moved to '<new id>'" on both replicas, which the bundled clients follow. A move that fails
// leaves the session here, untouched, and is counted by the code of its failure.
//
// Used by the MoveSession rpc (an operator's move) and by a drain with --session_peers, which
// moves every session before the server stops (ServerHost::Shutdown).
#ifndef ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_
#define ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "base/mutex.h"
#include "grpcpp/security/credentials.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"

namespace attnserve::server {

struct PeerOptions {
  // The replicas sessions may be moved to (--session_peers): "host:port", or "dns:host:port",
  // resolved again at each use to every address the name has (a Kubernetes headless Service:
  // its ready pods), this replica's own (its session owner) left out.
  std::vector<std::string> peers;
  // The bearer token sent to them (--session_peer_token_file; else --auth_token_file's): their
  // AcceptSessions needs the admin role. Empty: none.
  std::string token;
  // PEM roots that verify the peers' TLS certificates (--session_peer_ca_file). Empty:
  // plaintext.
  std::string ca_pem;
  // The certificate chain and private key this replica presents to peers that require client
  // certificates (their --tls_client_ca_file; --session_peer_cert_file, --session_peer_key_file):
  // both or neither, and only with `ca_pem`. With a tenants file, the certificate's common name
  // is the tenant the peer's AcceptSessions sees (it needs the admin role) unless `token` names
  // one.
  std::string cert_pem, key_pem;
  // The name the peers' certificates are checked against instead of the address dialled
  // (--session_peer_server_name): a "dns:" entry's addresses are pod IPs, which no certificate
  // names; name the Service (e.g. "attnserve-grpc.<namespace>.svc") its certificate is for.
  // Empty: the address's host. Only with `ca_pem`.
  std::string server_name;
  // One transfer's deadline.
  absl::Duration timeout = absl::Seconds(30);
};

// Thread-safe.
class SessionMover {
 public:
  // `sessions` and `metrics` (may be null) outlive the mover.
  SessionMover(sessions::SessionManager* sessions, PeerOptions options, metrics::Metrics* metrics);

  // The peers as of now: the "dns:" entries resolved (ResolvePeers), this replica left out.
  std::vector<std::string> peers() const;

  struct Moved {
    std::string id;  // on the peer
    int64_t bytes = 0;
    absl::Duration pause;  // the switch: while the session's calls were told it is moving
  };
  // Moves session `id` to `peer` (one of peers(): INVALID_ARGUMENT otherwise), its transfer
  // ended by `deadline` at the latest. The errors of SessionManager::Move, and the peer's
  // (named): the session is then still here.
  absl::StatusOr<Moved> Move(const std::string& id, const std::string& peer,
                             absl::Time deadline = absl::InfiniteFuture());

  struct Report {
    int64_t peers = 0;  // resolved at the start
    int64_t moved = 0, failed = 0, bytes = 0;
    absl::Duration longest_pause;
    std::string first_failure;  // for the log
  };
  // Moves every session to the peers, each to the next peer in turn that takes it; a session
  // with an extend in flight is tried again. Nothing is sent after `deadline` (a drain's grace
  // period): the sessions left then are counted as not moved. For a drain: call
  // SessionManager::Leave() first, so that no session is created meanwhile.
  Report MoveAll(absl::Time deadline);

 private:
  std::shared_ptr<v1::AttentionService::Stub> StubFor(const std::string& peer)
      ABSL_LOCKS_EXCLUDED(mu_);

  sessions::SessionManager* const sessions_;
  const PeerOptions options_;
  metrics::Metrics* const metrics_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  Mutex mu_;
  // One per peer address, made at its first move; a drain drops those of addresses no longer
  // among the peers (a "dns:" entry's addresses change).
  absl::flat_hash_map<std::string, std::shared_ptr<v1::AttentionService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

// The addresses of `entries` (PeerOptions::peers) now, in order and each once: a "host:port"
// entry as it is, a "dns:host:port" one as every address its name resolves to ("ip:port",
// "[ipv6]:port"; none when it does not resolve), without `self`.
std::vector<std::string> ResolvePeers(const std::vector<std::string>& entries,
                                      const std::string& self);
// INVALID_ARGUMENT naming the entry when one is not "host:port" or "dns:host:port".
absl::Status CheckPeerEntries(const std::vector<std::string>& entries);
// CheckPeerEntries, and INVALID_ARGUMENT naming the flags when the TLS settings do not go
// together (a certificate without its key, or either, or a server name, without `ca_pem`).
absl::Status CheckPeerOptions(const PeerOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_SESSION_MOVER_H_
