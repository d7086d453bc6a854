#include "server/attention_service.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/attention_stream.h"
#include "server/request_builder.h"

namespace attnserve::server {
namespace {

// The reactor of a queued unary call: learns of cancellation as it happens (DefaultReactor
// cannot), so the job leaves the queue without waiting for its batch. Deletes itself.
class JobReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit JobReactor(Dispatcher* dispatcher) : dispatcher_(dispatcher) {}
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  void OnCancel() override {
    cancelled_.store(true, std::memory_order_release);
    dispatcher_->NotifyCancelled();
  }
  void OnDone() override { delete this; }

 private:
  Dispatcher* const dispatcher_;
  std::atomic<bool> cancelled_{false};
};

// A stream refused before it starts (unauthenticated): finishes at once, deletes itself.
class RefusedStream final
    : public grpc::ServerBidiReactor<v1::AttentionStreamRequest, v1::AttentionStreamResponse> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
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
      info_(std::move(info)) {
  metrics_->SetModuleBytes(modules_->TotalBytes());
}

absl::Status AttentionService::Authorize(const grpc::CallbackServerContext& context) const {
  if (options_.auth_token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this server requires 'authorization: Bearer <token>'");
  }
  const std::string expected = "Bearer " + options_.auth_token;
  const grpc::string_ref& got = it->second;
  // Compare in constant time, so the answer's timing says nothing about the token.
  unsigned char diff = got.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < got.size(); ++i) {
    diff |= static_cast<unsigned char>(got.data()[i] ^ expected[i % expected.size()]);
  }
  if (diff != 0) return absl::UnauthenticatedError("the bearer token is not valid");
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AttentionService::FinishNow(grpc::CallbackServerContext* context,
                                                      metrics::Rpc rpc, absl::Time arrival,
                                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  metrics_->RequestFinished(rpc, static_cast<int>(status.code()), absl::Now() - arrival);
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

template <typename Response>
grpc::ServerUnaryReactor* AttentionService::Dispatch(grpc::CallbackServerContext* context,
                                                     metrics::Rpc rpc,
                                                     absl::StatusOr<std::unique_ptr<Job>> job_or,
                                                     absl::Time arrival, Response* response) {
  if (!job_or.ok()) return FinishNow(context, rpc, arrival, job_or.status());
  std::unique_ptr<Job> job = *std::move(job_or);
  auto* reactor = new JobReactor(dispatcher_);
  job->timing.arrival = arrival;
  job->deadline_at = DeadlineOf(*context);
  // The reactor lives until OnDone, which follows Finish, which only `done` calls.
  job->is_cancelled = [reactor] { return reactor->cancelled(); };
  job->done = [this, reactor, response, rpc](Job& done_job, absl::Status status) {
    const absl::Time now = absl::Now();
    if (status.ok()) {
      WriteOutputs(done_job, response);
      WriteTiming(done_job.timing, now, response->mutable_timing());
    }
    metrics_->RequestFinished(rpc, static_cast<int>(status.code()), now - done_job.timing.arrival);
    reactor->Finish(ToGrpcStatus(status));
  };
  if (absl::Status s = dispatcher_->Submit(&job); !s.ok()) {
    metrics_->RequestFinished(rpc, static_cast<int>(s.code()), absl::Now() - arrival);
    reactor->Finish(ToGrpcStatus(s));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  if (auto s = Authorize(*context); !s.ok()) {
    return FinishNow(context, metrics::Rpc::kAttend, arrival, s);
  }
  return Dispatch(context, metrics::Rpc::kAttend, BuildAttendJob(*request, options_.limits),
                  arrival, response);
}

grpc::ServerUnaryReactor* AttentionService::MultiHeadAttention(
    grpc::CallbackServerContext* context, const v1::MultiHeadAttentionRequest* request,
    v1::MultiHeadAttentionResponse* response) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  if (auto s = Authorize(*context); !s.ok()) {
    return FinishNow(context, metrics::Rpc::kMultiHeadAttention, arrival, s);
  }
  return Dispatch(context, metrics::Rpc::kMultiHeadAttention,
                  BuildMultiHeadJob(*request, *modules_, options_.limits), arrival, response);
}

grpc::ServerBidiReactor<v1::AttentionStreamRequest, v1::AttentionStreamResponse>*
AttentionService::AttentionStream(grpc::CallbackServerContext* context) {
  if (auto s = Authorize(*context); !s.ok()) return new RefusedStream(ToGrpcStatus(s));
  return new AttentionStreamReactor(context, {&options_.limits, modules_, dispatcher_, metrics_});
}

grpc::ServerUnaryReactor* AttentionService::LoadModule(grpc::CallbackServerContext* context,
                                                       const v1::LoadModuleRequest* request,
                                                       v1::LoadModuleResponse* response) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  constexpr metrics::Rpc kRpc = metrics::Rpc::kLoadModule;
  if (auto s = Authorize(*context); !s.ok()) return FinishNow(context, kRpc, arrival, s);
  if (!options_.allow_module_rpc) {
    return FinishNow(context, kRpc, arrival,
                     absl::PermissionDeniedError("LoadModule is switched off on this server "
                                                 "(--allow_module_rpc=false)"));
  }
  if (auto s = ModuleRegistry::ValidateName(request->name(), "name"); !s.ok()) {
    return FinishNow(context, kRpc, arrival, s);
  }
  auto module = ModuleFromSafetensors(request->name(), "rpc", request->safetensors(),
                                      request->num_heads(), options_.limits.max_module_bytes);
  if (!module.ok()) return FinishNow(context, kRpc, arrival, module.status());
  if (auto s = modules_->Add(*module, request->replace()); !s.ok()) {
    return FinishNow(context, kRpc, arrival, s);
  }
  metrics_->SetModuleBytes(modules_->TotalBytes());
  FillModuleInfo(**module, response->mutable_module());
  return FinishNow(context, kRpc, arrival, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::UnloadModule(grpc::CallbackServerContext* context,
                                                         const v1::UnloadModuleRequest* request,
                                                         v1::UnloadModuleResponse*) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  constexpr metrics::Rpc kRpc = metrics::Rpc::kUnloadModule;
  if (auto s = Authorize(*context); !s.ok()) return FinishNow(context, kRpc, arrival, s);
  if (!options_.allow_module_rpc) {
    return FinishNow(context, kRpc, arrival,
                     absl::PermissionDeniedError("UnloadModule is switched off on this server "
                                                 "(--allow_module_rpc=false)"));
  }
  const absl::Status status = modules_->Remove(request->name());
  metrics_->SetModuleBytes(modules_->TotalBytes());
  return FinishNow(context, kRpc, arrival, status);
}

grpc::ServerUnaryReactor* AttentionService::ListModules(grpc::CallbackServerContext* context,
                                                        const v1::ListModulesRequest*,
                                                        v1::ListModulesResponse* response) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  if (auto s = Authorize(*context); !s.ok()) {
    return FinishNow(context, metrics::Rpc::kListModules, arrival, s);
  }
  for (const auto& module : modules_->List()) FillModuleInfo(*module, response->add_modules());
  return FinishNow(context, metrics::Rpc::kListModules, arrival, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::GetServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetServerInfoRequest*,
                                                          v1::GetServerInfoResponse* response) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  if (auto s = Authorize(*context); !s.ok()) {
    return FinishNow(context, metrics::Rpc::kGetServerInfo, arrival, s);
  }
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
  return FinishNow(context, metrics::Rpc::kGetServerInfo, arrival, absl::OkStatus());
}

}  // namespace attnserve::server
