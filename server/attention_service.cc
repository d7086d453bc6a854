#include "server/attention_service.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/strings.h"
#include "server/attention_stream.h"
#include "server/request_builder.h"

namespace attnserve::server {
namespace {

// A unary call's reactor: holds the call's Caller (deadline, cancellation as it happens, which
// DefaultReactor cannot report) and deletes itself in OnDone. Its Call answers it.
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(const grpc::CallbackServerContext& context, Dispatcher* dispatcher)
      : caller_(context, dispatcher) {}
  const Caller* caller() const { return &caller_; }
  // The call moves this many bytes (request and response): see OnDone.
  void set_bytes(size_t bytes) { bytes_ = bytes; }
  void OnCancel() override { caller_.Cancel(); }
  void OnDone() override {
    if (bytes_ >= kTrimAfterBytes) TrimAfterLargeCall();
    delete this;
  }

 private:
  Caller caller_;
  size_t bytes_ = 0;
};

}  // namespace

// Runs posted work in order on one thread of its own; the destructor finishes what was posted.
class WorkThread {
 public:
  WorkThread() : thread_([this] { Run(); }) {}
  ~WorkThread() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }
  void Post(absl::AnyInvocable<void()> work) {
    {
      MutexLock lock(&mu_);
      work_.push_back(std::move(work));
    }
    cv_.NotifyAll();
  }

 private:
  void Run() {
    for (;;) {
      absl::AnyInvocable<void()> work;
      {
        MutexLock lock(&mu_);
        while (work_.empty() && !stopping_) cv_.Wait(&mu_);
        if (work_.empty()) return;
        work = std::move(work_.front());
        work_.pop_front();
      }
      work();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<absl::AnyInvocable<void()>> work_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it reads
};

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

void FillModuleInfo(const Module& module, v1::ModuleInfo* info) {
  info->set_name(module.name);
  info->set_d_model(module.weights.d_model);
  info->set_num_heads(module.weights.num_heads);
  info->set_head_dim(module.weights.head_dim());
  info->set_parameter_bytes(module.weights.bytes());
  info->set_source(module.source);
}

AttentionService::AttentionService(const Options& options, ModuleRegistry* modules,
                                   Dispatcher* dispatcher, metrics::Metrics* metrics,
                                   ServiceInfo info)
    : options_(options),
      modules_(modules),
      dispatcher_(dispatcher),
      metrics_(metrics),
      info_(std::move(info)),
      loader_(std::make_unique<WorkThread>()) {
  ReturnLargeBlocksToTheSystem();
  metrics_->SetModuleBytes(modules_->TotalBytes());
}

template <typename Request, typename Response, typename Build>
grpc::ServerUnaryReactor* AttentionService::Compute(grpc::CallbackServerContext* context,
                                                    metrics::Rpc rpc,
                                                    const grpc::ByteBuffer* request_bytes,
                                                    grpc::ByteBuffer* response_bytes, Build build) {
  auto* reactor = new UnaryReactor(*context, dispatcher_);
  auto call =
      std::make_unique<Call>(metrics_, rpc, reactor->caller(),
                             [reactor, response_bytes, request_size = request_bytes->Length()](
                                 const absl::Status& status, Job* job, absl::Time now) {
                               if (status.ok()) {
                                 Response response;
                                 WriteOutputs(*job, &response);
                                 WriteTiming(job->timing, now, response.mutable_timing());
                                 ReleaseBuffers(job);
                                 SerializeMessage(response, response_bytes);
                               }
                               reactor->set_bytes(request_size + response_bytes->Length());
                               reactor->Finish(ToGrpcStatus(status));
                             });
  if (absl::Status s = Authorize(*context, options_.auth_token); !s.ok()) {
    call->Finish(std::move(s));
    return reactor;
  }
  auto request = std::make_shared<Request>();  // the job's inputs are views into it
  if (!ParseMessage(*request_bytes, request.get())) {
    call->Finish(absl::InvalidArgumentError(absl::StrCat("the message (", request_bytes->Length(),
                                                         " bytes) is not a valid ",
                                                         Request::descriptor()->full_name())));
    return reactor;
  }
  absl::StatusOr<std::unique_ptr<Job>> job = build(*request);
  if (!job.ok()) {
    call->Finish(job.status());
    return reactor;
  }
  (*job)->request = std::move(request);
  (*job)->timing.arrival = call->arrival();
  (*job)->call = std::move(call);
  dispatcher_->Submit(*std::move(job));
  return reactor;
}

template <typename Body>
grpc::ServerUnaryReactor* AttentionService::AnswerNow(const grpc::CallbackServerContext& context,
                                                      metrics::Rpc rpc, Body body) {
  auto* reactor = new UnaryReactor(context, /*dispatcher=*/nullptr);
  Call call(metrics_, rpc, reactor->caller(),
            [reactor](const absl::Status& status, Job*, absl::Time) {
              reactor->Finish(ToGrpcStatus(status));
            });
  absl::Status status = Authorize(context, options_.auth_token);
  if (status.ok()) status = body();
  call.Finish(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Compute<v1::AttendRequest, v1::AttendResponse>(
      context, metrics::Rpc::kAttend, request, response,
      [this](const v1::AttendRequest& r) { return BuildAttendJob(r, options_.limits); });
}

grpc::ServerUnaryReactor* AttentionService::MultiHeadAttention(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* request,
                                                               grpc::ByteBuffer* response) {
  return Compute<v1::MultiHeadAttentionRequest, v1::MultiHeadAttentionResponse>(
      context, metrics::Rpc::kMultiHeadAttention, request, response,
      [this](const v1::MultiHeadAttentionRequest& r) {
        return BuildMultiHeadJob(r, *modules_, options_.limits);
      });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionService::AttentionStream(
    grpc::CallbackServerContext* context) {
  return new AttentionStreamReactor(context, {&options_.limits, modules_, dispatcher_, metrics_},
                                    Authorize(*context, options_.auth_token));
}

AttentionService::~AttentionService() = default;

grpc::ServerUnaryReactor* AttentionService::LoadModule(grpc::CallbackServerContext* context,
                                                       const v1::LoadModuleRequest* request,
                                                       v1::LoadModuleResponse* response) {
  auto* reactor = new UnaryReactor(*context, /*dispatcher=*/nullptr);
  auto call = std::make_unique<Call>(metrics_, metrics::Rpc::kLoadModule, reactor->caller(),
                                     [reactor](const absl::Status& status, Job*, absl::Time) {
                                       reactor->Finish(ToGrpcStatus(status));
                                     });
  absl::Status status = Authorize(*context, options_.auth_token);
  if (status.ok() && !options_.allow_module_rpc) {
    status = absl::PermissionDeniedError(
        "LoadModule is switched off on this server (--allow_module_rpc=false)");
  }
  if (status.ok()) status = ModuleRegistry::ValidateName(request->name(), "name");
  if (!status.ok()) {
    call->Finish(std::move(status));
    return reactor;
  }
  // `request` and `response` live until the call finishes, which only the posted work does.
  loader_->Post([this, request, response, call = std::move(call)] {
    auto module = ModuleFromSafetensors(request->name(), "rpc", request->safetensors(),
                                        request->num_heads(), options_.limits.max_module_bytes);
    absl::Status status = module.status();
    if (status.ok()) status = modules_->Add(*module, request->replace());
    if (status.ok()) {
      metrics_->SetModuleBytes(modules_->TotalBytes());
      FillModuleInfo(**module, response->mutable_module());
    }
    call->Finish(std::move(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::UnloadModule(grpc::CallbackServerContext* context,
                                                         const v1::UnloadModuleRequest* request,
                                                         v1::UnloadModuleResponse*) {
  return AnswerNow(*context, metrics::Rpc::kUnloadModule, [&]() -> absl::Status {
    if (!options_.allow_module_rpc) {
      return absl::PermissionDeniedError(
          "UnloadModule is switched off on this server (--allow_module_rpc=false)");
    }
    const absl::Status status = modules_->Remove(request->name());
    metrics_->SetModuleBytes(modules_->TotalBytes());
    return status;
  });
}

grpc::ServerUnaryReactor* AttentionService::ListModules(grpc::CallbackServerContext* context,
                                                        const v1::ListModulesRequest*,
                                                        v1::ListModulesResponse* response) {
  return AnswerNow(*context, metrics::Rpc::kListModules, [&] {
    for (const auto& module : modules_->List()) FillModuleInfo(*module, response->add_modules());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AttentionService::GetServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetServerInfoRequest*,
                                                          v1::GetServerInfoResponse* response) {
  return AnswerNow(*context, metrics::Rpc::kGetServerInfo, [&] {
    response->set_version(info_.version);
    for (const auto& backend : info_.backends) *response->add_backends() = backend;
    v1::Limits* limits = response->mutable_limits();
    limits->set_max_message_bytes(options_.limits.max_message_bytes);
    limits->set_max_tensor_elements(options_.limits.max_tensor_elements);
    limits->set_max_sequence_length(options_.limits.max_sequence_length);
    limits->set_max_head_dim(options_.limits.max_head_dim);
    limits->set_max_module_bytes(options_.limits.max_module_bytes);
    limits->set_max_stream_in_flight(options_.limits.max_stream_in_flight);
    *response->mutable_batching() = info_.batching;
    response->set_float32_precision(info_.float32_precision);
    return absl::OkStatus();
  });
}

}  // namespace attnserve::server
