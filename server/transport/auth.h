// Who may call: the server's authorisation of a call, from its metadata (bearer tokens; mutual
// TLS is checked by gRPC itself, before any handler runs).
#ifndef ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
#define ATTNSERVE_SERVER_TRANSPORT_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"

namespace attnserve::server {

// OK, or UNAUTHENTICATED when `auth_token` is set and the call does not carry it.
absl::Status Authorize(const grpc::CallbackServerContext& context, const std::string& auth_token);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
