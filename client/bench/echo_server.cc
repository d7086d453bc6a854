// attnserve-bench-echo: a benchmark-only server on attnserve's gRPC stack (the callback API,
// the same proto) that answers Attend and MultiHeadAttention with the query as the output, so
// responses are as large as attnserve's and nothing is computed. Comparing attnserve-bench
// against it and against attnserve measures what serving itself (gRPC, protobuf, the
// threads) costs. Never deploy it.
//
//   attnserve-bench-echo --listen=127.0.0.1:0 --port_file=/tmp/port
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address; port 0 picks a free one");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once listening");

namespace {

namespace v1 = attnserve::v1;

class EchoService final : public v1::AttentionService::CallbackService {
  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override {
    *response->mutable_output() = request->query();
    response->mutable_timing()->set_batch_size(1);
    response->mutable_timing()->set_backend("echo");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* MultiHeadAttention(grpc::CallbackServerContext* context,
                                               const v1::MultiHeadAttentionRequest* request,
                                               v1::MultiHeadAttentionResponse* response) override {
    *response->mutable_output() = request->query();
    response->mutable_timing()->set_batch_size(1);
    response->mutable_timing()->set_backend("echo");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest*,
                                          v1::GetServerInfoResponse* response) override {
    response->set_version("echo");
    auto* b = response->add_backends();
    b->set_name("echo");
    b->set_active(true);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* ListModules(grpc::CallbackServerContext* context,
                                        const v1::ListModulesRequest*,
                                        v1::ListModulesResponse* response) override {
    auto* m = response->add_modules();  // what attnserve's built-in "demo" module declares
    m->set_name("demo");
    m->set_d_model(64);
    m->set_num_heads(4);
    m->set_head_dim(16);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  EchoService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "attnserve-bench-echo: cannot listen on %s\n",
                 absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  if (const std::string f = absl::GetFlag(FLAGS_port_file); !f.empty()) {
    std::ofstream(f + ".tmp") << port;
    std::rename((f + ".tmp").c_str(), f.c_str());
  }
  std::printf("attnserve-bench-echo listening on port %d\n", port);
  std::fflush(stdout);
  server->Wait();
  return 0;
}
