#include "server/transport/session_mover.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "server/transport/wire.h"

namespace attnserve::server {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr absl::string_view kDnsPrefix = "dns:";

// "host:port" or "[ipv6]:port" into its host (without brackets) and port (digits); false when
// it is not one.
bool SplitHostPort(absl::string_view s, std::string* host, std::string* port) {
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == s.size()) return false;
  absl::string_view h = s.substr(0, colon), p = s.substr(colon + 1);
  if (!std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  if (absl::ConsumePrefix(&h, "[") && !absl::ConsumeSuffix(&h, "]")) return false;
  if (h.empty()) return false;
  *host = std::string(h);
  *port = std::string(p);
  return true;
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view peer) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("peer ", peer, ": ", status.error_message()));
}

}  // namespace

SessionMover::SessionMover(sessions::SessionManager* sessions, PeerOptions options,
                           metrics::Metrics* metrics)
    : sessions_(sessions), options_(std::move(options)), metrics_(metrics) {
  if (options_.ca_pem.empty()) {
    credentials_ = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.ca_pem;
    ssl.pem_cert_chain = options_.cert_pem;
    ssl.pem_private_key = options_.key_pem;
    credentials_ = grpc::SslCredentials(ssl);
  }
}

std::vector<std::string> SessionMover::peers() const {
  return ResolvePeers(options_.peers, sessions_->owner());
}

std::shared_ptr<v1::AttentionService::Stub> SessionMover::StubFor(const std::string& peer) {
  MutexLock lock(&mu_);
  std::shared_ptr<v1::AttentionService::Stub>& stub = stubs_[peer];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    if (!options_.server_name.empty()) args.SetSslTargetNameOverride(options_.server_name);
    stub = v1::AttentionService::NewStub(grpc::CreateCustomChannel(peer, credentials_, args));
  }
  return stub;
}

absl::StatusOr<SessionMover::Moved> SessionMover::Move(const std::string& id,
                                                       const std::string& peer,
                                                       absl::Time deadline) {
  // A literal entry is taken as it is written; a "dns:" entry's addresses are resolved now.
  if (std::find(options_.peers.begin(), options_.peers.end(), peer) == options_.peers.end()) {
    const std::vector<std::string> now = peers();
    if (std::find(now.begin(), now.end(), peer) == now.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "peer must be one of this server's --session_peers (",
          options_.peers.empty() ? "none are set" : absl::StrJoin(options_.peers, ", "),
          now.empty() ? "; none resolve to another replica now"
                      : absl::StrCat("; now ", absl::StrJoin(now, ", ")),
          "); was '", peer, "'"));
    }
  }
  const std::shared_ptr<v1::AttentionService::Stub> stub = StubFor(peer);
  // The call to the peer, opened with the first chunk: a move refused here (a lost session,
  // one moving already) never reaches it.
  struct PeerCall {
    grpc::ClientContext context;
    v1::AcceptSessionsResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::AcceptSessionsRequest>> writer;
    std::optional<grpc::Status> status;
  };
  std::unique_ptr<PeerCall> call;
  const auto end_call = [&]() -> const grpc::Status& {
    if (!call->status.has_value()) {
      call->writer->WritesDone();
      call->status = call->writer->Finish();
    }
    return *call->status;
  };
  v1::AcceptSessionsRequest chunk;
  int64_t bytes = 0;
  // The transfer ends by then, and the switch waits for an extend in flight until then.
  const absl::Time end = std::min(absl::Now() + options_.timeout, deadline);
  absl::Duration pause;
  absl::StatusOr<std::string> to = sessions_->Move(
      id, kChunkBytes,
      [&](std::string& data) -> absl::Status {
        if (call == nullptr) {
          call = std::make_unique<PeerCall>();
          call->context.set_deadline(absl::ToChronoTime(end));
          if (!options_.token.empty()) {
            call->context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
          }
          call->writer = stub->AcceptSessions(&call->context, &call->response);
        }
        bytes += static_cast<int64_t>(data.size());
        // The chunk's bytes become the message's, without a copy (and its buffer comes back).
        chunk.mutable_data()->swap(data);
        const bool written = call->writer->Write(chunk);
        chunk.mutable_data()->swap(data);
        if (written) return absl::OkStatus();
        // The peer ended the call (a refusal, a broken connection): its status says why.
        const grpc::Status& st = end_call();
        return st.ok() ? absl::UnavailableError(
                             absl::StrCat("peer ", peer, " ended the transfer early"))
                       : FromGrpc(st, peer);
      },
      [&]() -> absl::StatusOr<std::string> {
        if (const grpc::Status& st = end_call(); !st.ok()) return FromGrpc(st, peer);
        if (call->response.session_ids_size() != 1) {
          return absl::InternalError(absl::StrCat("peer ", peer, " answered ",
                                                  call->response.session_ids_size(),
                                                  " session ids for one session"));
        }
        return call->response.session_ids(0);
      },
      end, &pause);
  if (call != nullptr && !call->status.has_value()) {
    call->context.TryCancel();  // a failure here after the call opened: the peer drops it
    end_call();
  }
  Moved moved;
  moved.pause = pause;
  if (!to.ok()) {
    if (metrics_ != nullptr && call != nullptr) {
      metrics_->RecordSessionMoveFailed(metrics::CodeName(static_cast<int>(to.status().code())));
    }
    return to.status();
  }
  moved.id = *to;
  moved.bytes = bytes;
  if (metrics_ != nullptr) metrics_->RecordSessionMoveSent(moved.bytes, moved.pause);
  return moved;
}

