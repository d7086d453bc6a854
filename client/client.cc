#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/session_errors.h"
#include "client/float_codec.h"
#include "client/stream.h"
#include "grpcpp/channel.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace attnserve {
namespace client_internal {

// An asynchronous unary call: its context, which holds a reference to its channel.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  grpc::ClientContext context;
};

}  // namespace client_internal
namespace {

// "session ... is moving to another replica" (UNAVAILABLE): a session being moved.
bool IsMovingAnswer(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         absl::StrContains(s.error_message(), "' is moving to another replica");
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<codec::FloatFormat> FloatFormatOf(v1::Dtype t) {
  switch (t) {
    case v1::DTYPE_FLOAT32:
      return codec::FloatFormat::kFloat32;
    case v1::DTYPE_FLOAT16:
      return codec::FloatFormat::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return codec::FloatFormat::kBFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor dtype must be FLOAT32, FLOAT16 or BFLOAT16; was ", v1::Dtype_Name(t)));
  }
}

// gRPC durations in JSON: decimal seconds with an "s" suffix.
std::string JsonDuration(absl::Duration d) {
  return absl::StrFormat("%.6fs", absl::ToDoubleSeconds(d));
}

// "1.2.3.4:5" -> true; "[::1]:5" -> false (is_v6 set); host names -> neither.
bool IsIpv4Literal(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int dots = 0;
  for (size_t i = 0; i < colon; ++i) {
    if (a[i] == '.') {
      ++dots;
    } else if (a[i] < '0' || a[i] > '9') {
      return false;
    }
  }
  return dots == 3;
}
bool IsIpv6Literal(const std::string& a) {
  return absl::StartsWith(a, "[") && a.find("]:") != std::string::npos;
}

// One unary call in flight: owns what gRPC reads and writes until the call is destroyed.
template <typename Request, typename Response>
struct AsyncCall : client_internal::PendingCall {
  std::shared_ptr<const Request> request;
  Response response;
  Client::Callback<Response> done;

  void Deliver(const grpc::Status& status) {
    if (status.ok()) {
      done(std::move(response));
    } else {
      done(FromGrpc(status));
    }
  }
};

template <typename Response>
std::future<absl::StatusOr<Response>> ToFuture(
    const std::function<void(Client::Callback<Response>)>& start) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<Response>>>();
  std::future<absl::StatusOr<Response>> future = promise->get_future();
  start([promise](absl::StatusOr<Response> r) { promise->set_value(std::move(r)); });
  return future;
}

// A channel to `target` with the options' credentials, limits and service config.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const ClientOptions& options,
                                           int index) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    ssl.pem_cert_chain = options.tls_client_cert;
    ssl.pem_private_key = options.tls_client_key;
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(-1);
  args.SetServiceConfigJSON(options.service_config_json.empty() ? ServiceConfigJson(options)
                                                                : options.service_config_json);
  // A retried call keeps its request in memory until committed; gRPC's default (256 KiB)
  // would leave most attention requests unretried.
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, 64 << 20);
  // Separate connections per channel: gRPC shares subchannels between channels with equal
  // arguments unless each keeps its own pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("attnserve.channel_index", index);
  if (options.tls && !options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

}  // namespace

