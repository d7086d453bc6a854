#include "server/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/host_memory.h"

namespace attnserve::metrics {
namespace {

constexpr std::array<std::string_view, kNumRpcs> kRpcNames = {
    "Attend",        "MultiHeadAttention", "LoadModule",      "UnloadModule",
    "ListModules",   "GetServerInfo",      "AttentionStream", "CreateSession",
    "ExtendSession", "ExtendSessions",     "ForkSession",     "CloseSession",
    "GetSession",    "ListSessions",       "MoveSession",     "AcceptSessions",
};
constexpr int kUnknownCode = 2;
constexpr std::array<std::string_view, kNumDropReasons> kDropReasonNames = {
    "queue_full", "queue_bytes", "deadline",   "cancelled",
    "shutdown",   "unmeetable",  "fair_share", "late",
};

std::vector<double> PowersOf2(double first, int count) {
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) bounds.push_back(first * static_cast<double>(int64_t{1} << i));
  return bounds;
}

template <typename T>
prometheus::Family<T>& Build(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
  if constexpr (std::is_same_v<T, prometheus::Counter>) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
  } else {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
  }
}

}  // namespace

std::string_view RpcName(Rpc rpc) { return kRpcNames[static_cast<int>(rpc)]; }

std::string_view CodeName(int code) {
  const std::string_view name = StatusCodeName(code);
  return name.empty() ? StatusCodeName(kUnknownCode) : name;
}

std::string_view DropReasonName(DropReason reason) {
  return kDropReasonNames[static_cast<int>(reason)];
}

std::vector<double> DurationBucketsSeconds() { return PowersOf2(25e-6, 21); }
std::vector<double> BatchRequestsBuckets() { return PowersOf2(1, 11); }
std::vector<double> BatchTokensBuckets() { return PowersOf2(1, 23); }

// What the Exposer reads on each scrape: the refresh, then the registry. Exposer keeps only a
// weak_ptr, and Metrics destroys the Exposer before this, so `metrics_` is always alive here.
class Metrics::Scraped : public prometheus::Collectable {
 public:
  explicit Scraped(const Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return metrics_->Collect(); }

 private:
  const Metrics* metrics_;
};

