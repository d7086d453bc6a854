#include "server/server_host.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/allocator.h"
#include "base/file.h"
#include "grpc/grpc.h"
#include "grpc/support/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"
#include "kernels/backend_factory.h"
#include "kernels/reference.h"
#include "server/version.h"

namespace attnserve::server {

absl::StatusOr<ModuleSpec> ParseModuleSpec(absl::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--module must be NAME=PATH or NAME=PATH:NUM_HEADS; was '", spec, "'"));
  }
  ModuleSpec out;
  out.name = std::string(spec.substr(0, eq));
  absl::string_view rest = spec.substr(eq + 1);
  const size_t colon = rest.rfind(':');
  if (colon != absl::string_view::npos &&
      absl::SimpleAtoi(rest.substr(colon + 1), &out.num_heads)) {
    rest = rest.substr(0, colon);
  } else {
    out.num_heads = 0;
  }
  out.path = std::string(rest);
  if (auto s = ModuleRegistry::ValidateName(out.name, "--module NAME"); !s.ok()) return s;
  if (out.path.empty() || out.num_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--module '", spec, "' has no valid PATH"));
  }
  return out;
}

namespace {

// One per call of the service: counts it open in the drain (core/drain.h) for its lifetime,
// and otherwise lets every step of the call proceed untouched.
class CallCountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CallCountingInterceptor(std::shared_ptr<Drain> drain) : drain_(std::move(drain)) {
    drain_->CallOpened();
  }
  ~CallCountingInterceptor() override { drain_->CallClosed(); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  const std::shared_ptr<Drain> drain_;
};

class CallCountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCountingFactory(std::shared_ptr<Drain> drain) : drain_(std::move(drain)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Health checks and reflection are not counted: a health Watch never ends by itself.
    if (!absl::StartsWith(info->method(), "/attnserve.v1.AttentionService/")) return nullptr;
    return new CallCountingInterceptor(drain_);
  }

 private:
  const std::shared_ptr<Drain> drain_;
};