std::string ServiceConfigJson(const ClientOptions& options) {
  std::vector<std::string> parts;
  const RetryOptions& r = options.retry;
  if (r.max_attempts > 1) {
    std::vector<std::string> codes;
    for (const std::string& c : r.retryable_codes) codes.push_back(absl::StrCat("\"", c, "\""));
    parts.push_back(absl::StrCat(
        "\"methodConfig\": [{\"name\": [{\"service\": \"attnserve.v1.AttentionService\"}], ",
        "\"retryPolicy\": {\"maxAttempts\": ", r.max_attempts, ", \"initialBackoff\": \"",
        JsonDuration(r.initial_backoff), "\", \"maxBackoff\": \"", JsonDuration(r.max_backoff),
        "\", \"backoffMultiplier\": ", absl::StrFormat("%g", r.backoff_multiplier),
        ", \"retryableStatusCodes\": [", absl::StrJoin(codes, ", "), "]}}]"));
  }
  if (!options.load_balancing.empty()) {
    parts.push_back(
        absl::StrCat("\"loadBalancingConfig\": [{\"", options.load_balancing, "\": {}}]"));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

absl::StatusOr<std::string> MultiAddressTarget(const std::vector<std::string>& addresses) {
  if (addresses.empty()) return absl::InvalidArgumentError("addresses must not be empty");
  if (addresses.size() == 1) return addresses[0];
  bool all_v4 = true, all_v6 = true;
  for (const std::string& a : addresses) {
    all_v4 = all_v4 && IsIpv4Literal(a);
    all_v6 = all_v6 && IsIpv6Literal(a);
  }
  if (all_v4) return absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  if (all_v6) return absl::StrCat("ipv6:", absl::StrJoin(addresses, ","));
  return absl::InvalidArgumentError(absl::StrCat(
      "addresses must all be IPv4 or all IPv6 literals with ports (use a dns:/// target for "
      "host names); were ",
      absl::StrJoin(addresses, ",")));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                       const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target must not be empty");
  if (options.channels < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be at least 1; was ", options.channels));
  }
  if (options.retry.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry.max_attempts must be at least 1; was ", options.retry.max_attempts));
  }
  if (absl::Status s = ValidateThrottleOptions(options.throttle); !s.ok()) return s;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < options.channels; ++i) channels.push_back(MakeChannel(target, options, i));
  return std::unique_ptr<Client>(new Client(std::move(channels), options));
}

absl::StatusOr<std::unique_ptr<Client>> Client::CreateBalanced(
    const std::vector<std::string>& addresses, ClientOptions options) {
  absl::StatusOr<std::string> target = MultiAddressTarget(addresses);
  if (!target.ok()) return target.status();
  if (options.load_balancing.empty()) options.load_balancing = "round_robin";
  absl::StatusOr<std::unique_ptr<Client>> client = Create(*target, options);
  if (!client.ok() || addresses.size() < 2) return client;
  // Sessions are routed by hand (the id names its replica), over a channel per address.
  ClientOptions single = options;
  single.load_balancing.clear();
  for (const std::string& address : addresses) {
    (*client)->replica_addresses_.push_back(address);
    (*client)->replica_channels_.push_back(MakeChannel(address, single, 0));
    (*client)->replica_stubs_.push_back(
        v1::AttentionService::NewStub((*client)->replica_channels_.back()));
  }
  return client;
}

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : Client(std::vector<std::shared_ptr<grpc::Channel>>{std::move(channel)}, options) {}

Client::Client(std::vector<std::shared_ptr<grpc::Channel>> channels, const ClientOptions& options)
    : channels_(std::move(channels)),
      options_(options),
      throttle_status_(ValidateThrottleOptions(options.throttle)) {
  for (const auto& c : channels_) stubs_.push_back(v1::AttentionService::NewStub(c));
  if (throttle_status_.ok() && options_.throttle.enabled) {
    throttle_ = *Throttle::Create(options_.throttle);
  }
}

absl::Status Client::Admit() {
  if (!throttle_status_.ok()) return throttle_status_;
  if (throttle_ == nullptr) return absl::OkStatus();
  if (std::optional<std::string> why = throttle_->Check()) return absl::UnavailableError(*why);
  return absl::OkStatus();
}

void Client::Record(const grpc::ClientContext& context, const grpc::Status& status) {
  if (throttle_ == nullptr) return;
  // A session being moved is no sign of overload: the server took and judged the call (its
  // pushback is for that session's retry, not for every call of this client).
  if (IsMovingAnswer(status)) {
    throttle_->Record(absl::StatusCode::kOk);
    return;
  }
  std::string_view pushback;
  if (!status.ok()) {
    const auto& trailers = context.GetServerTrailingMetadata();
    if (auto it = trailers.find(kPushbackKey); it != trailers.end()) {
      pushback = std::string_view(it->second.data(), it->second.size());
    }
  }
  throttle_->Record(static_cast<absl::StatusCode>(status.error_code()), pushback);
}

Client::~Client() {
  std::vector<std::shared_ptr<PendingCall>> in_flight;
  {
    MutexLock lock(&calls_mu_);
    for (const auto& [raw, call] : calls_) in_flight.push_back(call);
  }
  // Outside the lock: a cancelled call's callback may run before TryCancel returns. The
  // references keep every context alive until it has been told.
  for (const auto& call : in_flight) call->context.TryCancel();
  in_flight.clear();
  MutexLock lock(&calls_mu_);
  while (unfinished_calls_ != 0) calls_finished_.Wait(&calls_mu_);
}

void Client::Start(std::shared_ptr<PendingCall> call) {
  MutexLock lock(&calls_mu_);
  PendingCall* raw = call.get();
  calls_.emplace(raw, std::move(call));
  ++unfinished_calls_;
}

void Client::Finish(PendingCall* call) {
  std::shared_ptr<PendingCall> owned;
  {
    MutexLock lock(&calls_mu_);
    auto it = calls_.find(call);
    owned = std::move(it->second);
    calls_.erase(it);
  }
  // The context, and with it this call's channel reference, goes here (or in ~Client if it
  // holds the call for a moment): never after the destructor may have released the channels.
  owned.reset();
  MutexLock lock(&calls_mu_);
  if (--unfinished_calls_ == 0) calls_finished_.NotifyAll();
}

v1::AttentionService::Stub& Client::NextStub() {
  if (stubs_.size() == 1) return *stubs_[0];
  return *stubs_[next_stub_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()];
}

void Client::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  if (timeout <= absl::ZeroDuration()) timeout = options_.timeout;
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout));
  }
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.auth_token);
  }
}

