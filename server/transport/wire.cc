#include "server/transport/wire.h"

#include <optional>
#include <string>
#include <vector>

#include "attnserve/v1/attention.grpc.pb.h"
#include "base/strings.h"
#include "server/batching/pushback.h"
#include "server/sessions/session_manager.h"
#include "server/transport/request_builder.h"

namespace attnserve::server {

grpc::Status SessionAwareStatus(const absl::Status& status, grpc::CallbackServerContext* context) {
  if (const std::string reason = sessions::SessionManager::LostReason(status); !reason.empty()) {
    context->AddTrailingMetadata("attnserve-session-lost", reason);
  }
  if (const std::string to = sessions::SessionManager::MovedTo(status); !to.empty()) {
    context->AddTrailingMetadata("attnserve-session-moved", to);
  }
  // gRFC A6's retry pushback: gRPC's retry policy and the bundled clients' throttles wait this
  // long before their next call.
  if (const std::optional<int64_t> ms = batching::PushbackMs(status)) {
    context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(*ms));
  }
  return ToGrpcStatus(status);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Bounded: a client's 8 KiB metadata limit must see the real error (base/strings.h).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundMessage(status.message()));
}

bool ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices; Deserialize consumes its argument
  return grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&copy, message).ok();
}

void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, bytes, &own_buffer)
      .IgnoreError();
}

namespace {

// Appends a protobuf varint.
void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// A length-delimited field's tag (wire type 2).
char LengthDelimitedTag(int field_number) { return static_cast<char>((field_number << 3) | 2); }

}  // namespace

template <typename Response>
void SerializeResponse(Job* job, absl::Time now, grpc::ByteBuffer* bytes) {
  static_assert(Response::kOutputFieldNumber < 16 && v1::Tensor::kDataFieldNumber < 16,
                "one-byte tags");
  if (job->dtype != kernels::DType::kFloat32) {
    Response response;
    FillResponse(*job, now, &response);
    ReleaseBuffers(job);
    SerializeMessage(response, bytes);
    return;
  }
  // Everything but the output's data, as protobuf writes it...
  Response response;
  if (!job->weights_shape.empty()) {
    WriteTensor(job->dtype, job->weights, job->weights_shape, response.mutable_weights());
  }
  WriteTiming(job->timing, now, response.mutable_timing());
  v1::Tensor head;  // the output's dtype and shape
  head.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : job->out_shape) head.add_shape(d);
  auto* data = new std::vector<float>(std::move(job->out));
  ReleaseBuffers(job);
  const size_t data_bytes = data->size() * sizeof(float);
  std::string wire = response.SerializeAsString();
  // ...then the output field by hand: tag, length, dtype and shape, then the data field's tag
  // and length, whose bytes follow as the second slice.
  std::string data_prefix;
  data_prefix.push_back(LengthDelimitedTag(v1::Tensor::kDataFieldNumber));
  AppendVarint(data_bytes, &data_prefix);
  const std::string head_bytes = head.SerializeAsString();
  wire.push_back(LengthDelimitedTag(Response::kOutputFieldNumber));
  AppendVarint(head_bytes.size() + data_prefix.size() + data_bytes, &wire);
  wire += head_bytes;
  wire += data_prefix;
  const grpc::Slice slices[2] = {
      grpc::Slice(wire),
      grpc::Slice(
          data->data(), data_bytes,
          [](void* buffer) { delete static_cast<std::vector<float>*>(buffer); }, data)};
  grpc::ByteBuffer(slices, 2).Swap(bytes);
}

template void SerializeResponse<v1::AttendResponse>(Job*, absl::Time, grpc::ByteBuffer*);
template void SerializeResponse<v1::MultiHeadAttentionResponse>(Job*, absl::Time,
                                                                grpc::ByteBuffer*);

}  // namespace attnserve::server
