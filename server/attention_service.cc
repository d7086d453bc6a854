#include "server/attention_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/request_builder.h"

namespace attnserve::server {
namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
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
                                   Dispatcher* dispatcher, ServiceInfo info)
    : options_(options), modules_(modules), dispatcher_(dispatcher), info_(std::move(info)) {}

template <typename Response>
grpc::ServerUnaryReactor* AttentionService::Dispatch(grpc::CallbackServerContext* context,
                                                     absl::StatusOr<std::unique_ptr<Job>> job_or,
                                                     absl::Time arrival, Response* response) {
  if (!job_or.ok()) return FinishNow(context, job_or.status());
  std::unique_ptr<Job> job = *std::move(job_or);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  job->timing.arrival = arrival;
  job->deadline_at = DeadlineOf(*context);
  // The context stays valid until the reactor is finished, which only `done` does.
  job->is_cancelled = [context] { return context->IsCancelled(); };
  job->done = [reactor, response](Job& done_job, absl::Status status) {
    if (status.ok()) {
      WriteOutputs(done_job, response);
      WriteTiming(done_job.timing, absl::Now(), response->mutable_timing());
    }
    reactor->Finish(ToGrpcStatus(status));
  };
  if (absl::Status s = dispatcher_->Submit(&job); !s.ok()) reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  const absl::Time arrival = absl::Now();
  return Dispatch(context, BuildAttendJob(*request, options_.limits), arrival, response);
}

grpc::ServerUnaryReactor* AttentionService::MultiHeadAttention(
    grpc::CallbackServerContext* context, const v1::MultiHeadAttentionRequest* request,
    v1::MultiHeadAttentionResponse* response) {
  const absl::Time arrival = absl::Now();
  return Dispatch(context, BuildMultiHeadJob(*request, *modules_, options_.limits), arrival,
                  response);
}

grpc::ServerUnaryReactor* AttentionService::LoadModule(grpc::CallbackServerContext* context,
                                                       const v1::LoadModuleRequest* request,
                                                       v1::LoadModuleResponse* response) {
  if (!options_.allow_module_rpc) {
    return FinishNow(context, absl::PermissionDeniedError(
                                  "LoadModule is switched off on this server "
                                  "(--allow_module_rpc=false)"));
  }
  if (auto s = ModuleRegistry::ValidateName(request->name(), "name"); !s.ok()) {
    return FinishNow(context, s);
  }
  auto module = ModuleFromSafetensors(request->name(), "rpc", request->safetensors(),
                                      request->num_heads(), options_.limits.max_module_bytes);
  if (!module.ok()) return FinishNow(context, module.status());
  if (auto s = modules_->Add(*module, request->replace()); !s.ok()) return FinishNow(context, s);
  FillModuleInfo(**module, response->mutable_module());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::UnloadModule(grpc::CallbackServerContext* context,
                                                         const v1::UnloadModuleRequest* request,
                                                         v1::UnloadModuleResponse*) {
  if (!options_.allow_module_rpc) {
    return FinishNow(context, absl::PermissionDeniedError(
                                  "UnloadModule is switched off on this server "
                                  "(--allow_module_rpc=false)"));
  }
  return FinishNow(context, modules_->Remove(request->name()));
}

grpc::ServerUnaryReactor* AttentionService::ListModules(grpc::CallbackServerContext* context,
                                                        const v1::ListModulesRequest*,
                                                        v1::ListModulesResponse* response) {
  for (const auto& module : modules_->List()) FillModuleInfo(*module, response->add_modules());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::GetServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetServerInfoRequest*,
                                                          v1::GetServerInfoResponse* response) {
  response->set_version(info_.version);
  for (const auto& backend : info_.backends) *response->add_backends() = backend;
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(options_.limits.max_message_bytes);
  limits->set_max_tensor_elements(options_.limits.max_tensor_elements);
  limits->set_max_sequence_length(options_.limits.max_sequence_length);
  limits->set_max_head_dim(options_.limits.max_head_dim);
  limits->set_max_module_bytes(options_.limits.max_module_bytes);
  *response->mutable_batching() = info_.batching;
  response->set_float32_precision(info_.float32_precision);
  return FinishNow(context, absl::OkStatus());
}

}  // namespace attnserve::server
