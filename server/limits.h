// Request limits of the server (reported by GetServerInfo.limits).
#ifndef ATTNSERVE_SERVER_LIMITS_H_
#define ATTNSERVE_SERVER_LIMITS_H_

#include <cstdint>

namespace attnserve::server {

// Exceeding a limit is RESOURCE_EXHAUSTED, except max_head_dim (a property of the kernels:
// INVALID_ARGUMENT). Every field is a flag of the attnserve binary of the same name.
struct Limits {
  // Largest request message in bytes; gRPC itself answers RESOURCE_EXHAUSTED above it.
  // Default: 256 MiB.
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
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_LIMITS_H_
