// attnserve::Client: a thread-safe C++ client for the attnserve gRPC service.
//
//   auto client = attnserve::Client::Create("localhost:50051");
//   v1::AttendRequest request;
//   *request.mutable_query() = attnserve::MakeTensor(v1::DTYPE_FLOAT32, {1, 8, 128, 64}, q);
//   ...
//   absl::StatusOr<v1::AttendResponse> response = (*client)->Attend(request);     // blocking
//   std::future<absl::StatusOr<v1::AttendResponse>> f = (*client)->AttendAsync(request);
//   (*client)->AttendAsync(request, [](absl::StatusOr<v1::AttendResponse> r) { ... });
//
// Every call returns absl::StatusOr: the server's gRPC status (code and message) on failure.
// The streaming rpc is client/stream.h (Client::OpenStream).
//
// Retries and load balancing are gRPC's own, configured through the channel's service config
// (ClientOptions::retry, ClientOptions::load_balancing): a call that fails UNAVAILABLE is
// retried with exponential backoff inside its deadline, and calls are spread over every address
// a target resolves to (a `dns:///` name with several records, or an `ipv4:a:p1,b:p2` list; see
// Client::CreateBalanced).
//
// Decode sessions (client/session.h wraps them): a session lives on one replica, and its id
// "<owner>/<instance>/<key>" names that replica (the server's SessionSettings.owner). A
// client made by CreateBalanced from several addresses sends CreateSession to the next
// address in turn and every later call naming a session to the address equal to the id's
// owner; an owner that is none of the client's addresses is INVALID_ARGUMENT, raised by the
// client before anything is sent (start each replica with its owner set to the address clients
// use for it). A client of one target sends everything to that target.
//
// Moved sessions (the server's MoveSession, and drains with --session_peers) are followed: a
// call answered "session moved to '<new id>'" (FAILED_PRECONDITION with the trailing metadata
// attnserve-session-moved; nothing was done) is sent again under the new id, to its owner, and
// the client remembers the move, so every later call naming the old id goes to the new one
// (ExtendSessionResponse.session_id says the id in use). A call to a session being moved
// (UNAVAILABLE "... is moving") is sent again after the server's pushback, within its deadline.
// When a session's replica cannot be reached (UNAVAILABLE without a pushback: it may have
// moved its sessions and stopped), a client of several replicas asks the others whether the
// session moved to them; it then sends GetSession and CloseSession again, and ExtendSession
// when it carries expected_length (attnserve::Session's always do), and otherwise returns the
// UNAVAILABLE with the move remembered, so that the caller's retry reaches the session. A new
// process at the replica's address (a restart in place) answers FAILED_PRECONDITION "session
// lost (restarted)" for a session the old one moved away: the client asks the others too, and
// sends any call again (nothing was done). ExtendSessions does the same for the steps of a
// replica whose call failed so, or that answered "session lost (restarted)", and returns the
// failure of a one-replica call only when none of its steps was found. A call of the
// application's passes the throttle once: the attempts that follow a move are counted, never
// rejected. Streams (OpenStreamForSession) do not follow: an item's
// ExtendSessionResult.moved_to names the new id.
#ifndef ATTNSERVE_CLIENT_CLIENT_H_
#define ATTNSERVE_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "base/mutex.h"
#include "client/throttle.h"
#include "grpcpp/channel.h"

