// Request limits of the server (reported by GetServerInfo.limits).
#ifndef ATTNSERVE_SERVER_TRANSPORT_LIMITS_H_
#define ATTNSERVE_SERVER_TRANSPORT_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::server {

// Exceeding a limit is RESOURCE_EXHAUSTED, except max_head_dim (a property of the kernels:
// INVALID_ARGUMENT). Every field is a flag of the attnserve binary of the same name.
struct Limits {
  // Largest request message in bytes. The server refuses a larger one with RESOURCE_EXHAUSTED
  // naming this limit (CheckMessageSize), counted as what the caller saw; gRPC itself refuses
  // one over GrpcReceiveLimit() before the server sees it. Default: 256 MiB.
  int64_t max_message_bytes = int64_t{256} << 20;
  // Largest element count of any tensor of a request or response (weights included).
  // Default: 64 Mi elements (256 MiB of float32).
  int64_t max_tensor_elements = int64_t{64} << 20;
  // Largest sequence length Lq or Lk. Default: 65536.
  int64_t max_sequence_length = 65536;
  // Largest head dimension D or Dv that the kernels support. Default: 256.
  int64_t max_head_dim = 256;
  // Largest module (float32 weights, bytes) LoadModule accepts. Default: 1 GiB.
  int64_t max_module_bytes = int64_t{1} << 30;
  // Most requests of one AttentionStream queued or computing at once. Default: 256.
  int64_t max_stream_in_flight = 256;
  // Whether the server computes AttentionOptions.kind LINEAR (its backend, or the CPU backend
  // it falls back to: kernels::Backend::supports_linear_attention); refused UNIMPLEMENTED when
  // not. Set by the host.
  bool linear_attention = true;
  // Whether the backend's paged attention takes a window, soft-capping and ALiBi
  // (kernels::Backend::supports_session_score_mods): sessions with them are refused
  // UNIMPLEMENTED when not. Set by the host from its backend.
  bool session_score_mods = true;
};

// What gRPC is told to accept (ServerBuilder::SetMaxReceiveMessageSize): twice
// max_message_bytes, at most INT_MAX. Messages between the two limits reach the server, which
// refuses them itself, so that the caller learns the flag and the server's metrics count the
// refusal as the caller saw it. Beyond it gRPC refuses the call before the server sees any of
// it (its buffers' backstop): the caller gets RESOURCE_EXHAUSTED, and the server, told only that
// the message did not arrive, counts a cancelled call.
int GrpcReceiveLimit(const Limits& limits);

// OK when a request message of `bytes` bytes is within limits.max_message_bytes; otherwise
// RESOURCE_EXHAUSTED naming `what` (e.g. "the AttendRequest"), its size and the limit.
absl::Status CheckMessageSize(const Limits& limits, int64_t bytes, absl::string_view what);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_LIMITS_H_
