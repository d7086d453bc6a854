#include "server/transport/attention_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "server/transport/request_builder.h"
#include "server/transport/wire.h"

namespace attnserve::server {
namespace {

// The stream's response to one request.
v1::AttentionStreamResponse MakeResponse(uint64_t id, const absl::Status& status, Job* job,
                                         absl::Time now) {
  v1::AttentionStreamResponse response;
  response.set_request_id(id);
  response.set_code(static_cast<int>(status.code()));
  response.set_message(BoundMessage(status.message()));
  if (status.ok() && job != nullptr) {
    if (job->kind == JobKind::kSessionExtend) {
      if (job->session_batch) {
        FillResponse(*job, now, response.mutable_extend_sessions());
      } else {
        FillResponse(*job, now, response.mutable_extend_session());
      }
    } else if (job->kind == JobKind::kAttend) {
      WriteOutputs(*job, response.mutable_attend());
      WriteTiming(job->timing, now, response.mutable_attend()->mutable_timing());
    } else {
      WriteOutputs(*job, response.mutable_multi_head_attention());
      WriteTiming(job->timing, now, response.mutable_multi_head_attention()->mutable_timing());
    }
  }
  return response;
}

}  // namespace

AttentionStreamReactor::AttentionStreamReactor(grpc::CallbackServerContext* call,
                                               const Context& context, absl::StatusOr<Identity> who)
    : context_(context), caller_(*call, context.dispatcher) {
  if (!who.ok()) {
    const absl::Status authorized = who.status();
    Call(context_.metrics, metrics::Rpc::kAttentionStream, &caller_,
         [](const absl::Status&, Job*, absl::Time) {})
        .Finish(authorized);
    {
      MutexLock lock(&mu_);
      reading_ = false;
      finished_ = true;
    }
    Finish(ToGrpcStatus(authorized));
    return;
  }
  caller_.set_tenant(std::move(who->tenant));  // before the first read
  if (context_.drain->Join(this)) {
    // The server drains already: end at once.
    {
      MutexLock lock(&mu_);
      reading_ = false;
      draining_ = true;
      finished_ = true;
    }
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down; open a new stream to another replica"));
    return;
  }
  StartRead(&read_);
}

void AttentionStreamReactor::OnReadDone(bool ok) {
  if (ok) {
    // A read still pending when a drain finished the stream completes unread.
    bool finished;
    {
      MutexLock lock(&mu_);
      finished = finished_;
    }
    if (!finished) Handle();
  }
  Actions actions;
  {
    MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) reads_done_ = true;
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::Handle() {
  ++messages_read_;
  auto owned = std::make_shared<v1::AttentionStreamRequest>();  // the job's inputs view it
  const v1::AttentionStreamRequest& request = *owned;
  // An oversized message is not parsed (its request id is unknown): like an unparseable one, it
  // ends the stream after the answers to the requests before it.
  absl::Status status = CheckMessageSize(
      *context_.limits, read_.Length(),
      absl::StrCat("message ", messages_read_, " of the stream (an AttentionStreamRequest)"));
  if (status.ok() && !ParseMessage(read_, owned.get())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("message ", messages_read_, " of the stream (", read_.Length(),
                     " bytes) is not a valid attnserve.v1.AttentionStreamRequest"));
  }
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(status.message(),
                                                      "; the stream ends after answering the "
                                                      "requests before it"));
    Call(context_.metrics, metrics::Rpc::kAttentionStream, &caller_,
         [](const absl::Status&, Job*, absl::Time) {})
        .Finish(status);
    read_.Clear();
    MutexLock lock(&mu_);
    broken_ = status;
    return;
  }
  read_.Clear();

  const uint64_t id = request.request_id();
  metrics::Rpc rpc = metrics::Rpc::kAttentionStream;
  switch (request.request_case()) {
    case v1::AttentionStreamRequest::kAttend:
      rpc = metrics::Rpc::kAttend;
      break;
    case v1::AttentionStreamRequest::kMultiHeadAttention:
      rpc = metrics::Rpc::kMultiHeadAttention;
      break;
    case v1::AttentionStreamRequest::kExtendSession:
      rpc = metrics::Rpc::kExtendSession;
      break;
    case v1::AttentionStreamRequest::kExtendSessions:
      rpc = metrics::Rpc::kExtendSessions;
      break;
    default:
      break;
  }
  bool duplicate;
  {
    MutexLock lock(&mu_);
    duplicate = !ids_.insert(id).second;
    if (!duplicate) ++in_flight_;
  }
  bool counted = false;
  const absl::Status slot =
      duplicate ? absl::OkStatus() : context_.calls->Acquire(caller_.tenant(), &counted);
  auto call = std::make_unique<Call>(
      context_.metrics, rpc, &caller_,
      [this, id, owns_id = !duplicate](const absl::Status& status, Job* job, absl::Time now) {
        const v1::AttentionStreamResponse response = MakeResponse(id, status, job, now);
        if (job != nullptr) ReleaseBuffers(job);
        grpc::ByteBuffer bytes;
        SerializeMessage(response, &bytes);
        Respond(std::move(bytes), id, owns_id);
      });
  if (duplicate) {
    return call->Finish(absl::InvalidArgumentError(absl::StrCat(
        "request_id ", id,
        " is already in flight on this stream; ids must be unique among the requests in "
        "flight")));
  }
  if (!slot.ok()) return call->Finish(slot);
  if (counted) call->HoldTenantSlot(context_.calls);

  absl::StatusOr<std::unique_ptr<Job>> job;
  switch (request.request_case()) {
    case v1::AttentionStreamRequest::kAttend:
      job = BuildAttendJob(request.attend(), *context_.limits);
      break;
    case v1::AttentionStreamRequest::kMultiHeadAttention:
      job = BuildMultiHeadJob(request.multi_head_attention(), *context_.modules, *context_.limits);
      break;
    case v1::AttentionStreamRequest::kExtendSession:
      job = BuildExtendJob(request.extend_session(), caller_.tenant(), *context_.sessions,
                           *context_.limits);
      break;
    case v1::AttentionStreamRequest::kExtendSessions:
      job = BuildExtendsJob(request.extend_sessions(), caller_.tenant(), *context_.sessions,
                            *context_.limits);
      break;
    default:
      job = absl::InvalidArgumentError(
          "request must set attend or multi_head_attention (or extend_session, extend_sessions); "
          "none was set");
  }
  if (!job.ok()) return call->Finish(job.status());
  (*job)->request = std::move(owned);
  (*job)->timing.arrival = call->arrival();
  (*job)->call = std::move(call);
  if (!HasWork(**job)) return (*job)->Finish(absl::OkStatus());
  context_.dispatcher->Submit(*std::move(job));
}

