// The gRPC service: validates requests at the boundary, hands jobs to the dispatcher and
// answers from the dispatcher's threads. Handlers never block: they run on gRPC's small
// callback pool, so anything that waits (queueing, computing) happens elsewhere.
#ifndef ATTNSERVE_SERVER_TRANSPORT_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_TRANSPORT_ATTENTION_SERVICE_H_

#include <atomic>
#include <string>

#include "attnserve/v1/attention.grpc.pb.h"
#include "kernels/backend.h"
#include "server/core/admission.h"
#include "server/core/call.h"
#include "server/core/dispatcher.h"
#include "server/core/drain.h"
#include "server/core/module_registry.h"
#include "server/core/tenant_calls.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/transport/attention_stream.h"
#include "server/transport/auth.h"
#include "server/transport/limits.h"
#include "server/transport/session_mover.h"

namespace attnserve::server {

// What GetServerInfo reports beyond what the service knows itself.
struct ServiceInfo {
  std::string version;
  std::string float32_precision;
  v1::BatchingSettings batching;
  std::vector<v1::BackendInfo> backends;  // every backend present; one marked active
};

// The compute rpcs take their messages as bytes and parse them here, so that a message that
// does not parse is answered INVALID_ARGUMENT (and counted) rather than by gRPC's generic
// error, and so that a stream can tell a bad message from the end of its input.
using Rpcs = v1::AttentionService;
using AttentionServiceBase =
    Rpcs::WithCallbackMethod_LoadModule<Rpcs::WithCallbackMethod_UnloadModule<
        Rpcs::WithCallbackMethod_ListModules<Rpcs::WithCallbackMethod_GetServerInfo<
            Rpcs::WithRawCallbackMethod_Attend<Rpcs::WithRawCallbackMethod_MultiHeadAttention<
                Rpcs::WithRawCallbackMethod_AttentionStream<Rpcs::WithCallbackMethod_CreateSession<
                    Rpcs::WithRawCallbackMethod_ExtendSession<
                        Rpcs::WithRawCallbackMethod_ExtendSessions<
                            Rpcs::WithCallbackMethod_ForkSession<
                                Rpcs::WithCallbackMethod_CloseSession<
                                    Rpcs::WithCallbackMethod_GetSession<
                                        Rpcs::WithCallbackMethod_ListSessions<
                                            Rpcs::WithCallbackMethod_MoveSession<
                                                Rpcs::WithRawCallbackMethod_AcceptSessions<
                                                    Rpcs::Service>>>>>>>>>>>>>>>>;

class WorkThread;            // attention_service.cc
class StreamedUnaryReactor;  // attention_service.cc

// Thread-safe. Does not own its collaborators; they outlive it. Every request has one Call
// (call.h) that owns its life; the handlers here only say how to respond.
class AttentionService final : public AttentionServiceBase {
 public:
  struct Options {
    Limits limits;
    // False: LoadModule and UnloadModule answer PERMISSION_DENIED.
    bool allow_module_rpc = true;
    // Who is calling (auth.h; not owned, outlives the service): calls it does not
    // authenticate are answered UNAUTHENTICATED. Null: every caller is the anonymous tenant
    // with every role. (Health and reflection stay open for probes.)
    const Authenticator* auth = nullptr;
    // The server's drain (core/drain.h; not owned, outlives the service; required): once it
    // has begun, new compute calls are answered UNAVAILABLE before their requests are read,
    // and streams stop reading and end once their requests are answered.
    Drain* drain = nullptr;
    // Moves sessions to the server's peers (session_mover.h; not owned, outlives the service).
    // Null: MoveSession answers FAILED_PRECONDITION (no --session_peers).
    SessionMover* mover = nullptr;
  };

