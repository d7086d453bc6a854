#include "server/transport/attention_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "server/sessions/session_import.h"
#include "server/transport/attention_stream.h"
#include "server/transport/auth.h"
#include "server/transport/request_builder.h"
#include "server/transport/wire.h"

namespace attnserve::server {
namespace {

// A unary call's reactor: holds the call's Caller (deadline, cancellation as it happens, which
// DefaultReactor cannot report) and deletes itself in OnDone. Its Call answers it.
class AnswerNowReactor final : public grpc::ServerUnaryReactor {
 public:
  AnswerNowReactor(const grpc::CallbackServerContext& context, Dispatcher* dispatcher)
      : caller_(context, dispatcher) {}
  Caller* caller() { return &caller_; }
  void OnCancel() override { caller_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  Caller caller_;
};

// AcceptSessions: the chunks of a transfer from another replica, each taken in as it arrives
// (sessions::SessionImport: pages into the pool on the thread of the read), committed at the
// sender's WritesDone. A chunk is read as bytes: its data field (AcceptSessionsRequest.data, the
// message's one field) goes from gRPC's slices into the import, with no copy of the message's
// own; anything else is parsed as the message. Holds the call's Caller; deletes itself (and so
// gives back what an import that did not commit holds) in OnDone.
class AcceptSessionsReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `admitted`: the caller's authorisation (not OK: answered at once).
  AcceptSessionsReactor(const grpc::CallbackServerContext& context, metrics::Metrics* metrics,
                        const absl::Status& admitted,
                        std::unique_ptr<sessions::SessionImport> import, grpc::ByteBuffer* response)
      : caller_(context, /*listener=*/nullptr),
        call_(
            metrics, metrics::Rpc::kAcceptSessions, &caller_,
            [this](const absl::Status& status, Job*, absl::Time) { Finish(ToGrpcStatus(status)); }),
        import_(std::move(import)),
        response_(response) {
    if (!admitted.ok()) {
      call_.Finish(admitted);
      return;
    }
    StartRead(&chunk_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender's WritesDone (or a cut connection: the transfer's length tells)
      absl::StatusOr<std::vector<std::string>> ids = import_->Commit();
      if (ids.ok()) {
        v1::AcceptSessionsResponse response;
        for (const std::string& id : *ids) response.add_session_ids(id);
        SerializeMessage(response, response_);
      }
      call_.Finish(ids.status());
      return;
    }
    if (absl::Status st = Take(); !st.ok()) {
      call_.Finish(std::move(st));  // the sender's next write fails: it sends no more
      return;
    }
    chunk_.Clear();
    StartRead(&chunk_);
  }
  void OnCancel() override { caller_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  // The chunk's data, to the import.
  absl::Status Take() {
    std::vector<grpc::Slice> slices;
    if (chunk_.Dump(&slices).ok()) {
      // Field 1, length-delimited: its tag (one byte), its length (a varint), its bytes.
      size_t slice = 0, at = 0;
      const auto next = [&](uint8_t* byte) {
        while (slice < slices.size() && at == slices[slice].size()) ++slice, at = 0;
        if (slice == slices.size()) return false;
        *byte = slices[slice].begin()[at++];
        return true;
      };
      uint8_t byte = 0;
      uint64_t length = 0;
      bool framed = next(&byte) && byte == ((v1::AcceptSessionsRequest::kDataFieldNumber << 3) | 2);
      for (int shift = 0; framed && shift < 64; shift += 7) {
        framed = next(&byte);
        length |= uint64_t{byte & 0x7Fu} << shift;
        if (framed && (byte & 0x80u) == 0) break;
      }
      uint64_t rest = 0;
      for (size_t i = slice; i < slices.size(); ++i)
        rest += slices[i].size() - (i == slice ? at : 0);
      if (framed && rest == length) {
        for (; slice < slices.size(); ++slice, at = 0) {
          const grpc::Slice& s = slices[slice];
          const absl::string_view bytes(reinterpret_cast<const char*>(s.begin()) + at,
                                        s.size() - at);
          if (absl::Status st = import_->Consume(bytes); !st.ok()) return st;
        }
        return absl::OkStatus();
      }
    }
    v1::AcceptSessionsRequest chunk;
    if (!ParseMessage(chunk_, &chunk)) {
      return absl::InvalidArgumentError("a AcceptSessionsRequest that does not parse");
    }
    return import_->Consume(chunk.data());
  }

  Caller caller_;
  Call call_;
  std::unique_ptr<sessions::SessionImport> import_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer chunk_;
};

// The index of rpc `name` in AttentionService, as the generated service numbers its methods
// (their order in attention.proto). A name the proto lacks is a programming error, caught by
// every test that starts a server: it aborts, naming it.
int MethodIndex(const char* name) {
  const google::protobuf::MethodDescriptor* m = v1::AttendRequest::descriptor()
                                                    ->file()
                                                    ->FindServiceByName("AttentionService")
                                                    ->FindMethodByName(name);
  if (m == nullptr) {
    std::fprintf(stderr, "attnserve: AttentionService has no rpc %s\n", name);
    std::abort();
  }
  return m->index();
}

}  // namespace

// An Attend or MultiHeadAttention call: unary for its caller, served as a stream of one request
// and one response, so that the service sees the call when its headers arrive, before its
// request is read. A call refused then (not authorised, the server draining, or its deadline
// unmeetable by the AdmissionGate) costs the server its headers and at most one flow-control window
// of its bytes, not the whole request (768 KiB for an Attend of [1, 8, 128, 64] float32): under a
// CPU quota, receiving the requests of refused calls was most of what overload cost (OVERLOAD.md).
// Holds the call's Caller; deletes itself in OnDone.
class StreamedUnaryReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Takes the call and its request's bytes (alive for the duration of the call only).
  using Serve = absl::AnyInvocable<void(std::unique_ptr<Call> call, const grpc::ByteBuffer& bytes)>;