// `throttled`: the call passes the throttle (Admit) and its answer is counted (Record).
template <typename Request, typename Response>
absl::StatusOr<Response> Client::UnaryCall(const Request& request, absl::Duration timeout,
                                           bool throttled,
                                           grpc::Status (v1::AttentionService::Stub::*rpc)(
                                               grpc::ClientContext*, const Request&, Response*)) {
  if (throttled) {
    if (absl::Status s = Admit(); !s.ok()) return s;
  }
  grpc::ClientContext context;
  Prepare(&context, timeout);
  Response response;
  grpc::Status status = (NextStub().*rpc)(&context, request, &response);
  if (throttled) Record(context, status);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

#define ATTNSERVE_CLIENT_METHOD(Rpc, throttled)                                      \
  absl::StatusOr<v1::Rpc##Response> Client::Rpc(const v1::Rpc##Request& request,     \
                                                absl::Duration timeout) {            \
    return UnaryCall(request, timeout, throttled, &v1::AttentionService::Stub::Rpc); \
  }
ATTNSERVE_CLIENT_METHOD(Attend, true)
ATTNSERVE_CLIENT_METHOD(MultiHeadAttention, true)
ATTNSERVE_CLIENT_METHOD(LoadModule, false)
ATTNSERVE_CLIENT_METHOD(UnloadModule, false)
#undef ATTNSERVE_CLIENT_METHOD

absl::StatusOr<v1::ListModulesResponse> Client::ListModules(absl::Duration timeout) {
  return UnaryCall(v1::ListModulesRequest(), timeout, false,
                   &v1::AttentionService::Stub::ListModules);
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo(absl::Duration timeout) {
  return UnaryCall(v1::GetServerInfoRequest(), timeout, false,
                   &v1::AttentionService::Stub::GetServerInfo);
}

#define ATTNSERVE_CLIENT_ASYNC(Rpc)                                                                \
  void Client::Rpc##Async(const v1::Rpc##Request& request, Callback<v1::Rpc##Response> done,       \
                          absl::Duration timeout) {                                                \
    Rpc##Async(std::make_shared<const v1::Rpc##Request>(request), std::move(done), timeout);       \
  }                                                                                                \
  void Client::Rpc##Async(std::shared_ptr<const v1::Rpc##Request> request,                         \
                          Callback<v1::Rpc##Response> done, absl::Duration timeout) {              \
    if (absl::Status s = Admit(); !s.ok()) {                                                       \
      done(s);                                                                                     \
      return;                                                                                      \
    }                                                                                              \
    auto owned = std::make_shared<AsyncCall<v1::Rpc##Request, v1::Rpc##Response>>();               \
    auto* call = owned.get();                                                                      \
    call->request = std::move(request);                                                            \
    call->done = std::move(done);                                                                  \
    Prepare(&call->context, timeout);                                                              \
    Start(std::move(owned));                                                                       \
    NextStub().async()->Rpc(&call->context, call->request.get(), &call->response,                  \
                            [this, call](grpc::Status s) {                                         \
                              Record(call->context, s);                                            \
                              call->Deliver(s);                                                    \
                              Finish(call);                                                        \
                            });                                                                    \
  }                                                                                                \
  std::future<absl::StatusOr<v1::Rpc##Response>> Client::Rpc##Async(                               \
      const v1::Rpc##Request& request, absl::Duration timeout) {                                   \
    return ToFuture<v1::Rpc##Response>(                                                            \
        [&](Callback<v1::Rpc##Response> done) { Rpc##Async(request, std::move(done), timeout); }); \
  }
ATTNSERVE_CLIENT_ASYNC(Attend)
ATTNSERVE_CLIENT_ASYNC(MultiHeadAttention)
#undef ATTNSERVE_CLIENT_ASYNC

void Client::GetServerInfoAsync(Callback<v1::GetServerInfoResponse> done, absl::Duration timeout) {
  auto owned = std::make_shared<AsyncCall<v1::GetServerInfoRequest, v1::GetServerInfoResponse>>();
  auto* call = owned.get();
  call->request = std::make_shared<const v1::GetServerInfoRequest>();
  call->done = std::move(done);
  Prepare(&call->context, timeout);
  Start(std::move(owned));
  NextStub().async()->GetServerInfo(&call->context, call->request.get(), &call->response,
                                    [this, call](grpc::Status s) {
                                      call->Deliver(s);
                                      Finish(call);
                                    });
}