namespace attnserve {

// v1:: below is attnserve::v1, the generated proto namespace (no alias: clang rejects one that
// redeclares the namespace it names).

class AttentionStream;  // client/stream.h

// gRPC's retry policy, applied to every rpc of AttentionService (the service is idempotent
// except LoadModule without `replace`, which answers ALREADY_EXISTS on a repeat, never a
// second module). Attempts are spaced by a random fraction of a backoff that starts at
// initial_backoff and grows by backoff_multiplier up to max_backoff; all of them share the
// call's deadline.
struct RetryOptions {
  // Total attempts including the first; gRPC caps it at 5. Default: 1, no retries, so that a
  // caller sees every UNAVAILABLE as it happens (and existing callers keep that behaviour);
  // 4 suits most callers that want them.
  int max_attempts = 1;
  absl::Duration initial_backoff = absl::Milliseconds(100);  // Default: 100 ms.
  absl::Duration max_backoff = absl::Seconds(2);             // Default: 2 s.
  double backoff_multiplier = 2.0;                           // Default: 2.
  // Canonical code names retried, e.g. {"UNAVAILABLE"}. Default: UNAVAILABLE only (overload,
  // shutdown, a lost connection); RESOURCE_EXHAUSTED is a limit and retrying will not help.
  std::vector<std::string> retryable_codes = {"UNAVAILABLE"};
};

struct ClientOptions {
  // --- Affects behaviour ---
  // Deadline of each unary call unless the call gives its own. Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
  // Largest response accepted, bytes. Default: unlimited (the server bounds its responses).
  int max_receive_message_bytes = -1;
  // Retries of failed calls (see RetryOptions).
  RetryOptions retry;
  // gRPC load-balancing policy over the addresses the target resolves to: "round_robin"
  // (spread calls over all of them) or "pick_first" (gRPC's default: one at a time). Empty:
  // gRPC's default.
  std::string load_balancing;
  // A complete gRPC service config (JSON) to use instead of the one built from `retry` and
  // `load_balancing`. Empty: built from them.
  std::string service_config_json;
  // Client-side adaptive throttling (client/throttle.h) of the compute calls: Attend,
  // MultiHeadAttention, ExtendSession and ExtendSessions, sync and async. A call it rejects
  // fails UNAVAILABLE at once, before anything is sent. Control calls (server info, modules,
  // creating, describing, forking, listing and closing sessions) and streams are neither
  // throttled nor counted. Default: on, k = 2, a 30 s window, p at most 0.95;
  // `throttle.enabled = false` turns it off (attnserve-bench does by default, to measure the
  // server's own refusals).
  ThrottleOptions throttle;

  // --- Security ---
  // TLS. Off by default. When on, tls_root_certs (PEM) verifies the server (empty: the
  // system's roots); tls_client_cert and tls_client_key (PEM) are sent for mutual TLS.
  bool tls = false;
  std::string tls_root_certs;
  std::string tls_client_cert;
  std::string tls_client_key;
  // Overrides the name the server's certificate is checked against (tests, IP targets).
  std::string tls_server_name;
  // Non-empty: sent with every call as "authorization: Bearer <auth_token>".
  std::string auth_token;

  // --- Affects performance ---
  // Channels (TCP connections per server address) calls are spread over; each call picks the
  // next in turn. One HTTP/2 connection serialises its frames on one socket: more help a
  // client that sends many large requests at once. Default: 1.
  int channels = 1;
};

// The service config JSON that `options` ask for (retry policy and load balancing).
std::string ServiceConfigJson(const ClientOptions& options);

// A gRPC target reaching every one of `addresses` ("host:port"), for round_robin:
// "ipv4:a:p1,b:p2" when all are IPv4 literals, "ipv6:[a]:p1,..." when all are IPv6 literals.
// A single address is returned as is. INVALID_ARGUMENT for an empty list, a mix, or host
// names (use one "dns:///name:port" whose records list the servers instead).
absl::StatusOr<std::string> MultiAddressTarget(const std::vector<std::string>& addresses);

namespace client_internal {
class PendingCall;  // client.cc
}  // namespace client_internal

// Thread-safe: one Client may be shared by any number of threads.
class Client {
 public:
  // Connects (lazily) to `target`, a gRPC target such as "localhost:50051",
  // "dns:///attnserve:50051" or "ipv4:10.0.0.1:50051,10.0.0.2:50051", with TLS when
  // options.tls. INVALID_ARGUMENT for an empty target or bad options.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});
  // Spreads calls over `addresses` with round_robin (MultiAddressTarget names the rules).
  static absl::StatusOr<std::unique_ptr<Client>> CreateBalanced(
      const std::vector<std::string>& addresses, ClientOptions options = {});
  // Uses an existing channel (TLS, custom arguments, in-process); options.channels and the
  // service config options are ignored (they are the channel's).
  Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options = {});
  // Cancels the asynchronous unary calls still in flight and waits until each one's callback
  // has returned, so no callback outlives the client and the client's channels are released
  // here, on the caller's thread: gRPC 1.51 tears its shared callback queue down when the
  // last channel goes, and a teardown started on one of that queue's own threads (the last
  // channel reference dropped by a finishing call) joins itself and frees the queue twice.
  // So never destroy a Client from inside one of its callbacks (that would wait forever).
  // Streams (OpenStream) are the caller's own objects and end when the caller destroys them.
  ~Client();

