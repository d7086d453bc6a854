// The AttentionStream rpc: a bidirectional stream whose requests are computed like unary ones
// (through the same dispatcher, so they batch with everyone else's) and answered in completion
// order, each response carrying its request's id.
#ifndef ATTNSERVE_SERVER_TRANSPORT_ATTENTION_STREAM_H_
#define ATTNSERVE_SERVER_TRANSPORT_ATTENTION_STREAM_H_

#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "base/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/core/call.h"
#include "server/core/dispatcher.h"
#include "server/core/drain.h"
#include "server/core/module_registry.h"
#include "server/core/tenant_calls.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/transport/auth.h"
#include "server/transport/limits.h"

namespace attnserve::server {

// One stream. Owns itself: created by the handler, deleted in OnDone. Thread-safe: gRPC's
// reactions and the requests' answers run on different threads and meet under mu_.
//
// Every request read is one Call (call.h), sharing the stream's Caller: the stream's deadline
// and cancellation (OnCancel tells the dispatcher, so its queued requests leave at once).
//
// Flow control: a stream holds at most limits.max_stream_in_flight requests that are queued,
// computing, or answered but not yet written to the transport (a caller that does not read its
// responses stops the server from reading its requests, so its memory stays bounded). Reading
// pauses at the limit and resumes as responses are written. Responses are written one at a
// time (gRPC allows one outstanding write) from a queue.
//
// Protocol (the proto's AttentionStream comment):
//   - a request whose request_id equals one in flight is answered INVALID_ARGUMENT (that item
//     only; the stream goes on);
//   - an item with neither request set is answered INVALID_ARGUMENT (counted under the rpc
//     label AttentionStream);
//   - a message that is not an AttentionStreamRequest ends the stream: nothing after it is read,
//     the requests before it are answered, then the stream finishes INVALID_ARGUMENT.
// The stream finishes once reading is over (the caller half-closed, the call was cancelled or a
// message did not parse), every request has been answered and every response written. When the
// server drains (OnDrain()), reading stops too: the stream ends once its requests are answered,
// UNAVAILABLE (its caller opens a new one on another replica), at once when it is idle.
class AttentionStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public Drain::Listener {
 public:
  struct Context {
    const Limits* limits;
    const ModuleRegistry* modules;
    Dispatcher* dispatcher;
    sessions::SessionManager* sessions;
    metrics::Metrics* metrics;
    Drain* drain;        // the stream listens to it until OnDone
    TenantCalls* calls;  // counts each request in flight for the stream's tenant
  };

  // Starts reading as `who` (its tenant owns the stream's sessions), or finishes at once with
  // who's status when it is not OK. `context` outlives the stream (it is the server's).
  AttentionStreamReactor(grpc::CallbackServerContext* call, const Context& context,
                         absl::StatusOr<Identity> who);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // The server drains: see the class comment. Never blocks on a gRPC operation.
  void OnDrain() override;

 private:
  // Parses read_ and answers or submits the request in it.
  void Handle();
  // Queues an encoded response (and starts writing it if no write is in flight); `owns_id`:
  // the response answers a request counted in flight under its id.
  void Respond(grpc::ByteBuffer response, uint64_t id, bool owns_id);
  // The next action, decided under mu_ and done after releasing it (a gRPC operation is never
  // started while mu_ is held, so a reaction that runs inline cannot deadlock on it).
  struct Actions {
    bool read = false;
    const grpc::ByteBuffer* write = nullptr;
    std::optional<grpc::Status> finish;
  };
  Actions NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const Actions& actions);

  const Context context_;
  Caller caller_;
  grpc::ByteBuffer read_;      // the read in progress; only the reading side touches it
  int64_t messages_read_ = 0;  // only the reading side touches it

  Mutex mu_;
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // writes_.front() is being written
  bool reading_ ABSL_GUARDED_BY(mu_) = true;   // a read is in flight
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the stream must end with this status (a message did not parse).
  std::optional<absl::Status> broken_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // requests accepted and not yet answered
  absl::flat_hash_set<uint64_t> ids_ ABSL_GUARDED_BY(mu_);  // their request_ids
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_ATTENTION_STREAM_H_
