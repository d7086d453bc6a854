#include "server/transport/session_mover.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
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
                           TransferBuffers* buffers, metrics::Metrics* metrics)
    : sessions_(sessions), options_(std::move(options)), buffers_(buffers), metrics_(metrics) {
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

absl::StatusOr<std::vector<std::string>> SessionMover::Send(size_t index,
                                                            const std::string& transfer) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMicroseconds(options_.timeout));
  if (!options_.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  v1::AcceptSessionsResponse response;
  auto writer = stubs_[index]->AcceptSessions(&context, &response);
  v1::SessionTransferChunk chunk;
  chunk.set_total_bytes(static_cast<int64_t>(transfer.size()));
  for (size_t at = 0; at < transfer.size(); at += kChunkBytes) {
    chunk.set_data(transfer.data() + at, std::min(kChunkBytes, transfer.size() - at));
    if (!writer->Write(chunk)) break;  // the peer answered early: Finish says why
    chunk.clear_total_bytes();
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpc(status, options_.peers[index]);
  return std::vector<std::string>(response.session_ids().begin(), response.session_ids().end());
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
  const absl::Time start = absl::Now();
  std::string transfer = buffers_->Take();
  absl::Cleanup give_back = [&] { buffers_->Give(std::move(transfer)); };
  if (absl::Status st = sessions_->BeginMove(id, &transfer); !st.ok()) return st;
  auto ids = Send(static_cast<size_t>(it - options_.peers.begin()), transfer);
  if (ids.ok() && ids->size() != 1) {
    ids = absl::InternalError(
        absl::StrCat("peer ", peer, " answered ", ids->size(), " session ids for one session"));
  }
  sessions_->EndMove(id, ids.ok() ? ids->front() : "");
  Moved moved;
  moved.pause = absl::Now() - start;
  if (!ids.ok()) {
    if (metrics_ != nullptr) {
      metrics_->RecordSessionMoveFailed(metrics::CodeName(static_cast<int>(ids.status().code())));
    }
    return ids.status();
  }
  moved.id = ids->front();
  moved.bytes = static_cast<int64_t>(transfer.size());
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
