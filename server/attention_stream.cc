#include "server/attention_stream.h"

#include <chrono>

#include "absl/time/clock.h"
#include "server/attention_service.h"
#include "server/request_builder.h"

namespace attnserve::server {

AttentionStreamReactor::AttentionStreamReactor(grpc::CallbackServerContext* call,
                                               const Context& context)
    : call_(call), context_(context) {
  StartRead(&request_);
}

void AttentionStreamReactor::OnReadDone(bool ok) {
  if (ok) Handle();
  Actions actions;
  {
    batching::MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) reads_done_ = true;
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::Handle() {
  const absl::Time arrival = absl::Now();
  const uint64_t id = request_.request_id();
  const bool attend = request_.has_attend();
  const metrics::Rpc rpc = attend ? metrics::Rpc::kAttend : metrics::Rpc::kMultiHeadAttention;
  context_.metrics->RequestStarted();

  absl::StatusOr<std::unique_ptr<Job>> job;
  if (attend) {
    job = BuildAttendJob(request_.attend(), *context_.limits);
  } else if (request_.has_multi_head_attention()) {
    job = BuildMultiHeadJob(request_.multi_head_attention(), *context_.modules, *context_.limits);
  } else {
    job = absl::InvalidArgumentError("request must set attend or multi_head_attention");
  }
  auto fail = [&](const absl::Status& status) {
    context_.metrics->RequestFinished(rpc, static_cast<int>(status.code()), absl::Now() - arrival);
    v1::AttentionStreamResponse response;
    response.set_request_id(id);
    response.set_code(static_cast<int>(status.code()));
    response.set_message(std::string(status.message()));
    Respond(std::move(response), /*job_done=*/false);
  };
  if (!job.ok()) return fail(job.status());

  (*job)->timing.arrival = arrival;
  (*job)->deadline_at = DeadlineOf(*call_);
  (*job)->is_cancelled = [this] { return cancelled_.load(std::memory_order_relaxed); };
  (*job)->done = [this, id, rpc, attend](Job& done_job, absl::Status status) {
    const absl::Time now = absl::Now();
    context_.metrics->RequestFinished(rpc, static_cast<int>(status.code()),
                                      now - done_job.timing.arrival);
    v1::AttentionStreamResponse response;
    response.set_request_id(id);
    response.set_code(static_cast<int>(status.code()));
    response.set_message(std::string(status.message()));
    if (status.ok()) {
      if (attend) {
        WriteOutputs(done_job, response.mutable_attend());
        WriteTiming(done_job.timing, now, response.mutable_attend()->mutable_timing());
      } else {
        WriteOutputs(done_job, response.mutable_multi_head_attention());
        WriteTiming(done_job.timing, now,
                    response.mutable_multi_head_attention()->mutable_timing());
      }
    }
    Respond(std::move(response), /*job_done=*/true);
  };
  {
    batching::MutexLock lock(&mu_);
    ++in_flight_;
  }
  if (absl::Status s = context_.dispatcher->Submit(&*job); !s.ok()) {
    {
      batching::MutexLock lock(&mu_);
      --in_flight_;
    }
    fail(s);
  }
}

void AttentionStreamReactor::Respond(v1::AttentionStreamResponse response, bool job_done) {
  Actions actions;
  {
    batching::MutexLock lock(&mu_);
    if (job_done) --in_flight_;
    writes_.push_back(std::move(response));
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::OnWriteDone(bool ok) {
  Actions actions;
  {
    batching::MutexLock lock(&mu_);
    writes_.pop_front();
    writing_ = false;
    // A failed write means the call is over (cancelled or broken): drop what is left; the
    // jobs still in flight are answered into the void and the stream finishes after them.
    if (!ok) {
      cancelled_ = true;
      writes_.clear();
    }
    actions = NextLocked();
  }
  Run(actions);
}

void AttentionStreamReactor::OnCancel() {
  cancelled_ = true;
  // Queued jobs of this stream see cancelled_ when their batch forms and are dropped.
  Actions actions;
  {
    batching::MutexLock lock(&mu_);
    actions = NextLocked();
  }
  Run(actions);
}

AttentionStreamReactor::Actions AttentionStreamReactor::NextLocked() {
  Actions a;
  if (finished_) return a;
  const bool cancelled = cancelled_.load();
  if (cancelled) writes_.erase(writes_.begin() + (writing_ ? 1 : 0), writes_.end());
  if (!writing_ && !writes_.empty()) {
    writing_ = true;
    a.write = &writes_.front();  // deque: references survive push_back
  }
  if (!reading_ && !reads_done_ && !cancelled &&
      in_flight_ < context_.limits->max_stream_in_flight) {
    reading_ = true;
    a.read = true;
  }
  if ((reads_done_ || cancelled) && !reading_ && in_flight_ == 0 && !writing_ && writes_.empty()) {
    finished_ = true;
    a.finish = true;
  }
  return a;
}

void AttentionStreamReactor::Run(const Actions& actions) {
  if (actions.write != nullptr) StartWrite(actions.write);
  if (actions.read) StartRead(&request_);
  if (actions.finish) {
    Finish(cancelled_ ? grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled")
                      : grpc::Status::OK);
  }
}

void AttentionStreamReactor::OnDone() { delete this; }

}  // namespace attnserve::server
