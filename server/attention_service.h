// The gRPC service: validates requests at the boundary, hands jobs to the dispatcher and
// answers from the dispatcher's threads. Handlers never block: they run on gRPC's small
// callback pool, so anything that waits (queueing, computing) happens elsewhere.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <string>

#include "attnserve/v1/attention.grpc.pb.h"
#include "kernels/backend.h"
#include "server/dispatcher.h"
#include "server/limits.h"
#include "server/metrics/metrics.h"
#include "server/module_registry.h"

namespace attnserve::server {

// What GetServerInfo reports beyond what the service knows itself.
struct ServiceInfo {
  std::string version;
  std::string float32_precision;
  v1::BatchingSettings batching;
  std::vector<v1::BackendInfo> backends;  // every backend present; one marked active
};

// Thread-safe. Does not own its collaborators; they outlive it.
class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  struct Options {
    Limits limits;
    // False: LoadModule and UnloadModule answer PERMISSION_DENIED.
    bool allow_module_rpc = true;
    // Non-empty: every call must carry the metadata "authorization: Bearer <auth_token>";
    // others are answered UNAUTHENTICATED. (Health and reflection stay open for probes.)
    std::string auth_token;
  };

  // Every rpc is counted in `metrics` (by rpc and code, with its server time).
  AttentionService(const Options& options, ModuleRegistry* modules, Dispatcher* dispatcher,
                   metrics::Metrics* metrics, ServiceInfo info);

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override;
  grpc::ServerUnaryReactor* MultiHeadAttention(grpc::CallbackServerContext* context,
                                               const v1::MultiHeadAttentionRequest* request,
                                               v1::MultiHeadAttentionResponse* response) override;
  grpc::ServerBidiReactor<v1::AttentionStreamRequest, v1::AttentionStreamResponse>* AttentionStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* LoadModule(grpc::CallbackServerContext* context,
                                       const v1::LoadModuleRequest* request,
                                       v1::LoadModuleResponse* response) override;
  grpc::ServerUnaryReactor* UnloadModule(grpc::CallbackServerContext* context,
                                         const v1::UnloadModuleRequest* request,
                                         v1::UnloadModuleResponse* response) override;
  grpc::ServerUnaryReactor* ListModules(grpc::CallbackServerContext* context,
                                        const v1::ListModulesRequest* request,
                                        v1::ListModulesResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

 private:
  template <typename Response>
  grpc::ServerUnaryReactor* Dispatch(grpc::CallbackServerContext* context, metrics::Rpc rpc,
                                     absl::StatusOr<std::unique_ptr<Job>> job, absl::Time arrival,
                                     Response* response);
  // OK, or UNAUTHENTICATED when a token is required and the call lacks it.
  absl::Status Authorize(const grpc::CallbackServerContext& context) const;
  // Finishes a call that is answered on the handler's thread, and records it.
  grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, metrics::Rpc rpc,
                                      absl::Time arrival, const absl::Status& status);

  const Options options_;
  ModuleRegistry* const modules_;
  Dispatcher* const dispatcher_;
  metrics::Metrics* const metrics_;
  const ServiceInfo info_;
};

// The call's deadline; absl::InfiniteFuture() when the caller set none.
absl::Time DeadlineOf(const grpc::CallbackServerContext& context);

// absl::Status -> grpc::Status (the canonical codes share their numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Fills a ModuleInfo from a loaded module.
void FillModuleInfo(const Module& module, v1::ModuleInfo* info);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