  // Every rpc is counted in `metrics` (by rpc and code, with its server time). `sessions`
  // holds the decode sessions.
  AttentionService(const Options& options, ModuleRegistry* modules, Dispatcher* dispatcher,
                   sessions::SessionManager* sessions, metrics::Metrics* metrics, ServiceInfo info);
  // Waits for module loads in progress.
  ~AttentionService() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionStream(
      grpc::CallbackServerContext* context) override;
  // The unary rpcs: Rpc(grpc::CallbackServerContext*, const v1::RpcRequest*, v1::RpcResponse*).
#define ATTNSERVE_UNARY_RPC(Rpc)                                                              \
  grpc::ServerUnaryReactor* Rpc(grpc::CallbackServerContext* context,                         \
                                const v1::Rpc##Request* request, v1::Rpc##Response* response) \
      override
  ATTNSERVE_UNARY_RPC(LoadModule);
  ATTNSERVE_UNARY_RPC(UnloadModule);
  ATTNSERVE_UNARY_RPC(ListModules);
  ATTNSERVE_UNARY_RPC(GetServerInfo);
  ATTNSERVE_UNARY_RPC(CreateSession);
  ATTNSERVE_UNARY_RPC(ForkSession);
  ATTNSERVE_UNARY_RPC(CloseSession);
  ATTNSERVE_UNARY_RPC(GetSession);
  ATTNSERVE_UNARY_RPC(ListSessions);
  ATTNSERVE_UNARY_RPC(MoveSession);
#undef ATTNSERVE_UNARY_RPC
  // Raw: each chunk's bytes go from gRPC's slices into the session pool's pages with no copy
  // of their own.
  grpc::ServerReadReactor<grpc::ByteBuffer>* AcceptSessions(grpc::CallbackServerContext* context,
                                                            grpc::ByteBuffer* response) override;

 private:
  // Serves the unary rpc `method` as a stream of one request and one response (see the
  // constructor) by ServeStreamed; `build` makes the request's Job.
  template <typename Request, typename Response, typename Build>
  void MarkStreamedUnary(const char* method, metrics::Rpc rpc, Build build);
  // Attend, MultiHeadAttention, ExtendSession and ExtendSessions (served as streams: see the
  // constructor): authorise and ask the dispatcher whether the call can be served, before its
  // request is read; then parse, validate, queue; answered by the Call.
  template <typename Request, typename Response, typename Build>
  StreamedUnaryReactor* ServeStreamed(grpc::CallbackServerContext* context, metrics::Rpc rpc,
                                      Build build);
  // The other rpcs, answered on the handler's thread: authorise, then `body` fills the
  // response and returns the status.
  template <typename Body>
  grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* context, metrics::Rpc rpc,
                                      Body body);

  absl::StatusOr<Identity> Authenticate(const grpc::CallbackServerContext& context) const;
  // OK when module rpcs are on and `who` is an admin; PERMISSION_DENIED saying which is not.
  absl::Status ModuleRpcAllowed(const Identity& who, absl::string_view rpc) const;
  // OK when `who` is an admin; PERMISSION_DENIED naming `rpc` otherwise.
  static absl::Status AdminOnly(const Identity& who, absl::string_view rpc);

  const Options options_;
  ModuleRegistry* const modules_;
  Dispatcher* const dispatcher_;
  sessions::SessionManager* const sessions_;
  metrics::Metrics* const metrics_;
  const ServiceInfo info_;
  // Calls of Compute's rpcs admitted and not yet answered.
  AdmissionGate admission_;
  TenantCalls tenant_calls_;  // calls in flight by tenant (in_flight= of the tenants file)
  // LoadModule parses up to max_module_bytes of safetensors: on this thread, not on one of
  // gRPC's few callback threads.
  std::unique_ptr<WorkThread> loader_;
  // MoveSession waits for its peer: on this thread (not the loader's, which a peer's move to
  // this replica must not wait behind).
  std::unique_ptr<WorkThread> mover_;
};

// Fills a ModuleInfo from a loaded module.
void FillModuleInfo(const Module& module, v1::ModuleInfo* info);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_ATTENTION_SERVICE_H_
