// libFuzzer target: bytes as one message of the AttentionStream rpc, through the server's own
// parser (ParseMessage, from a grpc::ByteBuffer as the stream reads it), then the item's request
// through its builder and the reference backend. An item with neither request is what the
// stream answers INVALID_ARGUMENT; it must not reach a builder.
#include <cstddef>
#include <cstdint>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/transport/wire.h"
#include "tests/fuzz/fuzz_requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer bytes(&slice, 1);
  attnserve::v1::AttentionStreamRequest item;
  if (!attnserve::server::ParseMessage(bytes, &item)) return 0;
  if (item.has_attend()) {
    attnserve::fuzz::BuildAndCompute(item.attend());
  } else if (item.has_multi_head_attention()) {
    attnserve::fuzz::BuildAndCompute(item.multi_head_attention());
  }
  return 0;
}