  StreamedUnaryReactor(grpc::CallbackServerContext* context, Dispatcher* dispatcher)
      : context_(context), caller_(*context, dispatcher) {}
  Caller* caller() { return &caller_; }
  // Where the answer's message goes before Respond(OK).
  grpc::ByteBuffer* response() { return &response_; }

  // Reads the request, then gives it to `serve` with `call` (on gRPC's callback thread), and then
  // runs `read_done` (also when the read fails).
  void Read(std::unique_ptr<Call> call, Serve serve, absl::AnyInvocable<void()> read_done) {
    call_ = std::move(call);
    serve_ = std::move(serve);
    read_done_ = std::move(read_done);
    StartRead(&request_);
  }
  // The call's answer, once: response() and OK, or the status alone.
  void Respond(const absl::Status& status) {
    if (status.ok()) {
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(SessionAwareStatus(status, context_));
    }
  }
  // gRPC knows of a cancel (the caller's deadline, mostly) before OnCancel runs: a request cut
  // short by it is counted as what the caller saw, not as its mistake.
  void NoteCancellation() {
    if (context_->IsCancelled()) caller_.Cancel();
  }

  void OnReadDone(bool ok) override {
    std::unique_ptr<Call> call = std::move(call_);
    absl::AnyInvocable<void()> read_done = std::move(read_done_);
    if (!ok) {
      // Every unary caller sends its one message: a read fails when the call was cancelled or
      // broken (its deadline, mostly), which gRPC may report only later (OnCancel).
      caller_.Cancel();
      call->Finish(absl::CancelledError("the call ended before its request message arrived"));
    } else {
      serve_(std::move(call), request_);
      request_.Clear();  // parsed: the job holds its own copy
    }
    if (read_done) read_done();
  }
  void OnCancel() override { caller_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const context_;
  Caller caller_;
  std::unique_ptr<Call> call_;  // between Read() and OnReadDone
  Serve serve_;
  absl::AnyInvocable<void()> read_done_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

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

void FillModuleInfo(const Module& module, v1::ModuleInfo* info) {
  info->set_name(module.name);
  info->set_d_model(module.weights.d_model);
  info->set_num_heads(module.weights.num_heads);
  info->set_head_dim(module.weights.head_dim());
  info->set_parameter_bytes(module.weights.bytes());
  info->set_source(module.source);
}

AttentionService::AttentionService(const Options& options, ModuleRegistry* modules,
                                   Dispatcher* dispatcher, sessions::SessionManager* sessions,
                                   metrics::Metrics* metrics, ServiceInfo info)
    : options_(options),
      modules_(modules),
      dispatcher_(dispatcher),
      sessions_(sessions),
      metrics_(metrics),
      info_(std::move(info)),
      tenant_calls_(
          [auth = options.auth](const std::string& tenant) -> int64_t {
            return auth == nullptr ? 0 : auth->SharesOf(tenant).max_in_flight;
          },
          [auth = options.auth, metrics](const std::string& tenant) {
            metrics->RecordTenantRefusal(auth == nullptr ? "anonymous" : auth->Label(tenant),
                                         "in_flight");
          }),
      loader_(std::make_unique<WorkThread>()),
      mover_(std::make_unique<WorkThread>()) {
  // Attend, MultiHeadAttention, ExtendSession and ExtendSessions are unary for their callers,
  // served as a stream of one request and one response (StreamedUnaryReactor), marked by their
  // index in the service (MethodIndex).
  MarkStreamedUnary<v1::AttendRequest, v1::AttendResponse>(
      "Attend", metrics::Rpc::kAttend, [this](const v1::AttendRequest& r, const std::string&) {
        return BuildAttendJob(r, options_.limits);
      });
  MarkStreamedUnary<v1::MultiHeadAttentionRequest, v1::MultiHeadAttentionResponse>(
      "MultiHeadAttention", metrics::Rpc::kMultiHeadAttention,
      [this](const v1::MultiHeadAttentionRequest& r, const std::string&) {
        return BuildMultiHeadJob(r, *modules_, options_.limits);
      });
  MarkStreamedUnary<v1::ExtendSessionRequest, v1::ExtendSessionResponse>(
      "ExtendSession", metrics::Rpc::kExtendSession,
      [this](const v1::ExtendSessionRequest& r, const std::string& tenant) {
        return BuildExtendJob(r, tenant, *sessions_, options_.limits);
      });
  MarkStreamedUnary<v1::ExtendSessionsRequest, v1::ExtendSessionsResponse>(
      "ExtendSessions", metrics::Rpc::kExtendSessions,
      [this](const v1::ExtendSessionsRequest& r, const std::string& tenant) {
        return BuildExtendsJob(r, tenant, *sessions_, options_.limits);
      });
  metrics_->SetModuleBytes(modules_->TotalBytes());
}

template <typename Request, typename Response, typename Build>
void AttentionService::MarkStreamedUnary(const char* method, metrics::Rpc rpc, Build build) {
  using Handler = grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(MethodIndex(method),
                     new Handler([this, rpc, build](grpc::CallbackServerContext* context) {
                       return ServeStreamed<Request, Response>(context, rpc, build);
                     }));
}

template <typename Request, typename Response, typename Build>
StreamedUnaryReactor* AttentionService::ServeStreamed(grpc::CallbackServerContext* context,
                                                      metrics::Rpc rpc, Build build) {
  auto* reactor = new StreamedUnaryReactor(context, dispatcher_);
  // Before the Call counts the arrival (attnserve_requests_in_flight): a drain that begins once
  // the call is counted waits for its read (Drain::AwaitReads), and only a call that found the
  // drain begun here is refused for it. A call refused before its read ends the read on return;
  // one that is read, once its request is handed over.
  const bool drain_begun = options_.drain->BeginRead();
  absl::Cleanup refused_before_reading = [this] { options_.drain->EndRead(); };
  auto call = std::make_unique<Call>(
      metrics_, rpc, reactor->caller(),
      [reactor](const absl::Status& status, Job* job, absl::Time now) {
        if (status.ok()) {
          if constexpr (std::is_same_v<Response, v1::AttendResponse> ||
                        std::is_same_v<Response, v1::MultiHeadAttentionResponse>) {
            SerializeResponse<Response>(job, now, reactor->response());
          } else {
            Response response;
            FillResponse(*job, now, &response);
            ReleaseBuffers(job);
            SerializeMessage(response, reactor->response());
          }
        }
        reactor->Respond(status);
      });
  absl::StatusOr<Identity> who = Authenticate(*context);
  if (!who.ok()) {
    call->Finish(who.status());
    return reactor;
  }
  reactor->caller()->set_tenant(std::move(who->tenant));
  // Before the request's bytes are read: under overload most calls end here, at the cost of
  // their headers (tests/bench/OVERLOAD.md). The batcher is not asked here: what it refuses (a
  // drain, a long queue of compute) Submit refuses after the read, and asking it twice cost
  // server CPU on every call (tests/bench/cpu_per_call.sh, tiny calls, means of 3 rounds in two
  // runs on the loaded 2-core machine: 58 and 74 us per call with, 52 and 59 without).
  if (drain_begun) {
    // Before the gate, whose DEADLINE_EXCEEDED would not tell the caller to go elsewhere.
    call->Finish(absl::UnavailableError("the server is shutting down; retry on another replica"),
                 nullptr, metrics::DropReason::kShutdown);
    return reactor;
  }
  if (absl::Status s = admission_.Admit(call->arrival(), call->deadline()); !s.ok()) {
    call->Finish(std::move(s), nullptr, metrics::DropReason::kUnmeetable);
    return reactor;
  }
  call->HoldAdmission(&admission_);
  bool counted = false;
  if (absl::Status s = tenant_calls_.Acquire(call->caller().tenant(), &counted); !s.ok()) {
    call->Finish(std::move(s));
    return reactor;
  }
  if (counted) call->HoldTenantSlot(&tenant_calls_);
  std::move(refused_before_reading).Cancel();
  reactor->Read(
      std::move(call),
      [this, reactor, build](std::unique_ptr<Call> call, const grpc::ByteBuffer& bytes) {
        if (absl::Status s = CheckMessageSize(options_.limits, bytes.Length(),
                                              absl::StrCat("the ", Request::descriptor()->name()));
            !s.ok()) {
          call->Finish(std::move(s));
          return;
        }
        auto request = std::make_shared<Request>();  // the job's inputs are views into it
        if (!ParseMessage(bytes, request.get())) {
          // A message cut short by the caller's cancel (its deadline, mostly) is not the
          // caller's mistake: Call::Finish answers and counts it as what the caller saw.
          reactor->NoteCancellation();
          call->Finish(absl::InvalidArgumentError(
              absl::StrCat("the message (", bytes.Length(), " bytes) is not a valid ",
                           Request::descriptor()->full_name())));
          return;
        }
        absl::StatusOr<std::unique_ptr<Job>> job = build(*request, call->caller().tenant());
        if (!job.ok()) {
          reactor->NoteCancellation();
          call->Finish(job.status());
          return;
        }
        (*job)->request = std::move(request);
        (*job)->timing.arrival = call->arrival();
        (*job)->call = std::move(call);
        if (!HasWork(**job)) {
          (*job)->Finish(absl::OkStatus());  // every step failed validation: answered
          return;
        }
        dispatcher_->Submit(*std::move(job));
      },
      [this] { options_.drain->EndRead(); });
  return reactor;
}

template <typename Body>
grpc::ServerUnaryReactor* AttentionService::AnswerNow(grpc::CallbackServerContext* context,
                                                      metrics::Rpc rpc, Body body) {
  auto* reactor = new AnswerNowReactor(*context, /*dispatcher=*/nullptr);
  Call call(metrics_, rpc, reactor->caller(),
            [reactor, context](const absl::Status& status, Job*, absl::Time) {
              reactor->Finish(SessionAwareStatus(status, context));
            });
  absl::StatusOr<Identity> who = Authenticate(*context);
  call.Finish(who.ok() ? body(*who) : who.status());
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionService::AttentionStream(
    grpc::CallbackServerContext* context) {
  return new AttentionStreamReactor(context,
                                    {&options_.limits, modules_, dispatcher_, sessions_, metrics_,
                                     options_.drain, &tenant_calls_},
                                    Authenticate(*context));
}

AttentionService::~AttentionService() = default;

absl::StatusOr<Identity> AttentionService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  if (options_.auth == nullptr) return Identity{"", true, true};
  return options_.auth->Authenticate(context);
}

absl::Status AttentionService::ModuleRpcAllowed(const Identity& who, absl::string_view rpc) const {
  if (!options_.allow_module_rpc) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, " is switched off on this server (--allow_module_rpc=false)"));
  }
  return AdminOnly(who, rpc);
}

