// The transport's wire helpers: messages from and to the raw ByteBuffers of the callback
// methods (responses with a float32 output handed to gRPC without a copy), and statuses from
// absl::Status to gRPC's with the trailing metadata callers read (session lost, retry pushback).
#ifndef ATTNSERVE_SERVER_TRANSPORT_WIRE_H_
#define ATTNSERVE_SERVER_TRANSPORT_WIRE_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "server/core/job.h"

namespace attnserve::server {

// Parses a message from the bytes of a raw method; false when they are not one.
bool ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);
// Serialises a message for a raw method.
void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* bytes);

// Serialises the response of a computed Attend or MultiHeadAttention job (what FillResponse
// writes) for a raw method, moving a float32 output once: its bytes are not copied into the
// message and again into the ByteBuffer, but handed to gRPC as a slice of their own that owns the
// job's output buffer (job->out is left empty). The output comes last on the wire, which
// protobuf parsers accept in any order. Other dtypes: FillResponse, then SerializeMessage.
template <typename Response>
void SerializeResponse(Job* job, absl::Time now, grpc::ByteBuffer* bytes);

// absl::Status -> grpc::Status (the canonical codes share their numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

// A unary call's status, with trailing metadata added to `context`: "attnserve-session-lost:
// <reason>" when the status says a session was lost, "attnserve-session-moved: <new id>" when
// it was moved, "grpc-retry-pushback-ms" when it carries a pushback.
grpc::Status SessionAwareStatus(const absl::Status& status, grpc::CallbackServerContext* context);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_WIRE_H_
