// One request's life on the server, from its arrival to its one answer, for unary calls and
// stream items alike. The reactors (attention_service.cc, attention_stream.cc) only say how to
// respond; everything else about a request lives here.
//
//   Caller    the gRPC call requests arrive on: one per unary call, one per stream (shared by
//             the stream's requests). Owns the call's deadline, its cancellation and the
//             connection it came on (the unit of fair queueing). A reactor's OnCancel calls
//             Caller::Cancel, which tells the dispatcher, so queued requests leave at once.
//   Call      one request: its arrival time, its metrics scope (in flight from construction),
//             the places it holds until its answer (its admission slot, its tenant's call in
//             flight: released by Finish) and its one completion. Whoever decides the request's
//             fate calls Finish with the status and, when the request was not computed, why: the
//             drop reason travels from where the decision was made (the batcher, the dispatcher, a
//             stream's own checks). Finish is the one place that decides whether an answer can
//             still reach its caller: when the deadline has passed or the call was cancelled, the
//             answer is DEADLINE_EXCEEDED or CANCELLED, whatever was computed, and it is counted
//             so.
//   Responder what the reactor does with the answer, called once, as the last thing Finish
//             does (the reactor may be deleted as soon as it has responded).
#ifndef ATTNSERVE_SERVER_CORE_CALL_H_
#define ATTNSERVE_SERVER_CORE_CALL_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "server/metrics/metrics.h"

namespace attnserve::server {

struct Job;
class AdmissionGate;  // admission.h
class TenantCalls;    // tenant_calls.h

// What hears of a caller's cancellation: the dispatcher (dispatcher.h), so that the caller's
// queued requests leave at once. NotifyCancelled never blocks.
class CancellationListener {
 public:
  virtual void NotifyCancelled() = 0;

 protected:
  ~CancellationListener() = default;
};

// Thread-safe.
class Caller {
 public:
  // `context` is read here only (deadline, peer). `listener` (the dispatcher; may be null for
  // calls that never queue) hears of cancellations; it outlives the caller.
  Caller(const grpc::CallbackServerContext& context, CancellationListener* listener);
  // A caller without a gRPC call (tests): the given deadline and connection.
  Caller(absl::Time deadline, uint64_t connection, CancellationListener* listener);

  absl::Time deadline() const { return deadline_; }
  // The unit of fair queueing: requests with one key share one fair share of the queue. A hash
  // of the peer address, or of the tenant once a named tenant is set (its connections share
  // its part).
  uint64_t connection() const { return connection_; }
  // Who is calling (server/transport/auth.h): "" the anonymous (or shared-token) tenant.
  const std::string& tenant() const { return tenant_; }
  // Set by the transport once it has authenticated the call, before any of its requests is
  // read (nothing else reads the caller before then).
  void set_tenant(std::string tenant);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // The call is over for the caller (gRPC's OnCancel: the client cancelled, the deadline passed,
  // or the connection broke). Tells the dispatcher once, so queued requests leave at once.
  void Cancel();

 private:
  const absl::Time deadline_;
  uint64_t connection_;
  std::string tenant_;
  CancellationListener* const listener_;
  std::atomic<bool> cancelled_{false};
};

// Thread-safe for Finish (the first call wins); the rest is read-only.
class Call {
 public:
  // `status` is what the caller is told; on OK `job` holds the computed outputs (else it may be
  // null); `now` is the time of the answer. Must not block.
  using Responder = absl::AnyInvocable<void(const absl::Status& status, Job* job, absl::Time now)>;

  // Counts the request in flight from now. `metrics` and `caller` outlive the call (a reactor
  // finishes only after its calls have responded).
  Call(metrics::Metrics* metrics, metrics::Rpc rpc, const Caller* caller, Responder respond);
  // A call destroyed unanswered is answered INTERNAL, so that no caller waits forever.
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  absl::Time arrival() const { return arrival_; }
  absl::Time deadline() const { return caller_->deadline(); }
  bool IsCancelled() const { return caller_->cancelled(); }
  const Caller& caller() const { return *caller_; }
  metrics::Rpc rpc() const { return rpc_; }

  // Places the call holds until it is answered, released by Finish before it responds: its
  // slot in the admission gate (Done at the answer's time) and its tenant's call in flight.
  // Set before the call can be finished by another thread.
  void HoldAdmission(AdmissionGate* gate) { admission_ = gate; }
  void HoldTenantSlot(TenantCalls* calls) { tenant_calls_ = calls; }

  // Answers the request, once (later calls do nothing): decides what the caller gets (above),
  // counts it by rpc and code and, when `drop` is set or the caller is gone, by drop reason,
  // then responds. `job` may be null when nothing was computed.
  void Finish(absl::Status status, Job* job = nullptr,
              std::optional<metrics::DropReason> drop = std::nullopt);

 private:
  metrics::Metrics* const metrics_;
  const metrics::Rpc rpc_;
  const Caller* const caller_;
  const absl::Time arrival_;
  Responder respond_;
  AdmissionGate* admission_ = nullptr;
  TenantCalls* tenant_calls_ = nullptr;
  std::atomic<bool> finished_{false};
};

// A client's deadline reaches the server as a timeout (grpc-timeout), which the server turns into
// a deadline of its own when the header arrives: later than the client's by the header's transit
// and the timeout's rounding up. At its own deadline the client cancels the call, and that cancel
// often arrives before the server's deadline passes. So a cancellation within this skew of the
// server's deadline is counted as the deadline (DEADLINE_EXCEEDED, drop reason "deadline"), which
// is what the caller saw: half of the call's timeout, at least 50 ms and at most 1 s. Half, not
// less: a server under a CPU quota reads a call's headers up to a quota period (100 ms) after
// they arrived, so with a quarter some callers' deadlines were counted CANCELLED
// (tests/python/test_overload.py). A caller that cancels by hand that close to its deadline is
// counted as a deadline too.
absl::Duration DeadlineSkew(absl::Time arrival, absl::Time deadline);

// The gRPC deadline of a call; absl::InfiniteFuture() when the caller set none.
absl::Time DeadlineOf(const grpc::CallbackServerContext& context);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_CALL_H_