namespace {

// Stops an endpoint and returns once it has. civetweb's listener thread notices the stop only
// when its poll() returns, which takes up to 2 s on an idle socket (SOCKET_TIMEOUT_QUANTUM); a
// connection makes it return, so one is made every few milliseconds until the stop is done.
void StopPromptly(std::unique_ptr<prometheus::Exposer> exposer, const std::string& address,
                  int port) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (port <= 0 || getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                               &hints, &addresses) != 0) {
    addresses = nullptr;  // cannot poke: the stop takes its time
  }
  std::atomic<bool> stopped{false};
  std::thread poke([&] {
    while (addresses != nullptr && !stopped.load()) {
      const int fd = socket(addresses->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        connect(fd, addresses->ai_addr, addresses->ai_addrlen);
        close(fd);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  exposer.reset();
  stopped.store(true);
  poke.join();
  if (addresses != nullptr) freeaddrinfo(addresses);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options) {
  if (options.http_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_threads must be at least 1; was ", options.http_threads));
  }
  std::unique_ptr<Metrics> metrics(new Metrics(options));
  if (!options.listen_address.empty()) {
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(
          options.listen_address, static_cast<size_t>(options.http_threads));
    } catch (const std::exception& e) {
      // civetweb throws when it cannot bind; a status lets main print it and exit cleanly.
      return absl::UnavailableError(
          absl::StrCat("cannot serve /metrics on ", options.listen_address, ": ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->scraped_);
    const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
    metrics->listening_port_ = ports.empty() ? 0 : ports.front();
    metrics->listen_address_ = options.listen_address;
  }
  return metrics;
}

Metrics::Metrics(const MetricsOptions& options)
    : registry_(std::make_shared<prometheus::Registry>()),
      scraped_(std::make_shared<Scraped>(this)) {
  using prometheus::Counter;
  using prometheus::Gauge;
  using prometheus::Histogram;
  prometheus::Registry& r = *registry_;

  auto& request_duration = Build<Histogram>(
      r, "attnserve_request_duration_seconds",
      "Server time per request, from arrival in the handler to the response handed to gRPC.");
  for (int i = 0; i < kNumRpcs; ++i) {
    request_duration_[i] =
        &request_duration.Add({{"rpc", std::string(kRpcNames[i])}}, DurationBucketsSeconds());
  }
  requests_total_ = &Build<Counter>(r, "attnserve_requests_total",
                                    "Finished requests by rpc and gRPC status code.");
  auto& dropped = Build<Counter>(
      r, "attnserve_requests_dropped_total",
      "Requests not computed: rejected at admission (queue_full, queue_bytes, shutdown), "
      "expired in the queue (deadline) or cancelled while queued (cancelled).");
  for (int i = 0; i < kNumDropReasons; ++i) {
    dropped_[i] = &dropped.Add({{"reason", std::string(kDropReasonNames[i])}});
  }
  in_flight_ = &Build<Gauge>(r, "attnserve_requests_in_flight",
                             "Requests inside an rpc handler (queued or computing).")
                    .Add({});
  queued_requests_ =
      &Build<Gauge>(r, "attnserve_queued_requests", "Requests waiting in the batcher's queue.")
           .Add({});
  queued_bytes_ = &Build<Gauge>(r, "attnserve_queued_bytes",
                                "Tensor bytes of the requests waiting in the batcher's queue.")
                       .Add({});
  queue_duration_ = &Build<Histogram>(r, "attnserve_queue_duration_seconds",
                                      "Time a request waited in the batcher's queue.")
                         .Add({}, DurationBucketsSeconds());
  batch_requests_ = &Build<Histogram>(r, "attnserve_batch_size_requests",
                                      "Requests per batch handed to the backend.")
                         .Add({}, BatchRequestsBuckets());
  batch_tokens_ = &Build<Histogram>(r, "attnserve_batch_size_tokens",
                                    "Query rows (B*Lq summed over requests) per batch.")
                       .Add({}, BatchTokensBuckets());
  compute_duration_ = &Build<Histogram>(r, "attnserve_compute_duration_seconds",
                                        "Backend wall time per batch, by backend.");
  flops_total_ = &Build<Counter>(
      r, "attnserve_flops_total",
      "Floating-point operations done, by backend; its rate is the achieved FLOP/s.");
  device_used_ = &Build<Gauge>(r, "attnserve_device_memory_used_bytes",
                               "Memory in use on the device, by any process.");
  device_total_ =
      &Build<Gauge>(r, "attnserve_device_memory_total_bytes", "Memory capacity of the device.");
  device_pool_ =
      &Build<Gauge>(r, "attnserve_device_memory_pool_bytes",
                    "Device memory held by attnserve: its buffers and the decode sessions' pages.");
  // The gauges with no labels, one row each.
  const struct {
    Gauge** gauge;
    const char* name;
    const char* help;
  } gauges[] = {
      {&host_resident_, "attnserve_host_resident_memory_bytes",
       "Resident set size of the attnserve process."},
      {&host_limit_, "attnserve_host_memory_limit_bytes",
       "Memory the process may use: its cgroup limit, else the host's MemTotal."},
      {&module_bytes_, "attnserve_module_bytes", "Bytes held by loaded modules."},
      {&session_pages_used_, "attnserve_session_pool_pages_used",
       "Pages of the session KV pool held by sessions."},
      {&session_pages_total_, "attnserve_session_pool_pages_capacity",
       "Pages the session KV pool holds at most (pool bytes over the page bytes of the largest "
       "head layout in use)."},
      {&session_bytes_used_, "attnserve_session_pool_bytes_used",
       "Bytes of the session KV pool's pages held by sessions."},
      {&session_bytes_total_, "attnserve_session_pool_bytes_capacity",
       "Bytes of the session KV pool (its budget)."},
      {&session_bytes_kept_, "attnserve_session_pool_bytes_kept",
       "Bytes of freed session pages whose memory the pool keeps for the next sessions, given "
       "back once the server is idle."},
      {&session_tokens_, "attnserve_session_pool_tokens",
       "Tokens cached in the session KV pool (a shared page's once)."},
      {&session_pages_shared_, "attnserve_session_pages_shared",
       "Pages of the session KV pool held by more than one session."},
      {&sessions_active_, "attnserve_sessions_active", "Open decode sessions."},
  };
  for (const auto& g : gauges) *g.gauge = &Build<Gauge>(r, g.name, g.help).Add({});
  auto& lost = Build<Counter>(r, "attnserve_sessions_lost_total",
                              "Decode sessions lost, by reason (evicted, expired, device_reset: "
                              "their KV pages were on a device the backend re-initialised; "
                              "restart: a snapshot's session that did not come back).");
  sessions_lost_ = {&lost.Add({{"reason", "evicted"}}), &lost.Add({{"reason", "expired"}}),
                    &lost.Add({{"reason", "device_reset"}}), &lost.Add({{"reason", "restart"}})};
  sessions_restored_ =
      &Build<Counter>(r, "attnserve_sessions_restored_total",
                      "Decode sessions a snapshot brought back at start (--session_snapshot_dir).")
           .Add({});
  auto& snapshot = Build<Counter>(r, "attnserve_session_snapshot_bytes_total",
                                  "Bytes of session snapshots (--session_snapshot_dir): written by "
                                  "the drain, restored at start.");
  snapshot_bytes_ = {&snapshot.Add({{"op", "written"}}), &snapshot.Add({{"op", "restored"}})};
  auto& moved = Build<Counter>(r, "attnserve_sessions_moved_total",
                               "Decode sessions moved between replicas (MoveSession, drains with "
                               "--session_peers): in, taken from a peer; out, sent to one.");
  sessions_moved_ = {&moved.Add({{"direction", "in"}}), &moved.Add({{"direction", "out"}})};
  session_move_bytes_ = &Build<Counter>(r, "attnserve_session_move_bytes_total",
                                        "Bytes of the session moves this replica sent.")
                             .Add({});
  session_move_failures_ = &Build<Counter>(
      r, "attnserve_session_move_failures_total",
      "Session moves that failed, by the code of the failure (the session stayed here).");
  session_move_pause_ =
      &Build<Histogram>(r, "attnserve_session_move_pause_seconds",
                        "How long a moved session could not be extended (the copy and the switch).")
           .Add({}, DurationBucketsSeconds());
  tenant_sessions_ = &Build<Gauge>(r, "attnserve_tenant_sessions",
                                   "Open decode sessions by tenant (a tenant of the tenants file, "
                                   "anonymous, or other).");
  tenant_bytes_ = &Build<Gauge>(r, "attnserve_tenant_pool_bytes",
                                "Bytes of the session pool's pages held by a tenant's sessions "
                                "(a page shared by two of its sessions counted twice).");
  tenant_evicted_ = &Build<Counter>(r, "attnserve_tenant_sessions_evicted_total",
                                    "Decode sessions of a tenant evicted for another's pages.");
  tenant_refusals_ = &Build<Counter>(
      r, "attnserve_tenant_refusals_total",
      "Calls of a tenant refused by its limits (sessions, max_share, pinned_share, in_flight) "
      "or for naming another tenant's session (cross_tenant).");
  auto& appended = Build<Counter>(r, "attnserve_session_tokens_appended_total",
                                  "Tokens appended to decode sessions, by phase (an extend of "
                                  "one token is a decode step, longer ones prefills).");
  session_tokens_appended_ = {&appended.Add({{"phase", "prefill"}}),
                              &appended.Add({{"phase", "decode"}})};
  auto& extend = Build<Histogram>(r, "attnserve_session_extend_duration_seconds",
                                  "Compute time of the batch a session extend ran in, by phase.");
  session_extend_duration_ = {&extend.Add({{"phase", "prefill"}}, DurationBucketsSeconds()),
                              &extend.Add({{"phase", "decode"}}, DurationBucketsSeconds())};
  Build<Gauge>(r, "attnserve_build_info", "Always 1; the labels describe the binary.")
      .Add({{"version", options.version},
            {"backend", options.backend},
            {"cuda", options.cuda ? "true" : "false"}})
      .Set(1);
  // Every rpc's OK series and the serving backend's series exist from the start, so rate()
  // has a baseline at the first request and the dashboard shows zeros rather than no data.
  for (int i = 0; i < kNumRpcs; ++i) RequestCounter(static_cast<Rpc>(i), 0);
  if (!options.backend.empty()) ForBackend(options.backend);
}

Metrics::~Metrics() {
  // Stop the HTTP threads before the families they read are destroyed.
  if (exposer_ != nullptr) StopPromptly(std::move(exposer_), listen_address_, listening_port_);
}

prometheus::Counter& Metrics::RequestCounter(Rpc rpc, int code) {
  if (code < 0 || code >= kNumCodes) code = kUnknownCode;
  std::atomic<prometheus::Counter*>& slot =
      request_counters_[static_cast<int>(rpc) * kNumCodes + code];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // Racing threads get the same child: Family::Add returns the existing one for equal labels.
    counter = &requests_total_->Add(
        {{"rpc", std::string(RpcName(rpc))}, {"code", std::string(StatusCodeName(code))}});
    slot.store(counter, std::memory_order_release);
  }
  return *counter;
}

void Metrics::RequestStarted() { in_flight_->Increment(); }

void Metrics::RequestFinished(Rpc rpc, int code, absl::Duration server_time) {
  in_flight_->Decrement();
  request_duration_[static_cast<int>(rpc)]->Observe(absl::ToDoubleSeconds(server_time));
  RequestCounter(rpc, code).Increment();
}

void Metrics::RecordDropped(DropReason reason, int64_t count) {
  dropped_[static_cast<int>(reason)]->Increment(static_cast<double>(count));
}

void Metrics::SetQueued(int64_t requests, int64_t bytes) {
  queued_requests_->Set(static_cast<double>(requests));
  queued_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::ObserveQueueTime(absl::Duration queued) {
  queue_duration_->Observe(absl::ToDoubleSeconds(queued));
}

void Metrics::ObserveBatch(int64_t requests, int64_t tokens) {
  batch_requests_->Observe(static_cast<double>(requests));
  batch_tokens_->Observe(static_cast<double>(tokens));
}

namespace {

// The handle of `key` in `handles`, made by make(labels) the first time, with labels
// {{label, key}}. Its caller holds the lock that guards `handles`.
template <typename Handle, typename Make>
Handle& FindOrMake(std::map<std::string, std::unique_ptr<Handle>, std::less<>>& handles,
                   const char* label, std::string_view key, Make make) {
  auto it = handles.find(key);
  if (it != handles.end()) return *it->second;
  std::unique_ptr<Handle> handle = make(prometheus::Labels{{label, std::string(key)}});
  return *handles.emplace(std::string(key), std::move(handle)).first->second;
}

}  // namespace

BackendMetrics& Metrics::ForBackend(std::string_view name) {
  MutexLock lock(&handles_mu_);
  return FindOrMake(backends_, "backend", name, [this](const prometheus::Labels& labels) {
    return std::unique_ptr<BackendMetrics>(new BackendMetrics(
        &compute_duration_->Add(labels, DurationBucketsSeconds()), &flops_total_->Add(labels)));
  });
}

void BackendMetrics::ObserveCompute(absl::Duration elapsed, double flops) {
  compute_->Observe(absl::ToDoubleSeconds(elapsed));
  flops_->Increment(flops);
}

void Metrics::SetModuleBytes(int64_t bytes) { module_bytes_->Set(static_cast<double>(bytes)); }

DeviceMetrics& Metrics::ForDevice(std::string_view device) {
  MutexLock lock(&handles_mu_);
  return FindOrMake(devices_, "device", device, [this](const prometheus::Labels& labels) {
    return std::unique_ptr<DeviceMetrics>(new DeviceMetrics(
        &device_used_->Add(labels), &device_total_->Add(labels), &device_pool_->Add(labels)));
  });
}

void DeviceMetrics::SetMemory(int64_t used_bytes, int64_t total_bytes, int64_t pool_held_bytes) {
  used_->Set(static_cast<double>(used_bytes));
  total_->Set(static_cast<double>(total_bytes));
  pool_->Set(static_cast<double>(pool_held_bytes));
}

std::unique_ptr<Metrics::ScrapeHook> Metrics::OnScrape(std::function<void()> callback) {
  MutexLock lock(&hooks_mu_);
  const uint64_t id = next_hook_id_++;
  hooks_.emplace(id, std::move(callback));
  return std::unique_ptr<ScrapeHook>(new ScrapeHook(this, id));
}

Metrics::ScrapeHook::~ScrapeHook() {
  MutexLock lock(&metrics_->hooks_mu_);
  metrics_->hooks_.erase(id_);
}

void Metrics::RefreshBeforeCollect() const {
  // Read per scrape rather than by a timer: a few microseconds each, always current, and no
  // thread of our own to start and stop.
  host_resident_->Set(static_cast<double>(ReadResidentBytes()));
  host_limit_->Set(static_cast<double>(ReadMemoryLimitBytes()));
  MutexLock lock(&hooks_mu_);
  for (const auto& [id, callback] : hooks_) callback();
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  RefreshBeforeCollect();
  return registry_->Collect();
}

std::string Metrics::ExpositionText() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, Collect());
  return out.str();
}

void Metrics::SetSessionPool(const SessionPool& pool) {
  session_pages_used_->Set(static_cast<double>(pool.pages_used));
  session_pages_total_->Set(static_cast<double>(pool.pages_total));
  session_bytes_used_->Set(static_cast<double>(pool.bytes_used));
  session_bytes_total_->Set(static_cast<double>(pool.bytes_total));
  session_bytes_kept_->Set(static_cast<double>(pool.bytes_kept));
  session_tokens_->Set(static_cast<double>(pool.tokens));
  session_pages_shared_->Set(static_cast<double>(pool.pages_shared));
  sessions_active_->Set(static_cast<double>(pool.sessions));
}

void Metrics::SetTenantUsage(const std::map<std::string, TenantUsage, std::less<>>& usage) {
  MutexLock lock(&tenants_mu_);
  for (const std::string& label : tenant_labels_) {
    if (usage.find(label) == usage.end()) {
      tenant_sessions_->Add({{"tenant", label}}).Set(0);
      tenant_bytes_->Add({{"tenant", label}}).Set(0);
    }
  }
  for (const auto& [label, u] : usage) {
    tenant_labels_.insert(label);
    tenant_sessions_->Add({{"tenant", label}}).Set(static_cast<double>(u.sessions));
    tenant_bytes_->Add({{"tenant", label}}).Set(static_cast<double>(u.bytes));
  }
}

void Metrics::RecordTenantEviction(std::string_view tenant_label) {
  MutexLock lock(&tenants_mu_);  // Family::Add takes its own lock too; this one keeps it simple
  tenant_evicted_->Add({{"tenant", std::string(tenant_label)}}).Increment();
}

void Metrics::RecordTenantRefusal(std::string_view tenant_label, std::string_view reason) {
  MutexLock lock(&tenants_mu_);
  tenant_refusals_->Add({{"tenant", std::string(tenant_label)}, {"reason", std::string(reason)}})
      .Increment();
}

void Metrics::RecordSessionLost(std::string_view reason) {
  sessions_lost_[reason == "evicted" ? 0 : reason == "expired" ? 1 : 2]->Increment();
}

void Metrics::RecordSessionsRestored(int64_t restored, int64_t lost) {
  sessions_restored_->Increment(static_cast<double>(restored));
  sessions_lost_[3]->Increment(static_cast<double>(lost));
}

void Metrics::RecordSnapshotBytes(std::string_view op, int64_t bytes) {
  snapshot_bytes_[op == "written" ? 0 : 1]->Increment(static_cast<double>(bytes));
}

void Metrics::RecordSessionsMoved(std::string_view direction, int64_t sessions) {
  sessions_moved_[direction == "in" ? 0 : 1]->Increment(static_cast<double>(sessions));
}

void Metrics::RecordSessionMoveSent(int64_t bytes, absl::Duration pause) {
  session_move_bytes_->Increment(static_cast<double>(bytes));
  session_move_pause_->Observe(absl::ToDoubleSeconds(pause));
}

void Metrics::RecordSessionMoveFailed(std::string_view code) {
  MutexLock lock(&tenants_mu_);  // Family::Add takes its own lock too; this one keeps it simple
  session_move_failures_->Add({{"code", std::string(code)}}).Increment();
}

void Metrics::RecordSessionTokens(std::string_view phase, int64_t tokens) {
  session_tokens_appended_[phase == "prefill" ? 0 : 1]->Increment(static_cast<double>(tokens));
}

void Metrics::ObserveSessionExtend(std::string_view phase, absl::Duration elapsed) {
  session_extend_duration_[phase == "prefill" ? 0 : 1]->Observe(absl::ToDoubleSeconds(elapsed));
}

RequestScope::RequestScope(Metrics* metrics, Rpc rpc)
    : metrics_(metrics), rpc_(rpc), start_(std::chrono::steady_clock::now()) {
  metrics_->RequestStarted();
}

RequestScope::~RequestScope() { Finish(kUnknownCode); }

void RequestScope::Finish(int code) {
  if (finished_) return;
  finished_ = true;
  metrics_->RequestFinished(rpc_, code,
                            absl::FromChrono(std::chrono::steady_clock::now() - start_));
}

}  // namespace attnserve::metrics
