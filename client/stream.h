// attnserve::AttentionStream: the AttentionStream rpc from C++. Send requests with ids, get one
// response per request, in completion order (not the order sent), each with its request's id
// and status.
//
//   std::unique_ptr<AttentionStream> stream = client->OpenStream();
//   for (uint64_t id = 0; id < n; ++id) stream->Send(id, requests[id]);  // never blocks
//   stream->CloseSend();
//   v1::AttentionStreamResponse r;
//   while (stream->Read(&r)) { ... r.request_id(), r.code(), r.attend() ... }
//   absl::Status status = stream->Finish();  // the stream's own status
//
// Or give Client::OpenStream a callback, which gets each response on a gRPC thread instead of
// Read.
#ifndef ATTNSERVE_CLIENT_STREAM_H_
#define ATTNSERVE_CLIENT_STREAM_H_

#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "base/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"

namespace attnserve {

// Thread-safe: Send and CloseSend may be called from any thread; Read from one thread at a
// time. Requests are written in the order Send is called, one at a time (gRPC allows one write
// in flight); the rest wait in memory, so Send never blocks. The server reads at most
// GetServerInfo.limits.max_stream_in_flight requests ahead, which bounds how fast the queue
// drains, not its size: a caller that must bound memory counts its own requests in flight.
class AttentionStream
    : private grpc::ClientBidiReactor<v1::AttentionStreamRequest, v1::AttentionStreamResponse> {
 public:
  using ResponseCallback = std::function<void(v1::AttentionStreamResponse)>;

  // Cancels the stream if it is still open and waits for gRPC to finish with it.
  ~AttentionStream() override;

  // Queues one request. False once CloseSend was called or the stream has ended (the request
  // is dropped; Finish tells why).
  bool Send(v1::AttentionStreamRequest request);
  bool Send(uint64_t request_id, const v1::AttendRequest& request);
  bool Send(uint64_t request_id, const v1::MultiHeadAttentionRequest& request);
  // Session extends (one session's, or many sessions' in one message). A stream reaches one
  // replica: with several, open it with Client::OpenStreamForSession.
  bool Send(uint64_t request_id, const v1::ExtendSessionRequest& request);
  bool Send(uint64_t request_id, const v1::ExtendSessionsRequest& request);

  // Half-closes after the queued requests are written: the server answers them all and ends
  // the stream OK.
  void CloseSend();

  // Blocks for the next response; false when the stream has ended and every response was read.
  // Only when the stream was opened without a callback.
  bool Read(v1::AttentionStreamResponse* response);

  // Blocks until the stream has ended, and returns its status: OK after CloseSend and every
  // answer, else why it ended (UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, UNAUTHENTICATED).
  // Responses not yet read stay readable.
  absl::Status Finish();

  // Ends the stream now (CANCELLED); requests not answered get no response.
  void Cancel();

 private:
  friend class Client;
  AttentionStream(ResponseCallback on_response);
  void Start(v1::AttentionService::Stub& stub);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;
  // Starts the next write or the half-close, if one is due; called without mu_ held, so that
  // a reaction gRPC runs inline cannot deadlock on it.
  void Pump();

  grpc::ClientContext context_;
  const ResponseCallback on_response_;
  v1::AttentionStreamResponse reading_;  // the read in flight

  Mutex mu_;
  CondVar cv_;
  std::deque<v1::AttentionStreamRequest> writes_
      ABSL_GUARDED_BY(mu_);  // front() is being written when writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_started_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::AttentionStreamResponse> responses_ ABSL_GUARDED_BY(mu_);  // for Read
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_STREAM_H_
