// attnserve::Client: a thin, thread-safe C++ client for the attnserve gRPC service.
//
//   auto client = attnserve::Client::Create("localhost:50051");
//   v1::AttendRequest request;
//   *request.mutable_query() = attnserve::MakeTensor(v1::DTYPE_FLOAT32, {1, 8, 128, 64}, q);
//   ...
//   absl::StatusOr<v1::AttendResponse> response = (*client)->Attend(request);
//
// Every call returns absl::StatusOr: the server's gRPC status (code and message) on failure.
#ifndef ATTNSERVE_CLIENT_CLIENT_H_
#define ATTNSERVE_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/channel.h"

namespace attnserve {

namespace v1 = ::attnserve::v1;

struct ClientOptions {
  // Deadline of each call unless the call gives its own. Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
  // Largest response accepted, bytes. Default: unlimited (the server bounds its responses).
  int max_receive_message_bytes = -1;

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
};

// Thread-safe: one Client may be shared by any number of threads.
class Client {
 public:
  // Connects (lazily) to `target`, a gRPC target such as "localhost:50051" or
  // "dns:///attnserve:50051", with TLS when options.tls.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});
  // Uses an existing channel (TLS, custom arguments, in-process).
  Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options = {});

  // One method per rpc of attnserve.v1.AttentionService (see the proto for semantics and
  // errors). `timeout` overrides ClientOptions::timeout when given.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::MultiHeadAttentionResponse> MultiHeadAttention(
      const v1::MultiHeadAttentionRequest& request,
      absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::LoadModuleResponse> LoadModule(const v1::LoadModuleRequest& request,
                                                    absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::UnloadModuleResponse> UnloadModule(
      const v1::UnloadModuleRequest& request, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::ListModulesResponse> ListModules(
      absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo(
      absl::Duration timeout = absl::ZeroDuration());

  grpc::Channel& channel() { return *channel_; }

 private:
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  ClientOptions options_;
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

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_CLIENT_H_
