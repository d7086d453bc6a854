// The AttentionStream rpc: a bidirectional stream whose requests are computed like unary ones
// (through the same dispatcher, so they batch with everyone else's) and answered in completion
// order, each response carrying its request's id.
#ifndef ATTNSERVE_SERVER_ATTENTION_STREAM_H_
#define ATTNSERVE_SERVER_ATTENTION_STREAM_H_

#include <atomic>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "server/batching/sync.h"
#include "server/dispatcher.h"
#include "server/limits.h"
#include "server/metrics/metrics.h"
#include "server/module_registry.h"

namespace attnserve::server {

// One stream. Owns itself: created by the handler, deleted in OnDone. Thread-safe: gRPC's
// reactions and the jobs' completions run on different threads and meet under mu_.
//
// Flow control: at most limits.max_stream_in_flight requests are queued or computing; reading
// pauses at the limit and resumes as jobs complete. Responses are written one at a time (gRPC
// allows one outstanding write) from a queue. The stream finishes once reading is over (the
// caller half-closed, or the call was cancelled), every job has answered and every response
// has been written.
class AttentionStreamReactor final
    : public grpc::ServerBidiReactor<v1::AttentionStreamRequest, v1::AttentionStreamResponse> {
 public:
  struct Context {
    const Limits* limits;
    const ModuleRegistry* modules;
    Dispatcher* dispatcher;
    metrics::Metrics* metrics;
  };

  // Starts reading. `context` outlives the stream (it is the server's).
  AttentionStreamReactor(grpc::CallbackServerContext* call, const Context& context);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Validates request_ and submits its job, or answers its error at once.
  void Handle();
  // Queues a response (and starts writing it if no write is in flight).
  void Respond(v1::AttentionStreamResponse response, bool job_done);
  // The next action, decided under mu_ and done after releasing it (a gRPC operation is never
  // started while mu_ is held, so a reaction that runs inline cannot deadlock on it).
  struct Actions {
    bool read = false;
    const v1::AttentionStreamResponse* write = nullptr;
    bool finish = false;
  };
  Actions NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const Actions& actions);

  grpc::CallbackServerContext* const call_;
  const Context context_;
  v1::AttentionStreamRequest request_;  // the read in progress; only the reading side touches it
  std::atomic<bool> cancelled_{false};

  batching::Mutex mu_;
  std::deque<v1::AttentionStreamResponse> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // writes_.front() is being written
  bool reading_ ABSL_GUARDED_BY(mu_) = true;   // a read is in flight
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // jobs submitted and not yet answered
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_STREAM_H_