// Runs one tiny request through the backend so the first caller does not pay for lazy
// initialisation (thread pools, device contexts).
absl::Status WarmUp(kernels::Backend& backend) {
  std::vector<float> q(2 * 8, 0.5f), out(2 * 8);
  kernels::AttentionParams p;
  p.batch = p.num_heads = p.num_kv_heads = 1;
  p.q_len = p.kv_len = 2;
  p.head_dim = p.v_head_dim = 8;
  p.q = p.k = p.v = {q.data(), 16, 16, 8};
  p.out = {out.data(), 16, 16, 8};
  p.scale = 0.35f;
  return backend.Attend({p});
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() && tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file must be given together (and --tls_client_ca_file "
        "needs both)");
  }
  auto cert = ReadFileToString(tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFileToString(tls.key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadFileToString(tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// The owner named in session ids when --session_owner is empty: the listening host and `port`,
// or the hostname for a wildcard address.
std::string SessionOwner(const std::string& listen_address, const std::string& port) {
  std::string host_name = listen_address.substr(0, listen_address.rfind(':'));
  if (host_name.empty() || host_name == "0.0.0.0" || host_name == "[::]" || host_name == "::") {
    char name[256] = {};
    host_name = gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
  }
  return absl::StrCat(host_name, ":", port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerHost>> ServerHost::Start(const ServerOptions& options,
                                                              metrics::Metrics* metrics) {
  auto backend = kernels::MakeBackend(options.backend, options.cpu_settings());
  if (!backend.ok()) return backend.status();
  return Start(options, *std::move(backend), metrics);
}

absl::StatusOr<std::unique_ptr<ServerHost>> ServerHost::Start(
    const ServerOptions& options, std::unique_ptr<kernels::Backend> backend,
    metrics::Metrics* metrics) {
  std::unique_ptr<ServerHost> host(new ServerHost());
  host->metrics_ = metrics;
  host->backend_ = std::move(backend);

  if (options.demo_module) {
    if (auto s = host->modules_.Add(DemoModule(), false); !s.ok()) return s;
  }
  for (const ModuleSpec& spec : options.modules) {
    auto bytes = ReadFileToString(spec.path);
    if (!bytes.ok()) return bytes.status();
    auto module = ModuleFromSafetensors(spec.name, absl::StrCat("file:", spec.path), *bytes,
                                        spec.num_heads, options.limits.max_module_bytes);
    if (!module.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--module ", spec.name, "=", spec.path, ": ", module.status().message()));
    }
    if (auto s = host->modules_.Add(*module, /*replace=*/true); !s.ok()) return s;
  }

  auto auth = Authenticator::Create(
      {options.auth_token, options.tenants_file, !options.tls.client_ca_file.empty()});
  if (!auth.ok()) return auth.status();
  host->auth_ = *std::move(auth);

  sessions::SessionOptions session_options = options.sessions;
  session_options.shares_of = [auth = host->auth_.get()](const std::string& tenant) {
    return auth->SharesOf(tenant);
  };
  session_options.tenant_label = [auth = host->auth_.get()](const std::string& tenant) {
    return auth->Label(tenant);
  };
  session_options.max_session_tokens = options.limits.max_sequence_length;
  session_options.backend = host->backend_.get();  // the pages live where it computes
  auto manager = sessions::SessionManager::Create(session_options, metrics);
  if (!manager.ok()) return manager.status();
  host->sessions_ = *std::move(manager);
  if (metrics != nullptr) {
    host->sessions_hook_ =
        metrics->OnScrape([metrics, sessions = host->sessions_.get(), auth = host->auth_.get()] {
          const sessions::PoolUsage u = sessions->Usage();
          metrics->SetSessionPool({.pages_used = u.pages_used,
                                   .pages_total = u.pages_total,
                                   .bytes_used = u.bytes_used,
                                   .bytes_total = u.bytes_total,
                                   .tokens = u.tokens,
                                   .pages_shared = u.shared_pages,
                                   .sessions = u.sessions,
                                   .bytes_kept = u.bytes_kept});
          std::map<std::string, metrics::Metrics::TenantUsage, std::less<>> by_label;
          for (const auto& t : sessions->UsageByTenant()) {
            metrics::Metrics::TenantUsage& l = by_label[auth->Label(t.tenant)];
            l.sessions += t.sessions;
            l.bytes += t.bytes;
          }
          metrics->SetTenantUsage(by_label);
        });
  }

  if (!options.session_snapshot_dir.empty()) host->RestoreSessions(options);

  if (!host->backend_->supports_linear_attention()) {
    // Linear attention, which the backend lacks, on the CPU (its recurrent form is O(L) and
    // memory-bound: a host's CPU cores do it well).
    auto cpu = kernels::MakeBackend("cpu", options.cpu_settings());
    if (!cpu.ok()) return cpu.status();
    host->fallback_ = *std::move(cpu);
  }
  host->executor_ =
      std::make_unique<Executor>(host->backend_.get(), host->fallback_.get(), metrics);
  auto dispatcher = BatchingDispatcher::Create(options.batching, host->executor_.get(), metrics);
  if (!dispatcher.ok()) return dispatcher.status();
  const batching::BatcherOptions& batcher = (*dispatcher)->options();
  host->dispatcher_ = *std::move(dispatcher);

  ServiceInfo info;
  info.version = kVersion;
  info.float32_precision = host->backend_->float32_precision();
  info.batching.set_enabled(options.batching.enabled);
  info.batching.set_max_batch_requests(batcher.max_batch_requests);
  info.batching.set_max_batch_tokens(batcher.max_batch_tokens);
  info.batching.set_max_queue_delay_us(absl::ToInt64Microseconds(batcher.max_queue_delay));
  info.batching.set_max_queued_requests(batcher.max_queued_requests);
  info.batching.set_max_queued_bytes(batcher.max_queued_bytes);
  info.batching.set_worker_threads(batcher.num_batch_threads);
  info.batching.set_inline_max_flops(options.batching.inline_max_flops);
  v1::BackendInfo* backend_info = &info.backends.emplace_back();
  backend_info->set_name(host->backend_->name());
  backend_info->set_active(true);
  for (const kernels::DeviceInfo& d : host->backend_->devices()) {
    v1::DeviceInfo* di = backend_info->add_devices();
    di->set_name(d.name);
    di->set_memory_bytes(d.memory_bytes);
  }
  if (host->fallback_ != nullptr) {
    v1::BackendInfo* fallback_info = &info.backends.emplace_back();
    fallback_info->set_name(host->fallback_->name());
    fallback_info->set_active(false);
  }
  AttentionService::Options service_options;
  service_options.limits = options.limits;
  service_options.limits.linear_attention =
      host->backend_->supports_linear_attention() || host->fallback_ != nullptr;
  service_options.limits.session_score_mods = host->backend_->supports_session_score_mods();
  service_options.allow_module_rpc = options.allow_module_rpc;
  service_options.auth = host->auth_.get();
  host->drain_ = std::make_shared<Drain>();
  service_options.drain = host->drain_.get();
  if (absl::Status st = CheckPeerOptions(options.session_peers); !st.ok()) return st;
  if (!options.session_peers.peers.empty()) {
    host->mover_ =
        std::make_unique<SessionMover>(host->sessions_.get(), options.session_peers, metrics);
    service_options.mover = host->mover_.get();
  }
  host->service_ =
      std::make_unique<AttentionService>(service_options, &host->modules_, host->dispatcher_.get(),
                                         host->sessions_.get(), metrics, std::move(info));

  if (metrics != nullptr) {
    // Device memory gauges, read from the backend at each scrape.
    for (const kernels::DeviceMemory& m : host->backend_->device_memory()) {
      metrics->ForDevice(m.device);  // the series exists from the start
    }
    host->memory_hook_ = metrics->OnScrape([metrics, backend = host->backend_.get()] {
      for (const kernels::DeviceMemory& m : backend->device_memory()) {
        metrics->ForDevice(m.device).SetMemory(m.used_bytes, m.total_bytes, m.pool_bytes);
      }
    });
  }

  if (auto s = WarmUp(*host->backend_); !s.ok()) {
    return absl::InternalError(absl::StrCat("backend warm-up failed: ", s.message()));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, *credentials, &host->port_);
  builder.SetMaxReceiveMessageSize(GrpcReceiveLimit(options.limits));
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_age)));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 30000);
  }
  // gRPC grows a connection's flow-control windows to its bandwidth-delay product (BDP probes), up
  // to megabytes per stream, so a client sends a whole request before the server has looked at
  // the call; without probes a call's bytes wait for the server to read them, beyond the first
  // 64 KiB, and a call refused at arrival costs its headers and that much (OVERLOAD.md).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  }
  if (options.transport_memory_bytes > 0) {
    grpc::ResourceQuota quota("attnserve");
    quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(host->service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CallCountingFactory>(host->drain_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  host->server_ = builder.BuildAndStart();
  if (host->server_ == nullptr || host->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen_address, "' (address in use?)"));
  }
  if (options.idle_release > absl::ZeroDuration()) {
    ServerHost* h = host.get();
    host->idle_releaser_ = std::make_unique<IdleReleaser>(
        options.idle_release, &host->idle_clock_, [h] { return h->drain_->activity(); },
        [h] {
          h->backend_->ReleaseIdleMemory();
          if (h->fallback_ != nullptr) h->fallback_->ReleaseIdleMemory();
          h->sessions_->ReleaseIdleMemory();
          AllocatorReleaseFreeMemory();
        });
  }
  if (options.sessions.owner.empty()) {
    host->sessions_->SetOwner(SessionOwner(options.listen_address, std::to_string(host->port_)));
  }
  if (host->restored_snapshot_) {
    // Restored once, and served from now on: a later crash must not bring these sessions back
    // as they were. (Had the start failed, the next one would restore them again.)
    std::remove(host->snapshot_path_.c_str());
  }
  host->server_->GetHealthCheckService()->SetServingStatus(true);
  return host;
}

void ServerHost::Shutdown(absl::Duration grace) {
  {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ == nullptr) {  // Start failed part-way
    if (dispatcher_ != nullptr) dispatcher_->Shutdown(absl::ZeroDuration());
    return;
  }
  const absl::Time grace_end = absl::Now() + grace;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (mover_ != nullptr) {
    // Moves come first, while this server still answers every call: a session's extends pause
    // only while it is copied (UNAVAILABLE "moving", then "session moved to" its new id, which
    // callers follow), and a call that names it later still learns where it went. No session
    // is created or forked meanwhile (Leave).
    sessions_->Leave();
    const absl::Time start = absl::Now();
    const SessionMover::Report r = mover_->MoveAll(grace_end);
    std::fprintf(stderr,
                 "attnserve: moved %lld sessions (%lld bytes) to %zu peers in %s, longest pause "
                 "%s; %lld not moved%s%s\n",
                 static_cast<long long>(r.moved), static_cast<long long>(r.bytes),
                 static_cast<size_t>(r.peers), absl::FormatDuration(absl::Now() - start).c_str(),
                 absl::FormatDuration(r.longest_pause).c_str(), static_cast<long long>(r.failed),
                 r.failed == 0 ? "" : ", first: ", r.first_failure.c_str());
  }
  // gRPC goes on accepting calls while the queue drains: the dispatcher refuses new requests
  // UNAVAILABLE from now on, with a message that says why. (gRPC's own shutdown would cancel some
  // of the calls that reach it in the meantime, and standard retry policies do not retry
  // CANCELLED.)
  // New unary calls are refused UNAVAILABLE before their requests are read; idle streams end
  // now, busy ones once their requests are answered (UNAVAILABLE: their callers retry elsewhere);
  // otherwise an open stream held the exit until the grace period ended.
  drain_->Begin();
  // Calls that arrived before the drain and whose requests are still arriving are handed to the
  // dispatcher before it stops taking work: they are computed within the grace period.
  drain_->AwaitReads(grace_end);
  dispatcher_->Shutdown(std::max(grace_end - absl::Now(), absl::ZeroDuration()));
  // Every queued request has been answered. gRPC stops accepting calls now (a caller then gets
  // UNAVAILABLE from its own channel) and lets the open ones finish. Once no AttentionService
  // call is open, what is left can only be health Watch streams, streams their callers hold open
  // and idle connections, which would hold a plain Server::Shutdown until its deadline:
  // cancelling them closes the connections at once. A second of slack after the grace period
  // for answers of the last batch still being written. (The C core is called directly because
  // Server::Shutdown has no step between "stop accepting" and "cancel at the deadline"; it
  // repeats the first idempotently.)
  grpc_completion_queue* shutdown_cq = grpc_completion_queue_create_for_next(nullptr);
  grpc_server_shutdown_and_notify(server_->c_server(), shutdown_cq, nullptr);
  drain_->AwaitNoCalls(std::max(grace_end, absl::Now()) + absl::Seconds(1));
  grpc_server_cancel_all_calls(server_->c_server());
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  // Shut down, the server has notified the queue: take that event and the queue's own end.
  grpc_completion_queue_shutdown(shutdown_cq);
  while (
      grpc_completion_queue_next(shutdown_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), nullptr).type !=
      GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(shutdown_cq);
  // Every call has been answered: no extend holds a session.
  if (!snapshot_path_.empty()) {
    const absl::Time start = absl::Now();
    auto written = sessions_->WriteSnapshot(snapshot_path_);
    if (written.ok()) {
      if (metrics_ != nullptr) metrics_->RecordSnapshotBytes("written", written->bytes);
      std::fprintf(stderr, "attnserve: wrote %lld sessions (%lld pages, %lld bytes) to %s in %s\n",
                   static_cast<long long>(written->sessions),
                   static_cast<long long>(written->pages), static_cast<long long>(written->bytes),
                   snapshot_path_.c_str(), absl::FormatDuration(absl::Now() - start).c_str());
    } else {
      std::fprintf(stderr, "attnserve: the sessions are lost: %s\n",
                   std::string(written.status().message()).c_str());
    }
  }
}

void ServerHost::RestoreSessions(const ServerOptions& options) {
  snapshot_path_ = options.session_snapshot_dir + "/sessions.snapshot";
  // The ids name the owner, which must be known before the first call: --session_owner, or the
  // host:port of a fixed port (a port picked at random names another replica each time).
  if (options.sessions.owner.empty()) {
    const std::string port = options.listen_address.substr(options.listen_address.rfind(':') + 1);
    if (port == "0") {
      std::fprintf(stderr,
                   "attnserve: %s not restored: listening on port 0, this replica's owner is not "
                   "known before it listens; set --session_owner\n",
                   snapshot_path_.c_str());
      return;
    }
    sessions_->SetOwner(SessionOwner(options.listen_address, port));
  }
  const absl::Time start = absl::Now();
  auto restored = sessions_->RestoreSnapshot(
      snapshot_path_, [this](const std::string& name) { return modules_.Weights(name); });
  if (restored.ok()) {
    std::fprintf(
        stderr, "attnserve: restored %lld sessions (%lld pages) from %s in %s; %lld lost%s%s\n",
        static_cast<long long>(restored->sessions), static_cast<long long>(restored->pages),
        snapshot_path_.c_str(), absl::FormatDuration(absl::Now() - start).c_str(),
        static_cast<long long>(restored->lost),
        restored->lost == 0 ? "" : ", first: ", restored->why_lost.c_str());
    restored_snapshot_ = true;  // removed once the server is up (Start)
    if (metrics_ != nullptr) {
      metrics_->RecordSessionsRestored(restored->sessions, restored->lost);
      metrics_->RecordSnapshotBytes("restored", restored->bytes);
    }
  } else if (!absl::IsNotFound(restored.status())) {
    // Kept aside for inspection (the next drain writes a new snapshot).
    const std::string refused = snapshot_path_ + ".refused";
    std::rename(snapshot_path_.c_str(), refused.c_str());
    std::fprintf(stderr, "attnserve: sessions not restored (kept as %s): %s\n", refused.c_str(),
                 std::string(restored.status().message()).c_str());
  }
}

void ServerHost::EndGracePeriod() {
  if (dispatcher_ != nullptr) dispatcher_->EndGracePeriod();
  // No more waiting for reads; the answers just given are written within milliseconds, and a
  // call still open after that (held open by its caller, or in a batch that is still
  // computing) is cancelled.
  if (drain_ != nullptr) drain_->Cut(absl::Now() + absl::Milliseconds(200));
}

absl::Status ServerHost::ReloadTenants() { return auth_->Reload(); }

ServerHost::~ServerHost() { Shutdown(absl::ZeroDuration()); }

}  // namespace attnserve::server
