#include "client/session.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

int64_t NewTokens(const v1::ExtendSessionRequest& request) {
  const v1::Tensor& t = request.has_input() ? request.input() : request.query();
  return t.shape_size() > 0 ? t.shape(0) : 0;
}

}  // namespace

namespace {

// What CreateRaw and CreateForModule ask for besides the binding.
void SetOptions(const SessionOptions& options, v1::CreateSessionRequest* request) {
  request->set_cache_dtype(options.cache_dtype);
  if (options.scale.has_value()) request->set_scale(*options.scale);
  request->set_pinned(options.pinned);
  request->set_idle_ttl_us(absl::ToInt64Microseconds(options.idle_ttl));
  if (options.window_left >= 0) {
    request->mutable_window()->set_left(options.window_left);
    request->mutable_window()->set_right(0);
  }
  request->set_softcap(options.softcap);
  if (options.alibi_standard) request->mutable_alibi()->set_standard(true);
  for (float slope : options.alibi_slopes) request->mutable_alibi()->add_slopes(slope);
  request->set_kind(options.kind);
  request->set_feature_map(options.feature_map);
}

}  // namespace

absl::StatusOr<Session> Session::CreateRaw(Client* client, const HeadLayout& layout,
                                           const SessionOptions& options) {
  v1::CreateSessionRequest request;
  v1::HeadLayout* l = request.mutable_layout();
  l->set_num_heads(layout.num_heads);
  l->set_num_kv_heads(layout.num_kv_heads > 0 ? layout.num_kv_heads : layout.num_heads);
  l->set_head_dim(layout.head_dim);
  l->set_v_head_dim(layout.v_head_dim);
  SetOptions(options, &request);
  return Create(client, request, options.timeout);
}

absl::StatusOr<Session> Session::CreateForModule(Client* client, const std::string& module,
                                                 const SessionOptions& options) {
  v1::CreateSessionRequest request;
  request.set_module(module);
  SetOptions(options, &request);
  return Create(client, request, options.timeout);
}

absl::StatusOr<Session> Session::Create(Client* client, const v1::CreateSessionRequest& request,
                                        absl::Duration timeout) {
  absl::StatusOr<v1::CreateSessionResponse> response = client->CreateSession(request, timeout);
  if (!response.ok()) return response.status();
  return Session(client, std::move(*response->mutable_session()), timeout);
}

Session::Session(Session&& other) noexcept
    : client_(std::exchange(other.client_, nullptr)),
      info_(std::move(other.info_)),
      timeout_(other.timeout_) {}

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    if (client_ != nullptr) Close().IgnoreError();
    client_ = std::exchange(other.client_, nullptr);
    info_ = std::move(other.info_);
    timeout_ = other.timeout_;
  }
  return *this;
}

Session::~Session() {
  if (client_ != nullptr) Close().IgnoreError();
}

v1::ExtendSessionRequest Session::Prepare(v1::ExtendSessionRequest request) const {
  request.set_session_id(id());
  if (!request.has_expected_length()) request.set_expected_length(length());
  return request;
}

void Session::Applied(const v1::ExtendSessionResponse& response) {
  info_.set_length(response.length());
  // The id the session has now: another one once it moved to another replica (the Client
  // followed the move).
  if (!response.session_id().empty()) info_.set_session_id(response.session_id());
}

absl::StatusOr<v1::ExtendSessionResponse> Session::Extend(const v1::Tensor& query,
                                                          const v1::Tensor& key,
                                                          const v1::Tensor& value,
                                                          bool return_lse) {
  v1::ExtendSessionRequest request;
  *request.mutable_query() = query;
  *request.mutable_key() = key;
  *request.mutable_value() = value;
  request.set_return_lse(return_lse);
  return Extend(std::move(request));
}

absl::StatusOr<v1::ExtendSessionResponse> Session::Extend(const v1::Tensor& input,
                                                          bool return_lse) {
  v1::ExtendSessionRequest request;
  *request.mutable_input() = input;
  request.set_return_lse(return_lse);
  return Extend(std::move(request));
}