  // One method per rpc of attnserve.v1.AttentionService (see the proto for semantics and
  // errors). `timeout` overrides ClientOptions::timeout when given. Blocking.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::MultiHeadAttentionResponse> MultiHeadAttention(
      const v1::MultiHeadAttentionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::LoadModuleResponse> LoadModule(const v1::LoadModuleRequest& request,
                                                    absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::UnloadModuleResponse> UnloadModule(
      const v1::UnloadModuleRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::ListModulesResponse> ListModules(
      absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo(
      absl::Duration timeout = absl::ZeroDuration());

  // Asynchronous calls. The callback forms never block: the request is copied, the call
  // started, and `done` runs exactly once, on a gRPC thread, when it completes (so `done`
  // must not block for long; it may start more calls). The future forms wrap them.
  template <typename Response>
  using Callback = std::function<void(absl::StatusOr<Response>)>;
  void AttendAsync(const v1::AttendRequest& request, Callback<v1::AttendResponse> done,
                   absl::Duration timeout = absl::ZeroDuration());
  void MultiHeadAttentionAsync(const v1::MultiHeadAttentionRequest& request,
                               Callback<v1::MultiHeadAttentionResponse> done,
                               absl::Duration timeout = absl::ZeroDuration());
  // As above, without copying a request that many calls share; it is kept alive until `done`.
  void AttendAsync(std::shared_ptr<const v1::AttendRequest> request,
                   Callback<v1::AttendResponse> done,
                   absl::Duration timeout = absl::ZeroDuration());
  void MultiHeadAttentionAsync(std::shared_ptr<const v1::MultiHeadAttentionRequest> request,
                               Callback<v1::MultiHeadAttentionResponse> done,
                               absl::Duration timeout = absl::ZeroDuration());
  void GetServerInfoAsync(Callback<v1::GetServerInfoResponse> done,
                          absl::Duration timeout = absl::ZeroDuration());
  std::future<absl::StatusOr<v1::AttendResponse>> AttendAsync(
      const v1::AttendRequest& request, absl::Duration timeout = absl::ZeroDuration());
  std::future<absl::StatusOr<v1::MultiHeadAttentionResponse>> MultiHeadAttentionAsync(
      const v1::MultiHeadAttentionRequest& request, absl::Duration timeout = absl::ZeroDuration());

  // Opens an AttentionStream (client/stream.h). `on_response` (may be empty: read with
  // AttentionStream::Read instead) runs on a gRPC thread for each response. `timeout` bounds
  // the whole stream; zero: no deadline.
  std::unique_ptr<AttentionStream> OpenStream(
      std::function<void(v1::AttentionStreamResponse)> on_response = nullptr,
      absl::Duration timeout = absl::ZeroDuration());
  // As OpenStream, on the replica that holds `session_id` (see "Decode sessions" above): a
  // stream reaches one replica, so its session extends must all name sessions of that one.
  // INVALID_ARGUMENT when the id's owner is none of the client's addresses.
  absl::StatusOr<std::unique_ptr<AttentionStream>> OpenStreamForSession(
      const std::string& session_id,
      std::function<void(v1::AttentionStreamResponse)> on_response = nullptr,
      absl::Duration timeout = absl::ZeroDuration());

  // --- Decode sessions (see the proto for semantics and codes; client/session.h wraps them) ---
  // CreateSession goes to the next replica in turn; the others to the replica named by the
  // session id's owner. Blocking.
  absl::StatusOr<v1::CreateSessionResponse> CreateSession(
      const v1::CreateSessionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::ExtendSessionResponse> ExtendSession(
      const v1::ExtendSessionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  // Steps of sessions held by different replicas are split into one call per replica, sent
  // at once; the results come back merged in the request's order. A call that fails as a
  // whole gives each of its items that call's code and message.
  absl::StatusOr<v1::ExtendSessionsResponse> ExtendSessions(
      const v1::ExtendSessionsRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::ForkSessionResponse> ForkSession(
      const v1::ForkSessionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::CloseSessionResponse> CloseSession(
      const v1::CloseSessionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::GetSessionResponse> GetSession(const v1::GetSessionRequest& request,
                                                    absl::Duration timeout = absl::ZeroDuration());
  // An operator's move of a session to another replica (the admin role; see the proto): sent
  // to the session's replica, which must list `request.peer` in its --session_peers. The
  // client remembers the move.
  absl::StatusOr<v1::MoveSessionResponse> MoveSession(
      const v1::MoveSessionRequest& request, absl::Duration timeout = absl::ZeroDuration());
  // One replica's sessions: `replica` (one of the client's addresses), or empty for the next
  // one in turn (the only one of a single-target client).
  absl::StatusOr<v1::ListSessionsResponse> ListSessions(
      const v1::ListSessionsRequest& request, const std::string& replica = "",
      absl::Duration timeout = absl::ZeroDuration());
  // ExtendSession without blocking: `done` runs once, on a gRPC thread (as AttendAsync's).
  void ExtendSessionAsync(std::shared_ptr<const v1::ExtendSessionRequest> request,
                          Callback<v1::ExtendSessionResponse> done,
                          absl::Duration timeout = absl::ZeroDuration());

  // The addresses sessions are routed over (CreateBalanced's, in order); empty for a client of
  // one target.
  std::vector<std::string> replicas() const;

  // The first channel (all share the same target and options).
  grpc::Channel& channel() { return *channels_[0]; }
  // The throttle of the compute calls; null when ClientOptions::throttle is off.
  Throttle* throttle() { return throttle_.get(); }

 private:
  Client(std::vector<std::shared_ptr<grpc::Channel>> channels, const ClientOptions& options);
  // Sets the deadline (unless `timeout` is infinite) and the bearer token.
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;
  // The stub of the next channel, in turn.
  v1::AttentionService::Stub& NextStub();
  // The stub of the replica holding `session_id` (NextStub() for a single-target client).
  absl::StatusOr<v1::AttentionService::Stub*> SessionStub(const std::string& session_id);
  // The next replica in turn (CreateSession), with its address; NextStub() and "" when the
  // client has no replicas.
  std::pair<v1::AttentionService::Stub*, std::string> NextReplica();
  // Before a throttled call: OK to send it, else the error to answer instead (the throttle's
  // rejection, or its options' error for a client made with a channel and bad options).
  absl::Status Admit();
  // A throttled call's answer, with its trailing metadata (the pushback).
  void Record(const grpc::ClientContext& context, const grpc::Status& status);

  // Moved sessions (see "Moved sessions" above).
  // The id a session has now, following the moves this client has seen from `id`.
  std::string Resolve(const std::string& id) const ABSL_LOCKS_EXCLUDED(moved_mu_);
  void RememberMove(const std::string& from, const std::string& to) ABSL_LOCKS_EXCLUDED(moved_mu_);
  // The new id of session `id` as another replica than its owner knows it (a replica it was
  // moved to), asked by GetSession until `deadline`; "" when none answers so.
  std::string FindMoved(const std::string& id, absl::Time deadline);
  // A unary rpc of no session: `rpc` of the next stub in turn; `throttled`: judged by the
  // client's throttle (the attention rpcs).
  template <typename Request, typename Response>
  absl::StatusOr<Response> UnaryCall(const Request& request, absl::Duration timeout, bool throttled,
                                     grpc::Status (v1::AttentionService::Stub::*rpc)(
                                         grpc::ClientContext*, const Request&, Response*));
  // A session rpc, following moves: `rpc` of the stub of the request's session. `resend`: the
  // call may be sent again after its replica could not be reached (see above).
  template <typename Request, typename Response>
  absl::StatusOr<Response> SessionCall(Request request, absl::Duration timeout, bool throttled,
                                       bool resend,
                                       grpc::Status (v1::AttentionService::Stub::*rpc)(
                                           grpc::ClientContext*, const Request&, Response*));
  // ExtendSessions once, each step to its replica (no following); a result per step, a failed
  // replica call's status in each of its steps' results. admit: the throttle judges the calls
  // once, as one call of the application's (its rejection returned before anything is sent);
  // false: counted, never rejected. unreachable[i]: step i's replica call failed UNAVAILABLE
  // without a pushback, or CANCELLED. *whole (may be null): the failure of the one replica
  // call, when all the steps went to one replica and it failed.
  absl::StatusOr<v1::ExtendSessionsResponse> ExtendSessionsOnce(
      const v1::ExtendSessionsRequest& request, absl::Duration timeout, bool admit,
      std::vector<char>* unreachable, absl::Status* whole);

  // One asynchronous unary call (client.cc). Start registers it (the registry owns it until
  // it completes); Finish, on the gRPC thread after its callback, takes it out, destroys it
  // (its context, so its channel reference) and only then counts it finished.
  using PendingCall = client_internal::PendingCall;
  void Start(std::shared_ptr<PendingCall> call);
  void Finish(PendingCall* call);

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::AttentionService::Stub>> stubs_;
  std::atomic<uint64_t> next_stub_{0};
  // Session routing (CreateBalanced): one channel per address, in the order given.
  std::vector<std::string> replica_addresses_;
  std::vector<std::shared_ptr<grpc::Channel>> replica_channels_;
  std::vector<std::unique_ptr<v1::AttentionService::Stub>> replica_stubs_;
  std::atomic<uint64_t> next_replica_{0};
  ClientOptions options_;
  absl::Status throttle_status_;  // ValidateThrottleOptions(options_.throttle)
  std::unique_ptr<Throttle> throttle_;
  Mutex calls_mu_;
  std::map<PendingCall*, std::shared_ptr<PendingCall>> calls_ ABSL_GUARDED_BY(calls_mu_);
  size_t unfinished_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;  // started, not yet Finish'ed
  CondVar calls_finished_;
  mutable Mutex moved_mu_;
  std::map<std::string, std::string> moved_ ABSL_GUARDED_BY(moved_mu_);  // old id -> new id
  friend class AttentionStream;
};

// Packs float values into a tensor of `dtype` (FLOAT32, FLOAT16 or BFLOAT16; rounded to
// nearest even). REQUIRES values.size() == product(shape).
v1::Tensor MakeTensor(v1::Dtype dtype, const std::vector<int64_t>& shape,
                      const std::vector<float>& values);
// A BOOL mask tensor; nonzero values become 1.
v1::Tensor MakeMask(const std::vector<int64_t>& shape, const std::vector<uint8_t>& values);
// Unpacks a FLOAT32, FLOAT16 or BFLOAT16 tensor into float32 values (exact).
// INVALID_ARGUMENT when the dtype is not a float type or the data size does not match.
absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor);

// The owner part of a session id "<owner>/<instance>/<key>" (the owner may itself hold
// '/'); INVALID_ARGUMENT naming the id when it does not have that form.
absl::StatusOr<std::string> SessionOwner(const std::string& session_id);
// Whether `status` says a session was moved to another replica ("session moved to '<new id>'",
// FAILED_PRECONDITION; the client follows such answers itself), and the new id ("" when not).
bool IsSessionMoved(const absl::Status& status);
std::string SessionMovedTo(const absl::Status& status);
// Whether `status` says a session was lost (evicted, expired, or its server restarted):
// FAILED_PRECONDITION with a message starting "session lost (". The caller creates a new
// session and prefills it again.
bool IsSessionLost(const absl::Status& status);
// "evicted", "expired" or "restarted" for a lost session's status; empty otherwise.
std::string SessionLostReason(const absl::Status& status);

// Linear attention's feature map by the name the command-line tools and the Python client give
// it: "elu_plus_one", "relu" or "identity"; nullopt for any other name.
std::optional<v1::FeatureMap> FeatureMapNamed(absl::string_view name);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_CLIENT_H_
