#include "server/transport/session_mover.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "server/transport/wire.h"

namespace attnserve::server {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

absl::Status FromGrpc(const grpc::Status& status, absl::string_view peer) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("peer ", peer, ": ", status.error_message()));
}

}  // namespace

SessionMover::SessionMover(sessions::SessionManager* sessions, PeerOptions options,
                           metrics::Metrics* metrics)
    : sessions_(sessions), options_(std::move(options)), metrics_(metrics) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options_.ca_pem.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.ca_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  for (const std::string& peer : options_.peers) {
    stubs_.push_back(
        v1::AttentionService::NewStub(grpc::CreateCustomChannel(peer, credentials, args)));
  }
}

absl::StatusOr<SessionMover::Moved> SessionMover::Move(const std::string& id,
                                                       const std::string& peer) {
  const auto it = std::find(options_.peers.begin(), options_.peers.end(), peer);
  if (it == options_.peers.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer must be one of this server's --session_peers (",
                     options_.peers.empty() ? "none are set" : absl::StrJoin(options_.peers, ", "),
                     "); was '", peer, "'"));
  }
  v1::AttentionService::Stub& stub = *stubs_[static_cast<size_t>(it - options_.peers.begin())];
  // The call to the peer, opened with the first chunk: a move refused here (an extend in
  // flight, a lost session) never reaches it.
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
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> to = sessions_->Move(
      id, kChunkBytes,
      [&](std::string& data) -> absl::Status {
        if (call == nullptr) {
          call = std::make_unique<PeerCall>();
          call->context.set_deadline(std::chrono::system_clock::now() +
                                     absl::ToChronoMicroseconds(options_.timeout));
          if (!options_.token.empty()) {
            call->context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
          }
          call->writer = stub.AcceptSessions(&call->context, &call->response);
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
      });
  if (call != nullptr && !call->status.has_value()) {
    call->context.TryCancel();  // a failure here after the call opened: the peer drops it
    end_call();
  }
  Moved moved;
  moved.pause = absl::Now() - start;
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
  if (options_.peers.empty()) return report;
  size_t next_peer = 0;
  for (const std::string& id : sessions_->Ids()) {
    absl::Status last;
    bool done = false;
    // Each peer once, from the next in turn; a session with an extend in flight waits for it.
    for (size_t tried = 0; tried < options_.peers.size() && !done;) {
      const std::string& peer = options_.peers[(next_peer + tried) % options_.peers.size()];
      auto moved = Move(id, peer);
      if (moved.ok()) {
        ++report.moved;
        report.bytes += moved->bytes;
        report.longest_pause = std::max(report.longest_pause, moved->pause);
        done = true;
        next_peer = (next_peer + tried + 1) % options_.peers.size();
        break;
      }
      last = moved.status();
      if (absl::IsAborted(last) && absl::Now() < deadline) {
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

}  // namespace attnserve::server