absl::Status AttentionService::AdminOnly(const Identity& who, absl::string_view rpc) {
  if (!who.admin) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, " needs the admin role, which tenant '", who.tenant, "' does not have"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AttentionService::LoadModule(grpc::CallbackServerContext* context,
                                                       const v1::LoadModuleRequest* request,
                                                       v1::LoadModuleResponse* response) {
  auto* reactor = new AnswerNowReactor(*context, /*dispatcher=*/nullptr);
  auto call = std::make_unique<Call>(metrics_, metrics::Rpc::kLoadModule, reactor->caller(),
                                     [reactor](const absl::Status& status, Job*, absl::Time) {
                                       reactor->Finish(ToGrpcStatus(status));
                                     });
  absl::StatusOr<Identity> who = Authenticate(*context);
  absl::Status status = who.ok() ? ModuleRpcAllowed(*who, "LoadModule") : who.status();
  if (status.ok()) {
    status = CheckMessageSize(options_.limits, static_cast<int64_t>(request->ByteSizeLong()),
                              "the LoadModuleRequest");
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
  return AnswerNow(context, metrics::Rpc::kUnloadModule, [&](const Identity& who) -> absl::Status {
    if (absl::Status s = ModuleRpcAllowed(who, "UnloadModule"); !s.ok()) return s;
    const absl::Status status = modules_->Remove(request->name());
    metrics_->SetModuleBytes(modules_->TotalBytes());
    return status;
  });
}

grpc::ServerUnaryReactor* AttentionService::ListModules(grpc::CallbackServerContext* context,
                                                        const v1::ListModulesRequest*,
                                                        v1::ListModulesResponse* response) {
  return AnswerNow(context, metrics::Rpc::kListModules, [&](const Identity&) {
    for (const auto& module : modules_->List()) FillModuleInfo(*module, response->add_modules());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AttentionService::GetServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetServerInfoRequest*,
                                                          v1::GetServerInfoResponse* response) {
  return AnswerNow(context, metrics::Rpc::kGetServerInfo, [&](const Identity&) {
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
    limits->set_max_sessions(sessions_->options().max_sessions);
    response->set_float32_precision(info_.float32_precision);
    const sessions::SessionOptions& so = sessions_->options();
    v1::SessionSettings* settings = response->mutable_sessions();
    settings->set_page_tokens(so.page_tokens);
    settings->set_pool_bytes(so.pool_bytes);
    settings->set_when_full(so.when_full == sessions::WhenFull::kRefuse
                                ? v1::WHEN_POOL_FULL_REFUSE
                                : v1::WHEN_POOL_FULL_EVICT_LRU);
    settings->set_idle_ttl_us(absl::ToInt64Microseconds(so.idle_ttl));
    settings->set_max_pinned_fraction(so.max_pinned_fraction);
    settings->set_owner(sessions_->owner());
    return absl::OkStatus();
  });
}

namespace {

// A session rpc's answer: the session's state written into `info`, or why there is none.
absl::Status WriteSession(const absl::StatusOr<sessions::SessionState>& state,
                          v1::SessionInfo* info) {
  if (!state.ok()) return state.status();
  WriteSessionInfo(*state, info);
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AttentionService::CreateSession(grpc::CallbackServerContext* context,
                                                          const v1::CreateSessionRequest* request,
                                                          v1::CreateSessionResponse* response) {
  return AnswerNow(context, metrics::Rpc::kCreateSession, [&](const Identity& who) -> absl::Status {
    auto spec = BuildSessionSpec(*request, *modules_, options_.limits);
    if (!spec.ok()) return spec.status();
    spec->tenant = who.tenant;
    return WriteSession(sessions_->Create(*spec), response->mutable_session());
  });
}

grpc::ServerUnaryReactor* AttentionService::ForkSession(grpc::CallbackServerContext* context,
                                                        const v1::ForkSessionRequest* request,
                                                        v1::ForkSessionResponse* response) {
  return AnswerNow(context, metrics::Rpc::kForkSession, [&](const Identity& who) -> absl::Status {
    if (request->idle_ttl_us() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("idle_ttl_us must be >= 0; was ", request->idle_ttl_us()));
    }
    return WriteSession(sessions_->Fork(who.tenant, request->session_id(), request->pinned(),
                                        absl::Microseconds(request->idle_ttl_us())),
                        response->mutable_session());
  });
}

grpc::ServerUnaryReactor* AttentionService::CloseSession(grpc::CallbackServerContext* context,
                                                         const v1::CloseSessionRequest* request,
                                                         v1::CloseSessionResponse*) {
  return AnswerNow(context, metrics::Rpc::kCloseSession, [&](const Identity& who) {
    return sessions_->Close(who.tenant, request->session_id());
  });
}

grpc::ServerUnaryReactor* AttentionService::GetSession(grpc::CallbackServerContext* context,
                                                       const v1::GetSessionRequest* request,
                                                       v1::GetSessionResponse* response) {
  return AnswerNow(context, metrics::Rpc::kGetSession, [&](const Identity& who) -> absl::Status {
    return WriteSession(sessions_->Get(who.tenant, request->session_id()),
                        response->mutable_session());
  });
}

grpc::ServerUnaryReactor* AttentionService::ListSessions(grpc::CallbackServerContext* context,
                                                         const v1::ListSessionsRequest* request,
                                                         v1::ListSessionsResponse* response) {
  return AnswerNow(context, metrics::Rpc::kListSessions, [&](const Identity& who) -> absl::Status {
    if (request->page_size() < 0 || request->page_size() > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_size must be in 0..1000; was ", request->page_size()));
    }
    // The token is the creation serial of the last session listed ("s<serial>").
    const std::string& token = request->page_token();
    uint64_t after = 0;
    if (!token.empty() &&
        (token[0] != 's' || !absl::SimpleAtoi(absl::string_view(token).substr(1), &after))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page_token must be a next_page_token this server returned; was '", token, "'"));
    }
    bool more = false;
    const int limit = request->page_size() == 0 ? 100 : request->page_size();
    uint64_t last = 0;
    for (const sessions::SessionState& st :
         sessions_->List(who.tenant, who.operator_role, after, limit, &more)) {
      WriteSessionInfo(st, response->add_sessions());
      last = st.serial;
    }
    if (more && last != 0) response->set_next_page_token(absl::StrCat("s", last));
    const sessions::PoolUsage u = sessions_->Usage();
    v1::SessionPoolUsage* usage = response->mutable_usage();
    usage->set_pages_total(u.pages_total);
    usage->set_pages_used(u.pages_used);
    usage->set_tokens(u.tokens);
    usage->set_sessions(u.sessions);
    usage->set_pinned_sessions(u.pinned_sessions);
    usage->set_pinned_pages(u.pinned_pages);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AttentionService::MoveSession(grpc::CallbackServerContext* context,
                                                        const v1::MoveSessionRequest* request,
                                                        v1::MoveSessionResponse* response) {
  auto* reactor = new AnswerNowReactor(*context, /*dispatcher=*/nullptr);
  auto call =
      std::make_unique<Call>(metrics_, metrics::Rpc::kMoveSession, reactor->caller(),
                             [reactor, context](const absl::Status& status, Job*, absl::Time) {
                               reactor->Finish(SessionAwareStatus(status, context));
                             });
  absl::StatusOr<Identity> who = Authenticate(*context);
  absl::Status status = who.ok() ? AdminOnly(*who, "MoveSession") : who.status();
  if (status.ok() && options_.mover == nullptr) {
    status = absl::FailedPreconditionError(
        "MoveSession needs --session_peers: this server has no peers to move sessions to");
  }
  if (!status.ok()) {
    call->Finish(std::move(status));
    return reactor;
  }
  // `request` and `response` live until the call finishes, which only the posted work does.
  mover_->Post([this, request, response, call = std::move(call)] {
    auto moved = options_.mover->Move(request->session_id(), request->peer());
    if (moved.ok()) {
      response->set_session_id(moved->id);
      response->set_bytes(moved->bytes);
      response->set_pause_us(absl::ToInt64Microseconds(moved->pause));
    }
    call->Finish(moved.status());
  });
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* AttentionService::AcceptSessions(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  absl::StatusOr<Identity> who = Authenticate(*context);
  const absl::Status admitted = who.ok() ? AdminOnly(*who, "AcceptSessions") : who.status();
  return new AcceptSessionsReactor(*context, metrics_, admitted,
                                   admitted.ok()
                                       ? sessions_->BeginImport([this](const std::string& name) {
                                           return modules_->Weights(name);
                                         })
                                       : nullptr,
                                   response);
}

}  // namespace attnserve::server
