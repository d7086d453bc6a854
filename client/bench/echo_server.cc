// attnserve-bench-echo: a benchmark-only server on attnserve's gRPC stack (the callback API,
// the same proto) that answers Attend and MultiHeadAttention with the query as the output, so
// responses are as large as attnserve's and nothing is computed. Comparing attnserve-bench
// against it and against attnserve measures what serving itself (gRPC, protobuf, the
// threads) costs. Never deploy it.
//
//   attnserve-bench-echo --listen=127.0.0.1:0 --port_file=/tmp/port [--stream_unary]
//       [--work_us=N]
//
// --stream_unary serves Attend as attnserve does (a stream of one message that the handler
// reads), to tell what that structure costs from what attnserve itself does (SERVING.md).
// --work_us spends N µs of CPU on every Attend and MultiHeadAttention before answering, on the
// thread that received it, as attnserve computes a small request: what holding gRPC's thread
// costs beyond the work itself (SERVING.md).
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "base/allocator.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address; port 0 picks a free one");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once listening");
ABSL_FLAG(bool, stream_unary, false,
          "serve Attend as attnserve does: a stream of one message, read by the handler");
ABSL_FLAG(bool, bdp_probe, true,
          "grow flow-control windows with BDP probes (gRPC's default); attnserve turns them off "
          "(server_host.cc), so a request over 64 KiB waits a round trip for its window");
ABSL_FLAG(int64_t, work_us, 0,
          "CPU microseconds spent on every Attend and MultiHeadAttention before answering, on "
          "the thread that received it (a stand-in for computing a small request)");

namespace {

namespace v1 = attnserve::v1;

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Spends --work_us of this thread's CPU time (not wall time: a preempted thread spends none).
void Work() {
  static const int64_t work_ns = absl::GetFlag(FLAGS_work_us) * 1000;
  if (work_ns <= 0) return;
  const int64_t end = ThreadCpuNs() + work_ns;
  while (ThreadCpuNs() < end) {
  }
}

// Attend served as attnserve serves it (server/transport/attention_service.cc): a bidi stream of
// one request and one response, the request read after the handler sees the call.
class StreamEchoReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamEchoReactor() { StartRead(&request_bytes_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no request"));
      return;
    }
    v1::AttendRequest request;
    grpc::ByteBuffer copy(request_bytes_);
    if (!grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&copy, &request).ok()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not an AttendRequest"));
      return;
    }
    Work();
    v1::AttendResponse response;
    *response.mutable_output() = request.query();
    response.mutable_timing()->set_batch_size(1);
    response.mutable_timing()->set_backend("echo");
    bool own = false;
    grpc::SerializationTraits<google::protobuf::Message>::Serialize(response, &response_bytes_,
                                                                    &own)
        .IgnoreError();
    StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
};

class EchoService final : public v1::AttentionService::CallbackService {
 public:
  explicit EchoService(bool stream_unary) {
    if (stream_unary) {
      MarkMethodStreamed(
          0, new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                 [](grpc::CallbackServerContext*) { return new StreamEchoReactor; }));
    }
  }

 private:
  // The query back as the output, as a computing server answers (its timing says "echo").
  template <typename Request, typename Response>
  static grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                        const Request& request, Response* response) {
    Work();
    *response->mutable_output() = request.query();
    response->mutable_timing()->set_batch_size(1);
    response->mutable_timing()->set_backend("echo");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override {
    return Echo(context, *request, response);
  }
  grpc::ServerUnaryReactor* MultiHeadAttention(grpc::CallbackServerContext* context,
                                               const v1::MultiHeadAttentionRequest* request,
                                               v1::MultiHeadAttentionResponse* response) override {
    return Echo(context, *request, response);
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
  // As attnserve's main does: Debian's Abseil checks every absl::Mutex lock for deadlock cycles
  // unless told not to, which costs gRPC's locks alike in both servers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::ParseCommandLine(argc, argv);
  EchoService service(absl::GetFlag(FLAGS_stream_unary));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  if (!absl::GetFlag(FLAGS_bdp_probe)) builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "attnserve-bench-echo: cannot listen on %s\n",
                 absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::fprintf(stderr, "attnserve-bench-echo: allocator %s\n",
               attnserve::AllocatorDescription().c_str());
  if (const std::string f = absl::GetFlag(FLAGS_port_file); !f.empty()) {
    std::ofstream(f + ".tmp") << port;
    std::rename((f + ".tmp").c_str(), f.c_str());
  }
  std::printf("attnserve-bench-echo listening on port %d\n", port);
  std::fflush(stdout);
  server->Wait();
  return 0;
}