SessionMover::Report SessionMover::MoveAll(absl::Time deadline) {
  Report report;
  const std::vector<std::string> peers = this->peers();
  report.peers = static_cast<int64_t>(peers.size());
  {
    // The channels of addresses a name no longer resolves to (pods replaced) go.
    MutexLock lock(&mu_);
    absl::erase_if(stubs_, [&](const auto& entry) {
      return std::find(peers.begin(), peers.end(), entry.first) == peers.end();
    });
  }
  const std::vector<std::string> ids = sessions_->Ids();
  if (peers.empty()) {
    report.failed = static_cast<int64_t>(ids.size());
    if (!ids.empty()) {
      report.first_failure =
          absl::StrCat("no peer: --session_peers (", absl::StrJoin(options_.peers, ", "),
                       ") resolve to no other replica");
    }
    return report;
  }
  size_t next_peer = 0;
  for (const std::string& id : ids) {
    absl::Status last;
    bool done = false;
    // Each peer once, from the next in turn; a session with an extend in flight waits for it.
    for (size_t tried = 0; tried < peers.size() && !done;) {
      if (absl::Now() >= deadline) {
        last = absl::DeadlineExceededError("the drain's grace period ended before its move");
        break;
      }
      const std::string& peer = peers[(next_peer + tried) % peers.size()];
      auto moved = Move(id, peer, deadline);
      if (moved.ok()) {
        ++report.moved;
        report.bytes += moved->bytes;
        report.longest_pause = std::max(report.longest_pause, moved->pause);
        done = true;
        next_peer = (next_peer + tried + 1) % peers.size();
        break;
      }
      last = moved.status();
      if (absl::IsAborted(last)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;  // the same peer, once the extend has returned
      }
      // Gone meanwhile (closed, expired): nothing to move.
      const bool gone = absl::IsNotFound(last) ||
                        !sessions::SessionManager::LostReason(last).empty() ||
                        !sessions::SessionManager::MovedTo(last).empty();
      if (gone) {
        done = true;
        break;
      }
      ++tried;
    }
    if (!done) {
      ++report.failed;
      if (report.first_failure.empty()) {
        report.first_failure = absl::StrCat("session '", id, "': ", last.message());
      }
    }
  }
  return report;
}

namespace {

// Every address `host` resolves to now, as "ip:port" or "[ipv6]:port", sorted (the same order on
// every replica); none when it does not resolve.
std::vector<std::string> Resolve(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return {};
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, ip,
                sizeof ip);
      addresses.push_back(absl::StrCat(ip, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, ip,
                sizeof ip);
      addresses.push_back(absl::StrCat("[", ip, "]:", port));
    }
  }
  freeaddrinfo(found);
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  return addresses;
}

}  // namespace

std::vector<std::string> ResolvePeers(const std::vector<std::string>& entries,
                                      const std::string& self) {
  // This replica by its owner address and, when that names a host (a StatefulSet pod's stable
  // name), by every address the host has now: a name's records may include this pod.
  std::vector<std::string> selves = {self};
  if (std::string host, port; SplitHostPort(self, &host, &port)) {
    for (std::string& address : Resolve(host, port)) selves.push_back(std::move(address));
  }
  std::vector<std::string> out;
  const auto add = [&](std::string address) {
    if (std::find(selves.begin(), selves.end(), address) == selves.end() &&
        std::find(out.begin(), out.end(), address) == out.end()) {
      out.push_back(std::move(address));
    }
  };
  for (const std::string& entry : entries) {
    if (!absl::StartsWith(entry, kDnsPrefix)) {
      add(entry);
      continue;
    }
    std::string host, port;
    if (!SplitHostPort(absl::string_view(entry).substr(kDnsPrefix.size()), &host, &port)) continue;
    for (std::string& address : Resolve(host, port)) add(std::move(address));
  }
  return out;
}

absl::Status CheckPeerEntries(const std::vector<std::string>& entries) {
  for (const std::string& entry : entries) {
    absl::string_view rest = entry;
    absl::ConsumePrefix(&rest, kDnsPrefix);
    std::string host, port;
    if (!SplitHostPort(rest, &host, &port)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--session_peers: '", entry, "' is not host:port or dns:host:port (a port is needed)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPeerOptions(const PeerOptions& options) {
  if (absl::Status st = CheckPeerEntries(options.peers); !st.ok()) return st;
  if (options.cert_pem.empty() != options.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "--session_peer_cert_file and --session_peer_key_file must be given together");
  }
  if (options.ca_pem.empty() && (!options.cert_pem.empty() || !options.server_name.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        !options.cert_pem.empty() ? "--session_peer_cert_file" : "--session_peer_server_name",
        " needs --session_peer_ca_file (TLS to the peers; without it the moves are plaintext)"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