void AttentionStreamReactor::Respond(grpc::ByteBuffer response, uint64_t id, bool owns_id) {
  Actions actions;
  {
    MutexLock lock(&mu_);
    if (owns_id) {
      ids_.erase(id);
      --in_flight_;
    }
    writes_.push_back(std::move(response));
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::OnWriteDone(bool ok) {
  if (!ok) caller_.Cancel();
  Actions actions;
  {
    MutexLock lock(&mu_);
    writes_.pop_front();
    writing_ = false;
    // A failed write means the call is over (cancelled or broken): drop what is left; the
    // requests still in flight are answered into the void and the stream finishes after them.
    if (!ok) writes_.clear();
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::OnCancel() {
  // Tells the dispatcher: this stream's queued requests leave the queue at once.
  caller_.Cancel();
  Actions actions;
  {
    MutexLock lock(&mu_);
    actions = NextLocked();
  }
  Run(actions);
}

AttentionStreamReactor::Actions AttentionStreamReactor::NextLocked() {
  Actions a;
  if (finished_) return a;
  const bool cancelled = caller_.cancelled();
  if (cancelled) writes_.erase(writes_.begin() + (writing_ ? 1 : 0), writes_.end());
  if (!writing_ && !writes_.empty()) {
    writing_ = true;
    a.write = &writes_.front();  // deque: references survive push_back
  }
  // Unwritten responses count against the budget too: a caller that does not read stops us
  // from reading.
  const int64_t held = in_flight_ + static_cast<int64_t>(writes_.size());
  const bool ending = reads_done_ || cancelled || broken_.has_value() || draining_;
  if (!reading_ && !ending && held < context_.limits->max_stream_in_flight) {
    reading_ = true;
    a.read = true;
  }
  // Draining, a pending read does not hold the end: it completes unread (OnReadDone).
  if (ending && (!reading_ || draining_) && in_flight_ == 0 && !writing_ && writes_.empty()) {
    finished_ = true;
    a.finish = cancelled ? grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled")
               : broken_.has_value() ? ToGrpcStatus(*broken_)
               : draining_ && !reads_done_
                   ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  "the server is shutting down; open a new stream to another "
                                  "replica")
                   : grpc::Status::OK;
  }
  return a;
}

void AttentionStreamReactor::Run(const Actions& actions) {
  if (actions.write != nullptr) StartWrite(actions.write);
  if (actions.read) StartRead(&read_);
  if (actions.finish.has_value()) Finish(*actions.finish);
}

void AttentionStreamReactor::OnDrain() {
  Actions actions;
  {
    MutexLock lock(&mu_);
    draining_ = true;
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::OnDone() {
  context_.drain->Leave(this);  // a stream refused at once never joined: no-op
  delete this;
}

}  // namespace attnserve::server
