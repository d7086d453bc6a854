#include "client/client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kernels/dtype.h"

namespace attnserve {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<kernels::DType> FloatDType(v1::Dtype t) {
  switch (t) {
    case v1::DTYPE_FLOAT32: return kernels::DType::kFloat32;
    case v1::DTYPE_FLOAT16: return kernels::DType::kFloat16;
    case v1::DTYPE_BFLOAT16: return kernels::DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor dtype must be FLOAT32, FLOAT16 or BFLOAT16; was ",
                       v1::Dtype_Name(t)));
  }
}


}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                       const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target must not be empty");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    ssl.pem_cert_chain = options.tls_client_cert;
    ssl.pem_private_key = options.tls_client_key;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  return std::make_unique<Client>(grpc::CreateCustomChannel(target, credentials, args), options);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      options_(options) {}

void Client::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  if (timeout <= absl::ZeroDuration()) timeout = options_.timeout;
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMicroseconds(timeout));
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.auth_token);
  }
}

#define ATTNSERVE_CLIENT_METHOD(Rpc)                                                   \
  absl::StatusOr<v1::Rpc##Response> Client::Rpc(const v1::Rpc##Request& request,       \
                                                absl::Duration timeout) {              \
    grpc::ClientContext context;                                                       \
    Prepare(&context, timeout);                                                        \
    v1::Rpc##Response response;                                                        \
    grpc::Status status = stub_->Rpc(&context, request, &response);                    \
    if (!status.ok()) return FromGrpc(status);                                         \
    return response;                                                                   \
  }
ATTNSERVE_CLIENT_METHOD(Attend)
ATTNSERVE_CLIENT_METHOD(MultiHeadAttention)
ATTNSERVE_CLIENT_METHOD(LoadModule)
ATTNSERVE_CLIENT_METHOD(UnloadModule)
#undef ATTNSERVE_CLIENT_METHOD

absl::StatusOr<v1::ListModulesResponse> Client::ListModules(absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::ListModulesResponse response;
  grpc::Status status = stub_->ListModules(&context, v1::ListModulesRequest(), &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo(absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::GetServerInfoResponse response;
  grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

v1::Tensor MakeTensor(v1::Dtype dtype, const std::vector<int64_t>& shape,
                      const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  const kernels::DType type = FloatDType(dtype).value();
  std::string* data = t.mutable_data();
  data->resize(values.size() * kernels::DTypeSize(type));
  kernels::FromFloat32(type, values.data(), values.size(), data->data());
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
  auto type = FloatDType(tensor.dtype());
  if (!type.ok()) return type.status();
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  const size_t want = static_cast<size_t>(n) * kernels::DTypeSize(*type);
  if (tensor.data().size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor data holds ", tensor.data().size(),
                                                   " bytes; its shape needs ", want));
  }
  std::vector<float> out(n);
  kernels::ToFloat32(*type, tensor.data().data(), n, out.data());
  return out;
}

}  // namespace attnserve