std::unique_ptr<AttentionStream> Client::OpenStream(
    std::function<void(v1::AttentionStreamResponse)> on_response, absl::Duration timeout) {
  std::unique_ptr<AttentionStream> stream(new AttentionStream(std::move(on_response)));
  Prepare(&stream->context_, timeout <= absl::ZeroDuration() ? absl::InfiniteDuration() : timeout);
  stream->Start(NextStub());
  return stream;
}

// --- Decode sessions ---

std::vector<std::string> Client::replicas() const { return replica_addresses_; }

absl::StatusOr<v1::AttentionService::Stub*> Client::SessionStub(const std::string& session_id) {
  if (replica_stubs_.empty()) return &NextStub();  // the server judges the id
  absl::StatusOr<std::string> owner = SessionOwner(session_id);
  if (!owner.ok()) return owner.status();
  for (size_t i = 0; i < replica_addresses_.size(); ++i) {
    if (replica_addresses_[i] == *owner) return replica_stubs_[i].get();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "session_id '", session_id, "' names owner '", *owner,
      "', which is none of this client's addresses (", absl::StrJoin(replica_addresses_, ", "),
      "); start each replica with its owner set to the address clients reach it by"));
}

std::pair<v1::AttentionService::Stub*, std::string> Client::NextReplica() {
  if (replica_stubs_.empty()) return {&NextStub(), ""};
  const size_t i = next_replica_.fetch_add(1, std::memory_order_relaxed) % replica_stubs_.size();
  return {replica_stubs_[i].get(), replica_addresses_[i]};
}

