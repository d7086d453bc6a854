#include "server/transport/auth.h"

#include <string>

namespace attnserve::server {

absl::Status Authorize(const grpc::CallbackServerContext& context, const std::string& auth_token) {
  if (auth_token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this server requires 'authorization: Bearer <token>'");
  }
  const std::string expected = "Bearer " + auth_token;
  const grpc::string_ref& got = it->second;
  // Compare in constant time, so the answer's timing says nothing about the token.
  unsigned char diff = got.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < got.size(); ++i) {
    diff |= static_cast<unsigned char>(got.data()[i] ^ expected[i % expected.size()]);
  }
  if (diff != 0) return absl::UnauthenticatedError("the bearer token is not valid");
  return absl::OkStatus();
}

}  // namespace attnserve::server
