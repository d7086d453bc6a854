#include "server/core/call.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/admission.h"
#include "server/core/tenant_calls.h"

namespace attnserve::server {

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

absl::Duration DeadlineSkew(absl::Time arrival, absl::Time deadline) {
  return std::clamp((deadline - arrival) / 2, absl::Milliseconds(50), absl::Seconds(1));
}

Caller::Caller(const grpc::CallbackServerContext& context, CancellationListener* listener)
    : deadline_(DeadlineOf(context)),
      connection_(absl::HashOf(context.peer())),
      listener_(listener) {}

Caller::Caller(absl::Time deadline, uint64_t connection, CancellationListener* listener)
    : deadline_(deadline), connection_(connection), listener_(listener) {}

void Caller::set_tenant(std::string tenant) {
  tenant_ = std::move(tenant);
  if (!tenant_.empty()) connection_ = absl::HashOf(absl::string_view("tenant"), tenant_);
}

void Caller::Cancel() {
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  if (listener_ != nullptr) listener_->NotifyCancelled();
}

Call::Call(metrics::Metrics* metrics, metrics::Rpc rpc, const Caller* caller, Responder respond)
    : metrics_(metrics),
      rpc_(rpc),
      caller_(caller),
      arrival_(absl::Now()),
      respond_(std::move(respond)) {
  metrics_->RequestStarted();
}

Call::~Call() {
  if (!finished_.load(std::memory_order_acquire)) {
    Finish(absl::InternalError("the server dropped the request without an answer"));
  }
}

void Call::Finish(absl::Status status, Job* job, std::optional<metrics::DropReason> drop) {
  if (finished_.exchange(true, std::memory_order_acq_rel)) return;
  const absl::Time now = absl::Now();
  const bool cancelled = caller_->cancelled();
  const bool expired =
      caller_->deadline() <= now ||
      (cancelled && caller_->deadline() - now <= DeadlineSkew(arrival_, caller_->deadline()));
  if (expired || cancelled) {
    // The answer can no longer reach the caller (or only after its deadline, which gRPC turns
    // into DEADLINE_EXCEEDED on both sides): answer and count what the caller sees. Whether a
    // cancellation was the deadline is decided here alone (gRPC reports both as a cancel).
    const absl::StatusCode code =
        expired ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kCancelled;
    if (!drop.has_value() || *drop == metrics::DropReason::kDeadline ||
        *drop == metrics::DropReason::kCancelled) {
      drop = status.ok() ? metrics::DropReason::kLate
             : expired   ? metrics::DropReason::kDeadline
                         : metrics::DropReason::kCancelled;
    }
    if (status.code() != code) {
      status = absl::Status(code,
                            absl::StrCat(expired ? "the deadline passed" : "the call was cancelled",
                                         status.ok() ? " before the computed answer could be sent"
                                                     : " before the request was computed"));
    }
  }
  if (admission_ != nullptr) admission_->Done(now);
  if (tenant_calls_ != nullptr) tenant_calls_->Release(caller_->tenant());
  metrics_->RequestFinished(rpc_, static_cast<int>(status.code()), now - arrival_);
  if (drop.has_value()) metrics_->RecordDropped(*drop);
  // Last: the reactor may be gone once it has responded.
  Responder respond = std::move(respond_);
  respond(status, status.ok() ? job : nullptr, now);
}

}  // namespace attnserve::server