absl::StatusOr<v1::CreateSessionResponse> Client::CreateSession(
    const v1::CreateSessionRequest& request, absl::Duration timeout) {
  auto [stub, address] = NextReplica();
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::CreateSessionResponse response;
  grpc::Status status = stub->CreateSession(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  if (address.empty()) return response;
  const std::string& id = response.session().session_id();
  absl::StatusOr<std::string> owner = SessionOwner(id);
  if (owner.ok() && *owner == address) return response;
  // Later calls could not find this session: give it back and say why.
  grpc::ClientContext close_context;
  Prepare(&close_context, timeout);
  v1::CloseSessionRequest close;
  close.set_session_id(id);
  v1::CloseSessionResponse closed;
  stub->CloseSession(&close_context, close, &closed).ok();
  return absl::InvalidArgumentError(absl::StrCat(
      "the replica at ", address, " issued session_id '", id,
      "', whose owner is not that address; start each replica with its owner set to the "
      "address clients reach it by"));
}

// --- Moved sessions ---

namespace {

// Hops a call follows (a session moved on while the call followed it is rare; a loop of
// moves is a server's bug).
constexpr int kMaxHops = 8;
// A call to a session being moved waits and is sent again, within its deadline; at most this
// many times (a move takes milliseconds; without a deadline, a bound all the same).
constexpr int kMaxMovingWaits = 1000;
// The moves remembered (old id -> new id); beyond it the client forgets them all and learns
// again from the servers, which remember them too.
constexpr size_t kMaxMovesRemembered = 65536;

std::string Trailer(const grpc::ClientContext& context, const std::string& key) {
  const auto& metadata = context.GetServerTrailingMetadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

// Whether a call that ended with `status` found its replica unreachable or shutting down:
// UNAVAILABLE without a pushback (an overload refusal has one), or CANCELLED (gRPC cancels the
// calls that reach a server as it shuts down, grpc#41785).
bool Unreachable(const grpc::ClientContext& context, const grpc::Status& status) {
  return (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          status.error_code() == grpc::StatusCode::CANCELLED) &&
         Trailer(context, "grpc-retry-pushback-ms").empty();
}

bool IsMoving(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StrContains(status.message(), "' is moving to another replica");
}

// How long to wait before sending a call to a moving session again: the server's pushback and
// a millisecond (the throttle holds throttled calls back for the pushback itself: the call
// must come after), within the deadline.
absl::Duration MovingWait(const grpc::ClientContext& context, absl::Time deadline) {
  int64_t ms = 20;
  if (const std::string pushback = Trailer(context, "grpc-retry-pushback-ms"); !pushback.empty()) {
    ms = std::clamp<int64_t>(std::atoll(pushback.c_str()), 1, 1000);
  }
  return std::min(absl::Milliseconds(ms + 1),
                  std::max(deadline - absl::Now(), absl::ZeroDuration()));
}

absl::Time DeadlineOf(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

absl::Duration Remaining(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return absl::InfiniteDuration();
  return std::max(deadline - absl::Now(), absl::Nanoseconds(1));
}

}  // namespace

std::string Client::Resolve(const std::string& id) const {
  MutexLock lock(&moved_mu_);
  std::string at = id;
  for (int hop = 0; hop < kMaxHops; ++hop) {
    auto it = moved_.find(at);
    if (it == moved_.end()) break;
    at = it->second;
  }
  return at;
}

void Client::RememberMove(const std::string& from, const std::string& to) {
  MutexLock lock(&moved_mu_);
  if (moved_.size() >= kMaxMovesRemembered) moved_.clear();
  moved_[from] = to;
}

std::string Client::FindMoved(const std::string& id, absl::Time deadline) {
  absl::StatusOr<std::string> owner = SessionOwner(id);
  // The new id replica i answers for `id` ("" if none); an unreachable replica is noted.
  std::vector<size_t> unreachable;
  const auto ask = [&](size_t i, bool wait_for_ready) {
    grpc::ClientContext context;
    Prepare(&context, std::min(Remaining(deadline), absl::Seconds(2)));
    context.set_wait_for_ready(wait_for_ready);
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::GetSessionResponse response;
    const grpc::Status status = replica_stubs_[i]->GetSession(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) unreachable.push_back(i);
    return Trailer(context, "attnserve-session-moved");
  };
  for (size_t i = 0; i < replica_addresses_.size(); ++i) {
    if (owner.ok() && replica_addresses_[i] == *owner) continue;
    if (std::string to = ask(i, false); !to.empty()) return to;
  }
  // A replica that could not be reached is asked again once, its channel told to connect at
  // once: it may be backing off from a process that stopped, while a new one now listens at
  // its address. Waiting for the channel (up to 2 s) lets the new connection be made.
  for (const size_t i : std::vector<size_t>(std::move(unreachable))) {
    grpc::experimental::ChannelResetConnectionBackoff(replica_channels_[i].get());
    if (std::string to = ask(i, true); !to.empty()) return to;
  }
  return "";
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::SessionCall(Request request, absl::Duration timeout,
                                             bool throttled, bool resend,
                                             grpc::Status (v1::AttentionService::Stub::*rpc)(
                                                 grpc::ClientContext*, const Request&, Response*)) {
  const absl::Time deadline =
      DeadlineOf(timeout <= absl::ZeroDuration() ? options_.timeout : timeout);
  request.set_session_id(Resolve(request.session_id()));
  bool asked_others = false;
  bool vouched = false;  // a replica said the session is on the one asked now
  int moves = 0, waits = 0;
  for (;;) {
    absl::StatusOr<v1::AttentionService::Stub*> stub = SessionStub(request.session_id());
    if (!stub.ok()) return stub.status();
    // Judged once: the attempts after a move followed are the same call of the application's.
    if (throttled && moves == 0 && waits == 0 && !asked_others) {
      if (absl::Status s = Admit(); !s.ok()) return s;
    }
    grpc::ClientContext context;
    Prepare(&context, Remaining(deadline));
    // It is up: wait for a channel still backing off from the last process at its address.
    if (vouched) context.set_wait_for_ready(true);
    Response response;
    const grpc::Status status = ((**stub).*rpc)(&context, request, &response);
    if (throttled) Record(context, status);
    if (status.ok()) return response;
    const absl::Status s = FromGrpc(status);
    if (absl::Now() >= deadline) return s;
    if (std::string to = Trailer(context, "attnserve-session-moved"); !to.empty()) {
      if (moves++ == kMaxHops) return s;
      RememberMove(request.session_id(), to);
      request.set_session_id(to);
      vouched = true;
      continue;
    }
    if (IsMoving(s)) {
      if (waits++ == kMaxMovingWaits) return s;
      absl::SleepFor(MovingWait(context, deadline));
      continue;
    }
    // Its replica unreachable (or shutting down), or a new process at its address that never
    // held it ("session lost (restarted)": nothing was done, so the call may be sent again):
    // did the session move to another replica before?
    // (CANCELLED: gRPC cancels the calls that reach a server as it shuts down, grpc#41785.)
    const bool unreachable = Unreachable(context, status);
    const bool restarted = SessionLostReason(s) == "restarted";
    if ((unreachable || restarted) && !asked_others && replica_addresses_.size() > 1) {
      asked_others = true;
      if (std::string to = FindMoved(request.session_id(), deadline); !to.empty()) {
        RememberMove(request.session_id(), to);
        if (resend || restarted) {
          request.set_session_id(to);
          vouched = true;
          continue;
        }
      }
    }
    return s;
  }
}

absl::StatusOr<v1::ExtendSessionResponse> Client::ExtendSession(
    const v1::ExtendSessionRequest& request, absl::Duration timeout) {
  return SessionCall(request, timeout, /*throttled=*/true,
                     /*resend=*/request.has_expected_length(),
                     &v1::AttentionService::Stub::ExtendSession);
}

absl::StatusOr<v1::ForkSessionResponse> Client::ForkSession(const v1::ForkSessionRequest& request,
                                                            absl::Duration timeout) {
  return SessionCall(request, timeout, /*throttled=*/false, /*resend=*/false,
                     &v1::AttentionService::Stub::ForkSession);
}

absl::StatusOr<v1::CloseSessionResponse> Client::CloseSession(
    const v1::CloseSessionRequest& request, absl::Duration timeout) {
  return SessionCall(request, timeout, /*throttled=*/false, /*resend=*/true,
                     &v1::AttentionService::Stub::CloseSession);
}

absl::StatusOr<v1::MoveSessionResponse> Client::MoveSession(const v1::MoveSessionRequest& request,
                                                            absl::Duration timeout) {
  absl::StatusOr<v1::MoveSessionResponse> moved =
      SessionCall(request, timeout, /*throttled=*/false, /*resend=*/false,
                  &v1::AttentionService::Stub::MoveSession);
  if (moved.ok()) RememberMove(Resolve(request.session_id()), moved->session_id());
  return moved;
}

absl::StatusOr<v1::GetSessionResponse> Client::GetSession(const v1::GetSessionRequest& request,
                                                          absl::Duration timeout) {
  return SessionCall(request, timeout, /*throttled=*/false, /*resend=*/true,
                     &v1::AttentionService::Stub::GetSession);
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions(
    const v1::ListSessionsRequest& request, const std::string& replica, absl::Duration timeout) {
  v1::AttentionService::Stub* stub = nullptr;
  if (replica.empty()) {
    stub = NextReplica().first;
  } else {
    for (size_t i = 0; i < replica_addresses_.size(); ++i) {
      if (replica_addresses_[i] == replica) stub = replica_stubs_[i].get();
    }
    if (stub == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("replica '", replica,
                                                     "' is none of this client's addresses (",
                                                     absl::StrJoin(replica_addresses_, ", "), ")"));
    }
  }
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::ListSessionsResponse response;
  grpc::Status status = stub->ListSessions(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::ExtendSessionsResponse> Client::ExtendSessions(
    const v1::ExtendSessionsRequest& request, absl::Duration timeout) {
  const absl::Time deadline =
      DeadlineOf(timeout <= absl::ZeroDuration() ? options_.timeout : timeout);
  v1::ExtendSessionsRequest resolved = request;
  for (v1::ExtendSessionRequest& step : *resolved.mutable_steps()) {
    step.set_session_id(Resolve(step.session_id()));
  }
  std::vector<char> unreachable;
  absl::Status whole;  // the one replica's call failed as a whole
  absl::StatusOr<v1::ExtendSessionsResponse> response =
      ExtendSessionsOnce(resolved, Remaining(deadline), /*admit=*/true, &unreachable, &whole);
  if (!response.ok()) return response;
  bool sent_again = false;
  std::set<std::string> asked;  // sessions looked for on the other replicas
  // Steps whose session moved (sent again under its new id), is moving (again, after a pause)
  // or, its replica unreachable or restarted, was found on another replica (as SessionCall
  // does for one session), until none is left or the deadline passes.
  for (int round = 0; round < kMaxHops + kMaxMovingWaits && absl::Now() < deadline; ++round) {
    std::vector<int> again;
    bool moving = false;
    v1::ExtendSessionsRequest retry;
    for (int i = 0; i < response->results_size() && i < resolved.steps_size(); ++i) {
      const v1::ExtendSessionResult& r = response->results(i);
      const absl::Status s(static_cast<absl::StatusCode>(r.code()), r.message());
      v1::ExtendSessionRequest* step = resolved.mutable_steps(i);
      const bool restarted = SessionLostReason(s) == "restarted";
      if (!r.moved_to().empty()) {
        RememberMove(step->session_id(), r.moved_to());
        step->set_session_id(r.moved_to());
      } else if (IsMoving(s)) {
        moving = true;
      } else if ((unreachable[i] || restarted) && replica_addresses_.size() > 1 &&
                 asked.insert(step->session_id()).second) {
        std::string to = FindMoved(step->session_id(), deadline);
        if (to.empty()) continue;
        RememberMove(step->session_id(), to);
        // Sent again when nothing was done, or its expected_length guards a repeat.
        if (!restarted && !step->has_expected_length()) continue;
        step->set_session_id(std::move(to));
      } else {
        continue;
      }
      again.push_back(i);
      *retry.add_steps() = *step;
    }
    if (again.empty()) break;
    if (moving) absl::SleepFor(std::min(absl::Milliseconds(21), deadline - absl::Now()));
    std::vector<char> more_unreachable;
    absl::StatusOr<v1::ExtendSessionsResponse> more =
        ExtendSessionsOnce(retry, Remaining(deadline), /*admit=*/false, &more_unreachable, nullptr);
    if (!more.ok()) break;  // the first answer stands for these steps
    sent_again = true;
    for (size_t j = 0; j < again.size() && static_cast<int>(j) < more->results_size(); ++j) {
      *response->mutable_results(again[j]) = std::move(*more->mutable_results(static_cast<int>(j)));
      unreachable[again[j]] = more_unreachable[j];
    }
  }
  // One replica's call failed and none of its steps was found elsewhere: its error.
  if (!whole.ok() && !sent_again) return whole;
  return response;
}

absl::StatusOr<v1::ExtendSessionsResponse> Client::ExtendSessionsOnce(
    const v1::ExtendSessionsRequest& request, absl::Duration timeout, bool admit,
    std::vector<char>* unreachable, absl::Status* whole) {
  // Group the steps by the stub of their replica, keeping each step's index.
  struct Group {
    v1::AttentionService::Stub* stub;
    std::vector<int> indices;
    v1::ExtendSessionsRequest request;
    v1::ExtendSessionsResponse response;
    grpc::ClientContext context;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Group>> groups;
  for (int i = 0; i < request.steps_size(); ++i) {
    absl::StatusOr<v1::AttentionService::Stub*> stub = SessionStub(request.steps(i).session_id());
    if (!stub.ok()) return stub.status();
    Group* group = nullptr;
    for (auto& g : groups) {
      if (g->stub == *stub) group = g.get();
    }
    if (group == nullptr) {
      groups.push_back(std::make_unique<Group>());
      group = groups.back().get();
      group->stub = *stub;
    }
    group->indices.push_back(i);
    *group->request.add_steps() = request.steps(i);
  }
  if (admit) {
    if (absl::Status s = Admit(); !s.ok()) return s;
  }
  if (groups.empty()) {  // no steps: the server answers INVALID_ARGUMENT
    grpc::ClientContext context;
    Prepare(&context, timeout);
    v1::ExtendSessionsResponse response;
    grpc::Status status = NextStub().ExtendSessions(&context, request, &response);
    Record(context, status);
    if (!status.ok()) return FromGrpc(status);
    return response;
  }
  // The replicas' calls run at once; each answer is counted by the throttle.
  Mutex mu;
  CondVar cv;
  size_t pending = groups.size();
  for (auto& g : groups) {
    Group* group = g.get();
    Prepare(&group->context, timeout);
    group->stub->async()->ExtendSessions(&group->context, &group->request, &group->response,
                                         [&, group](grpc::Status s) {
                                           Record(group->context, s);
                                           MutexLock lock(&mu);
                                           group->status = std::move(s);
                                           if (--pending == 0) cv.NotifyAll();
                                         });
  }
  {
    MutexLock lock(&mu);
    while (pending != 0) cv.Wait(&mu);
  }
  if (groups.size() == 1 && !groups[0]->status.ok() && whole != nullptr) {
    *whole = FromGrpc(groups[0]->status);
  }
  unreachable->assign(static_cast<size_t>(request.steps_size()), 0);
  v1::ExtendSessionsResponse merged;
  for (int i = 0; i < request.steps_size(); ++i) merged.add_results();
  for (auto& g : groups) {
    const bool down = Unreachable(g->context, g->status);
    for (size_t j = 0; j < g->indices.size(); ++j) {
      v1::ExtendSessionResult* result = merged.mutable_results(g->indices[j]);
      (*unreachable)[static_cast<size_t>(g->indices[j])] = down;
      if (!g->status.ok()) {
        result->set_code(g->status.error_code());
        result->set_message(g->status.error_message());
      } else if (static_cast<int>(j) < g->response.results_size()) {
        *result = std::move(*g->response.mutable_results(j));
      } else {
        result->set_code(static_cast<int>(absl::StatusCode::kInternal));
        result->set_message("the replica answered fewer results than steps");
      }
    }
  }
  return merged;
}

void Client::ExtendSessionAsync(std::shared_ptr<const v1::ExtendSessionRequest> request,
                                Callback<v1::ExtendSessionResponse> done, absl::Duration timeout) {
  if (std::string id = Resolve(request->session_id()); id != request->session_id()) {
    auto resolved = std::make_shared<v1::ExtendSessionRequest>(*request);
    resolved->set_session_id(std::move(id));
    request = std::move(resolved);
  }
  absl::StatusOr<v1::AttentionService::Stub*> stub = SessionStub(request->session_id());
  if (!stub.ok()) {
    done(stub.status());
    return;
  }
  if (absl::Status s = Admit(); !s.ok()) {
    done(s);
    return;
  }
  auto owned = std::make_shared<AsyncCall<v1::ExtendSessionRequest, v1::ExtendSessionResponse>>();
  auto* call = owned.get();
  call->request = std::move(request);
  call->done = std::move(done);
  Prepare(&call->context, timeout);
  Start(std::move(owned));
  (*stub)->async()->ExtendSession(
      &call->context, call->request.get(), &call->response, [this, call, timeout](grpc::Status s) {
        Record(call->context, s);
        if (std::string to = Trailer(call->context, "attnserve-session-moved"); !to.empty()) {
          // Sent again under the new id (a call of its own, started before this one finishes).
          RememberMove(call->request->session_id(), to);
          auto moved = std::make_shared<v1::ExtendSessionRequest>(*call->request);
          moved->set_session_id(to);
          ExtendSessionAsync(std::move(moved), std::move(call->done), timeout);
        } else {
          call->Deliver(s);
        }
        Finish(call);
      });
}

absl::StatusOr<std::unique_ptr<AttentionStream>> Client::OpenStreamForSession(
    const std::string& session_id, std::function<void(v1::AttentionStreamResponse)> on_response,
    absl::Duration timeout) {
  absl::StatusOr<v1::AttentionService::Stub*> stub = SessionStub(Resolve(session_id));
  if (!stub.ok()) return stub.status();
  std::unique_ptr<AttentionStream> stream(new AttentionStream(std::move(on_response)));
  Prepare(&stream->context_, timeout <= absl::ZeroDuration() ? absl::InfiniteDuration() : timeout);
  stream->Start(**stub);
  return stream;
}

absl::StatusOr<std::string> SessionOwner(const std::string& session_id) {
  const size_t last = session_id.rfind('/');
  const size_t second =
      last == std::string::npos || last == 0 ? std::string::npos : session_id.rfind('/', last - 1);
  if (second == std::string::npos || second == 0 || last == second + 1 ||
      last + 1 == session_id.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id must be \"<owner>/<instance>/<key>\"; was '", session_id, "'"));
  }
  return session_id.substr(0, second);
}

bool IsSessionMoved(const absl::Status& status) { return !SessionMovedTo(status).empty(); }

std::string SessionMovedTo(const absl::Status& status) { return MovedSessionId(status); }

bool IsSessionLost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StartsWith(status.message(), kSessionLostPrefix);
}

std::string SessionLostReason(const absl::Status& status) { return LostSessionReason(status); }

std::optional<v1::FeatureMap> FeatureMapNamed(absl::string_view name) {
  constexpr std::pair<absl::string_view, v1::FeatureMap> kMaps[] = {
      {"elu_plus_one", v1::FEATURE_MAP_ELU_PLUS_ONE},
      {"relu", v1::FEATURE_MAP_RELU},
      {"identity", v1::FEATURE_MAP_IDENTITY}};
  for (const auto& [map_name, map] : kMaps) {
    if (name == map_name) return map;
  }
  return std::nullopt;
}

v1::Tensor MakeTensor(v1::Dtype dtype, const std::vector<int64_t>& shape,
                      const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  const codec::FloatFormat format = FloatFormatOf(dtype).value();
  std::string* data = t.mutable_data();
  data->resize(values.size() * codec::FormatSize(format));
  codec::Pack(format, values.data(), values.size(), data->data());
  return t;
}

v1::Tensor MakeMask(const std::vector<int64_t>& shape, const std::vector<uint8_t>& values) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_BOOL);
  for (int64_t d : shape) t.add_shape(d);
  std::string* data = t.mutable_data();
  data->reserve(values.size());
  for (uint8_t v : values) data->push_back(v != 0 ? 1 : 0);
  return t;
}

absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor) {
  auto format = FloatFormatOf(tensor.dtype());
  if (!format.ok()) return format.status();
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  const size_t want = static_cast<size_t>(n) * codec::FormatSize(*format);
  if (tensor.data().size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor data holds ", tensor.data().size(), " bytes; its shape needs ", want));
  }
  std::vector<float> out(n);
  codec::Unpack(*format, tensor.data().data(), n, out.data());
  return out;
}

}  // namespace attnserve