absl::StatusOr<v1::ExtendSessionResponse> Session::Extend(v1::ExtendSessionRequest request) {
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id(), " was closed or released by this object"));
  }
  request = Prepare(std::move(request));
  absl::StatusOr<v1::ExtendSessionResponse> response = client_->ExtendSession(request, timeout_);
  if (response.ok()) {
    Applied(*response);
    return response;
  }
  if (response.status().code() != absl::StatusCode::kAborted) return response.status();
  // ABORTED: another extend is in flight, or the length differs from the expected one, which
  // is what a retried extend sees when its first attempt was applied and its answer lost.
  absl::StatusOr<v1::SessionInfo> now = Describe();
  if (now.ok() && now->length() == request.expected_length() + NewTokens(request)) {
    return absl::AbortedError(absl::StrCat("the extend of session ", id(),
                                           " was applied by an earlier attempt whose response was "
                                           "lost; the session now holds ",
                                           now->length(), " tokens (", response.status().message(),
                                           ")"));
  }
  return response.status();
}

absl::StatusOr<Session> Session::Fork(bool pinned, absl::Duration idle_ttl) {
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id(), " was closed or released by this object"));
  }
  v1::ForkSessionRequest request;
  request.set_session_id(id());
  request.set_pinned(pinned);
  request.set_idle_ttl_us(absl::ToInt64Microseconds(idle_ttl));
  absl::StatusOr<v1::ForkSessionResponse> response = client_->ForkSession(request, timeout_);
  if (!response.ok()) return response.status();
  return Session(client_, std::move(*response->mutable_session()), timeout_);
}

absl::StatusOr<v1::SessionInfo> Session::Describe() {
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id(), " was closed or released by this object"));
  }
  v1::GetSessionRequest request;
  request.set_session_id(id());
  absl::StatusOr<v1::GetSessionResponse> response = client_->GetSession(request, timeout_);
  if (!response.ok()) return response.status();
  info_ = response->session();
  return info_;
}

absl::Status Session::Close() {
  if (client_ == nullptr) return absl::OkStatus();
  Client* client = std::exchange(client_, nullptr);
  v1::CloseSessionRequest request;
  request.set_session_id(id());
  return client->CloseSession(request, timeout_).status();
}

std::string Session::Release() {
  client_ = nullptr;
  return id();
}

absl::StatusOr<std::vector<absl::StatusOr<v1::ExtendSessionResponse>>> ExtendSessions(
    Client* client, const std::vector<std::pair<Session*, v1::ExtendSessionRequest>>& steps,
    absl::Duration timeout) {
  if (steps.empty()) return absl::InvalidArgumentError("steps must not be empty");
  v1::ExtendSessionsRequest request;
  std::set<std::string> seen;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Session& session = *steps[i].first;
    if (!seen.insert(session.id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps[", i, "] names session ", session.id(), " a second time"));
    }
    *request.add_steps() = session.Prepare(steps[i].second);
  }
  absl::StatusOr<v1::ExtendSessionsResponse> response = client->ExtendSessions(request, timeout);
  if (!response.ok()) return response.status();
  if (response->results_size() != static_cast<int>(steps.size())) {
    return absl::InternalError(absl::StrCat("ExtendSessions answered ", response->results_size(),
                                            " results for ", steps.size(), " steps"));
  }
  std::vector<absl::StatusOr<v1::ExtendSessionResponse>> results;
  results.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    v1::ExtendSessionResult* r = response->mutable_results(static_cast<int>(i));
    if (r->code() == 0) {
      steps[i].first->Applied(r->response());
      results.push_back(std::move(*r->mutable_response()));
    } else {
      results.push_back(absl::Status(static_cast<absl::StatusCode>(r->code()), r->message()));
    }
  }
  return results;
}

}  // namespace attnserve
