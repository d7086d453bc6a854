#include "client/stream.h"

namespace attnserve {

AttentionStream::AttentionStream(ResponseCallback on_response)
    : on_response_(std::move(on_response)) {}

void AttentionStream::Start(v1::AttentionService::Stub& stub) {
  stub.async()->AttentionStream(&context_, this);
  StartRead(&reading_);  // a read stays in flight until the stream ends
  StartCall();
}

AttentionStream::~AttentionStream() {
  MutexLock lock(&mu_);
  if (!done_) context_.TryCancel();
  while (!done_) cv_.Wait(&mu_);
}

bool AttentionStream::Send(v1::AttentionStreamRequest request) {
  {
    MutexLock lock(&mu_);
    if (close_requested_ || done_ || write_failed_) return false;
    writes_.push_back(std::move(request));
  }
  Pump();
  return true;
}

namespace {

// The stream message carrying `request` with its id: `field` is the oneof's mutable accessor.
template <typename Request>
v1::AttentionStreamRequest Wrap(uint64_t request_id, const Request& request,
                                Request* (v1::AttentionStreamRequest::*field)()) {
  v1::AttentionStreamRequest r;
  r.set_request_id(request_id);
  *(r.*field)() = request;
  return r;
}

}  // namespace

bool AttentionStream::Send(uint64_t request_id, const v1::AttendRequest& request) {
  return Send(Wrap(request_id, request, &v1::AttentionStreamRequest::mutable_attend));
}

bool AttentionStream::Send(uint64_t request_id, const v1::MultiHeadAttentionRequest& request) {
  return Send(Wrap(request_id, request, &v1::AttentionStreamRequest::mutable_multi_head_attention));
}

bool AttentionStream::Send(uint64_t request_id, const v1::ExtendSessionRequest& request) {
  return Send(Wrap(request_id, request, &v1::AttentionStreamRequest::mutable_extend_session));
}

bool AttentionStream::Send(uint64_t request_id, const v1::ExtendSessionsRequest& request) {
  return Send(Wrap(request_id, request, &v1::AttentionStreamRequest::mutable_extend_sessions));
}

void AttentionStream::CloseSend() {
  {
    MutexLock lock(&mu_);
    close_requested_ = true;
  }
  Pump();
}

void AttentionStream::Pump() {
  const v1::AttentionStreamRequest* next = nullptr;
  bool writes_done = false;
  {
    MutexLock lock(&mu_);
    if (writing_ || writes_done_started_ || done_ || write_failed_) return;
    if (!writes_.empty()) {
      writing_ = true;
      next = &writes_.front();  // stays put: a deque's push_back keeps references valid
    } else if (close_requested_) {
      writes_done_started_ = true;
      writes_done = true;
    }
  }
  if (next != nullptr) StartWrite(next);
  if (writes_done) StartWritesDone();
}

void AttentionStream::OnWriteDone(bool ok) {
  {
    MutexLock lock(&mu_);
    writing_ = false;
    if (ok) {
      writes_.pop_front();
    } else {  // the stream is broken; OnDone follows with the reason
      write_failed_ = true;
      writes_.clear();
    }
  }
  if (ok) Pump();
}

void AttentionStream::OnWritesDoneDone(bool) {}

void AttentionStream::OnReadDone(bool ok) {
  if (!ok) return;  // no more responses; OnDone follows
  if (on_response_) {
    on_response_(std::move(reading_));
  } else {
    MutexLock lock(&mu_);
    responses_.push_back(std::move(reading_));
    cv_.NotifyAll();
  }
  reading_.Clear();
  StartRead(&reading_);
}

void AttentionStream::OnDone(const grpc::Status& status) {
  MutexLock lock(&mu_);
  done_ = true;
  status_ = status.ok() ? absl::OkStatus()
                        : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                       status.error_message());
  cv_.NotifyAll();
}

bool AttentionStream::Read(v1::AttentionStreamResponse* response) {
  MutexLock lock(&mu_);
  while (responses_.empty() && !done_) cv_.Wait(&mu_);
  if (responses_.empty()) return false;
  *response = std::move(responses_.front());
  responses_.pop_front();
  return true;
}

absl::Status AttentionStream::Finish() {
  MutexLock lock(&mu_);
  while (!done_) cv_.Wait(&mu_);
  return status_;
}

void AttentionStream::Cancel() { context_.TryCancel(); }

}  // namespace attnserve
