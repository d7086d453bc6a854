// Prometheus metrics of attnserve: one Metrics object, made in main and passed down by pointer.
//
// Where the server calls it (a handful of calls):
//
//   main:           auto metrics = Metrics::Create({.listen_address = flag, .version = ...});
//                   auto hook = metrics->OnScrape([&] { /* set device memory gauges */ });
//   rpc handler:    RequestScope scope(metrics, Rpc::kAttend);   // in flight from here
//                   ...                                          // compute, queue, etc.
//                   scope.Finish(static_cast<int>(status.error_code()));  // counted and timed
//   batcher:        metrics->RecordDropped(DropReason::kQueueFull);    // on a rejection
//                   metrics->SetQueued(requests, bytes);               // after a queue change
//                   metrics->ObserveQueueTime(dequeued - enqueued);    // per request
//                   metrics->ObserveBatch(batch_requests, batch_tokens);
//                   metrics->ForBackend(backend.name()).ObserveCompute(elapsed, flops);
//   module store:   metrics->SetModuleBytes(total_bytes);              // after load/unload
//
// Every family is prefixed `attnserve_`, in base units (seconds, bytes), and labelled only with
// values from small fixed sets (rpc, gRPC code, drop reason, backend, device): no request ids,
// no shapes. Distributions are histograms, not summaries, because histograms aggregate across
// replicas (sum the _bucket series, then histogram_quantile) and summaries cannot.
//
// Families (type, labels):
//   attnserve_request_duration_seconds   histogram {rpc}        server time per request
//   attnserve_requests_total             counter   {rpc, code}  finished requests
//   attnserve_requests_in_flight         gauge                  requests inside a handler
//   attnserve_requests_dropped_total     counter   {reason}     rejected / expired / cancelled /
//                                                                 shed / answered too late
//   attnserve_queued_requests            gauge                  requests waiting in the batcher
//   attnserve_queued_bytes               gauge                  their tensor bytes
//   attnserve_queue_duration_seconds     histogram              time from enqueue to dequeue
//   attnserve_batch_size_requests        histogram              requests per computed batch
//   attnserve_batch_size_tokens          histogram              query rows (B*Lq summed) per batch
//   attnserve_compute_duration_seconds   histogram {backend}    backend time per batch
//   attnserve_flops_total                counter   {backend}    floating-point operations done
//   attnserve_device_memory_used_bytes   gauge     {device}     used on the device (by anyone)
//   attnserve_device_memory_total_bytes  gauge     {device}     capacity of the device
//   attnserve_device_memory_pool_bytes   gauge     {device}     held by attnserve (+ KV pages)
//   attnserve_host_resident_memory_bytes gauge                  RSS, read at scrape time
//   attnserve_host_memory_limit_bytes    gauge                  cgroup limit, else MemTotal
//   attnserve_module_bytes               gauge                  bytes held by loaded modules
//   attnserve_build_info                 gauge     {version, backend, cuda}  always 1
// Decode sessions (server/sessions/), the gauges set at each scrape from the pool:
//   attnserve_session_pool_pages_used    gauge                  pages held by sessions
//   attnserve_session_pool_pages_capacity   gauge                  pages the pool holds at most
//   attnserve_session_pool_bytes_used    gauge                  bytes of the pages held (exact)
//   attnserve_session_pool_bytes_capacity   gauge                  the pool's budget
//   attnserve_session_pool_bytes_kept    gauge                  freed pages' bytes kept until idle
//   attnserve_session_pool_tokens        gauge                  tokens cached (shared once)
//   attnserve_session_pages_shared       gauge                  pages held by several sessions
//   attnserve_sessions_active            gauge                  open sessions
//   attnserve_sessions_lost_total        counter   {reason}     evicted / expired / device_reset /
//                                                                 restart (a snapshot's session
//                                                                 that did not come back)
//   attnserve_sessions_restored_total    counter                sessions a snapshot brought back
//   attnserve_session_snapshot_bytes_total counter  {op}        bytes of snapshots written (the
//                                                                 drain's) and restored (at start)
//   attnserve_sessions_moved_total       counter   {direction}  in / out: moved between replicas
//   attnserve_session_move_bytes_total   counter                bytes of the moves sent
//   attnserve_session_move_failures_total counter  {reason}     moves that failed (code of the
//                                                                 failure, e.g. UNAVAILABLE)
//   attnserve_session_move_pause_seconds histogram              how long a moved session could
//                                                                 not be extended
//   attnserve_session_tokens_appended_total counter {phase}     prefill / decode tokens
//   attnserve_session_extend_duration_seconds histogram {phase} compute time of an extend's
//                                                                 batch (per extend)
// Tenants (server/transport/auth.h). The label is bounded: a tenant of the tenants file by its
// name, "anonymous" for the anonymous (or shared-token) tenant, "other" for every tenant the
// file does not list (certificate names, tenants since removed):
//   attnserve_tenant_sessions            gauge     {tenant}     its open sessions (at a scrape)
//   attnserve_tenant_pool_bytes          gauge     {tenant}     bytes of the pages they hold
//   attnserve_tenant_sessions_evicted_total counter {tenant}    its sessions evicted
//   attnserve_tenant_refusals_total      counter   {tenant, reason}  sessions, max_share,
//                                                      pinned_share, in_flight (its limits),
//                                                      cross_tenant (another tenant's session)
//
// Thread-safety: every method of Metrics and of the handles it returns is thread-safe and
// non-blocking apart from short internal locks, so it may be called from gRPC handlers, the
// batcher thread and the exposer's HTTP threads at once. Recording never allocates after the
// label set has been seen once.
#ifndef ATTNSERVE_SERVER_METRICS_METRICS_H_
#define ATTNSERVE_SERVER_METRICS_METRICS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/status_codes.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
struct MetricFamily;
template <typename T>
class Family;
}  // namespace prometheus

namespace attnserve::metrics {

// The port of /metrics when the flag gives none: 9464, the port the OpenTelemetry Prometheus
// exporter registered, so it collides with neither gRPC (50051) nor Prometheus (9090).
inline constexpr int kDefaultMetricsPort = 9464;

// The rpcs of attnserve.v1.AttentionService; label values are the method names ("Attend").
enum class Rpc : int {
  kAttend,
  kMultiHeadAttention,
  kLoadModule,
  kUnloadModule,
  kListModules,
  kGetServerInfo,
  // AttentionStream messages that are neither request kind: unparseable bytes, or an item with
  // neither `attend` nor `multi_head_attention` set. Stream items that are Attend or
  // MultiHeadAttention requests count under those rpcs.
  kAttentionStream,
  kCreateSession,
  kExtendSession,
  kExtendSessions,
  kForkSession,
  kCloseSession,
  kGetSession,
  kListSessions,
  kMoveSession,
  kAcceptSessions,
};
inline constexpr int kNumRpcs = 16;
std::string_view RpcName(Rpc rpc);

// Canonical name of a gRPC / absl status code ("OK", "INVALID_ARGUMENT"); codes outside 0..16
// read as "UNKNOWN", as gRPC itself treats them. grpc::StatusCode and absl::StatusCode share
// these numbers, so callers pass static_cast<int>(status.error_code()).
inline constexpr int kNumCodes = kNumStatusCodes;
std::string_view CodeName(int code);

// Why a request was not computed. Label `reason` of attnserve_requests_dropped_total.
enum class DropReason : int {
  kQueueFull,   // "queue_full": rejected at admission, the queue holds its maximum requests
  kQueueBytes,  // "queue_bytes": rejected at admission, the queue holds its maximum bytes
  kDeadline,    // "deadline": expired in the queue before it could be computed
  kCancelled,   // "cancelled": the client cancelled it while it waited
  kShutdown,    // "shutdown": refused or abandoned because the server is stopping
  kUnmeetable,  // "unmeetable": refused at arrival, the queue ahead outlasts its deadline
  kFairShare,   // "fair_share": shed from a full queue to make room for another connection
  kLate,        // "late": computed, but its caller had gone (deadline passed or cancelled)
};
inline constexpr int kNumDropReasons = 8;
std::string_view DropReasonName(DropReason reason);

// Bucket upper bounds, in seconds, of the three duration histograms: 25 us * 2^k for
// k = 0..20, i.e. 25 us, 50 us, ... 13.1 s, 26.2 s (21 bounds, plus +Inf).
// Why: the cheapest call (GetServerInfo, a small Attend on the CPU) takes tens of microseconds
// of server time; the largest (long sequences, big batches, a queue backed up to its deadline)
// takes seconds to tens of seconds. Doubling keeps the count at 22 series per label set while
// histogram_quantile's linear interpolation stays within a factor 2 of the truth (in practice
// far closer); note an estimated p99 can exceed the largest observation by up to the width of
// its bucket, so checks against client-side timings should compare bucket bounds.
std::vector<double> DurationBucketsSeconds();
// Bucket upper bounds of the batch-size histograms: 1, 2, 4, ... 1024 requests and
// 1, 2, 4, ... 2^22 (about 4.2 M) tokens, a token being one query row (B*Lq per request). Powers
// of two because batch limits are usually set to powers of two, so a full batch lands exactly
// on a bound.
std::vector<double> BatchRequestsBuckets();
std::vector<double> BatchTokensBuckets();

struct MetricsOptions {
  // Where /metrics listens, "host:port" (e.g. "0.0.0.0:9464"; port 0 picks a free port, see
  // Metrics::listening_port()). Empty: no HTTP endpoint; the metrics are still recorded and
  // readable through Collect()/ExpositionText(), which is what unit tests use.
  std::string listen_address{};
  // Labels of attnserve_build_info.
  std::string version{};  // e.g. "0.1.0"
  std::string backend{};  // the serving backend's name(): "reference", "cpu", "cuda"
  bool cuda = false;      // whether this binary was built with the CUDA backend
  // HTTP threads of the endpoint. Default: 2, enough for one Prometheus plus a human.
  int http_threads = 2;
};

// Compute time and FLOPs of one backend. Obtained from Metrics::ForBackend; lives as long as
// the Metrics object that returned it. Thread-safe.
class BackendMetrics {
 public:
  // One call per Backend::Attend/MultiHead call: its wall time and the floating-point
  // operations it did (for attention 4*B*H*Lq*Lk*D, halved when causal, plus the projections'
  // 2*rows*in*out each). rate(attnserve_flops_total[1m]) is then the achieved FLOP/s.
  void ObserveCompute(absl::Duration elapsed, double flops);

 private:
  friend class Metrics;
  BackendMetrics(prometheus::Histogram* compute, prometheus::Counter* flops)
      : compute_(compute), flops_(flops) {}
  prometheus::Histogram* compute_;
  prometheus::Counter* flops_;
};

// Memory of one device. Obtained from Metrics::ForDevice; lives as long as the Metrics object.
class DeviceMetrics {
 public:
  // Sets all three gauges (bytes). Call it from an OnScrape callback so the values are fresh.
  void SetMemory(int64_t used_bytes, int64_t total_bytes, int64_t pool_held_bytes);

 private:
  friend class Metrics;
  DeviceMetrics(prometheus::Gauge* used, prometheus::Gauge* total, prometheus::Gauge* pool)
      : used_(used), total_(total), pool_(pool) {}
  prometheus::Gauge* used_;
  prometheus::Gauge* total_;
  prometheus::Gauge* pool_;
};

class Metrics {
 public:
  // Registers every family and, when options.listen_address is set, starts serving /metrics.
  // Errors: INVALID_ARGUMENT for http_threads < 1; UNAVAILABLE when the address cannot be
  // bound (in use, bad host), with the address in the message.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options);
  // Stops the endpoint, if any, and returns once its threads have (within milliseconds:
  // civetweb's listener, which would notice the stop only after up to 2 s, is woken up).
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The port /metrics listens on (the real one when asked for port 0); 0 without an endpoint.
  int listening_port() const { return listening_port_; }

  // --- Requests (gRPC handlers; RequestScope below does both) ---
  // A request entered a handler: attnserve_requests_in_flight + 1.
  void RequestStarted();
  // A request left its handler with `code` after `server_time`: in flight - 1, the request
  // counted under {rpc, code} and its time observed under {rpc}.
  void RequestFinished(Rpc rpc, int code, absl::Duration server_time);

  // --- Batcher ---
  // A request was not computed; `count` for a batch of them (e.g. the queue at shutdown).
  void RecordDropped(DropReason reason, int64_t count = 1);
  // The queue's current content; call after every change (under the batcher's lock is fine:
  // it only stores two numbers).
  void SetQueued(int64_t requests, int64_t bytes);
  // One observation per request taken from the queue: dequeue time - enqueue time.
  void ObserveQueueTime(absl::Duration queued);
  // One observation per batch handed to the backend.
  void ObserveBatch(int64_t requests, int64_t tokens);
  // The handle of backend `name` (its Backend::name()), made on first use. The reference stays
  // valid as long as this object; cheap enough to call per batch, cheaper to keep.
  BackendMetrics& ForBackend(std::string_view name);

  // --- Memory ---
  // Bytes held by all loaded modules (weights), set after each load and unload.
  void SetModuleBytes(int64_t bytes);
  // The handle of device `device`, a short stable id such as "cuda:0" (not the marketing name).
  DeviceMetrics& ForDevice(std::string_view device);

  // Runs `callback` at the start of every collection (each scrape of /metrics, each Collect()),
  // before the families are read, so that gauges it sets (device memory) are current. Host
  // memory needs no callback: Metrics refreshes it itself the same way. The callback runs on an
  // HTTP thread; it must be quick, thread-safe, and must not call OnScrape or destroy a
  // ScrapeHook. Destroying the returned hook unregisters the callback and waits for a run in
  // progress to end, so objects the callback uses may be destroyed after the hook.
  class ScrapeHook;
  [[nodiscard]] std::unique_ptr<ScrapeHook> OnScrape(std::function<void()> callback);

  // --- Decode sessions ---
  struct SessionPool {
    int64_t pages_used = 0, pages_total = 0, bytes_used = 0, bytes_total = 0, tokens = 0;
    int64_t pages_shared = 0, sessions = 0, bytes_kept = 0;
  };
  // The pool's gauges (from an OnScrape callback).
  void SetSessionPool(const SessionPool& pool);
  // A session was lost: reason "evicted" or "expired".
  void RecordSessionLost(std::string_view reason);
  // A snapshot restored at start (--session_snapshot_dir): `restored` sessions back, `lost` not.
  void RecordSessionsRestored(int64_t restored, int64_t lost);
  // Sessions moved between replicas: direction "in" or "out".
  void RecordSessionsMoved(std::string_view direction, int64_t sessions);
  // A session snapshot of `bytes` bytes: `op` "written" (a drain) or "restored" (at start).
  void RecordSnapshotBytes(std::string_view op, int64_t bytes);
  // A move sent: its bytes and the session's pause; or a move that failed, by its code's name.
  void RecordSessionMoveSent(int64_t bytes, absl::Duration pause);
  void RecordSessionMoveFailed(std::string_view code) ABSL_LOCKS_EXCLUDED(tenants_mu_);
  // Per tenant label (above), its sessions and pool bytes (from an OnScrape callback): labels
  // not given are set to 0.
  struct TenantUsage {
    int64_t sessions = 0, bytes = 0;
  };
  void SetTenantUsage(const std::map<std::string, TenantUsage, std::less<>>& usage)
      ABSL_LOCKS_EXCLUDED(tenants_mu_);
  void RecordTenantEviction(std::string_view tenant_label) ABSL_LOCKS_EXCLUDED(tenants_mu_);
  void RecordTenantRefusal(std::string_view tenant_label, std::string_view reason)
      ABSL_LOCKS_EXCLUDED(tenants_mu_);
  // Tokens appended to sessions by a committed extend: phase "prefill" or "decode".
  void RecordSessionTokens(std::string_view phase, int64_t tokens);
  // The compute time of the batch an extend ran in, by phase.
  void ObserveSessionExtend(std::string_view phase, absl::Duration elapsed);

  // --- Reading (tests, debugging) ---
  // What a scrape returns, after the same refresh a scrape does.
  std::vector<prometheus::MetricFamily> Collect() const;
  // The same in the Prometheus text exposition format (version 0.0.4).
  std::string ExpositionText() const;

 private:
  class Scraped;  // the Collectable that Exposer reads: refresh, then the registry
  explicit Metrics(const MetricsOptions& options);
  void RefreshBeforeCollect() const;
  prometheus::Counter& RequestCounter(Rpc rpc, int code);

  std::shared_ptr<prometheus::Registry> registry_;
  // Families (owned by registry_) and the children of fixed label sets, made once.
  prometheus::Family<prometheus::Counter>* requests_total_;
  prometheus::Family<prometheus::Histogram>* compute_duration_;
  prometheus::Family<prometheus::Counter>* flops_total_;
  prometheus::Family<prometheus::Gauge>* device_used_;
  prometheus::Family<prometheus::Gauge>* device_total_;
  prometheus::Family<prometheus::Gauge>* device_pool_;
  std::array<prometheus::Histogram*, kNumRpcs> request_duration_;
  // {rpc, code} children are made on first use so that a scrape is not 102 series of zeros;
  // the pointer is cached so later requests skip the family's lock and label hashing.
  std::array<std::atomic<prometheus::Counter*>, kNumRpcs * kNumCodes> request_counters_{};
  std::array<prometheus::Counter*, kNumDropReasons> dropped_;
  prometheus::Gauge* in_flight_;
  prometheus::Gauge* queued_requests_;
  prometheus::Gauge* queued_bytes_;
  prometheus::Histogram* queue_duration_;
  prometheus::Histogram* batch_requests_;
  prometheus::Histogram* batch_tokens_;
  prometheus::Gauge* host_resident_;
  prometheus::Gauge* host_limit_;
  prometheus::Gauge* module_bytes_;
  prometheus::Gauge* session_pages_used_;
  prometheus::Gauge* session_pages_total_;
  prometheus::Gauge* session_bytes_used_;
  prometheus::Gauge* session_bytes_kept_;
  prometheus::Gauge* session_bytes_total_;
  prometheus::Gauge* session_tokens_;
  prometheus::Gauge* session_pages_shared_;
  prometheus::Gauge* sessions_active_;
  std::array<prometheus::Counter*, 4> sessions_lost_;  // evicted, expired, device_reset, restart
  prometheus::Counter* sessions_restored_ = nullptr;
  std::array<prometheus::Counter*, 2> sessions_moved_;  // in, out
  std::array<prometheus::Counter*, 2> snapshot_bytes_;  // written, restored
  prometheus::Counter* session_move_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* session_move_failures_ = nullptr;
  prometheus::Histogram* session_move_pause_ = nullptr;
  std::array<prometheus::Counter*, 2> session_tokens_appended_;  // prefill, decode
  std::array<prometheus::Histogram*, 2> session_extend_duration_;

  prometheus::Family<prometheus::Gauge>* tenant_sessions_;
  prometheus::Family<prometheus::Gauge>* tenant_bytes_;
  prometheus::Family<prometheus::Counter>* tenant_evicted_;
  prometheus::Family<prometheus::Counter>* tenant_refusals_;
  Mutex tenants_mu_;
  std::set<std::string, std::less<>> tenant_labels_ ABSL_GUARDED_BY(tenants_mu_);  // gauged

  mutable Mutex handles_mu_;
  std::map<std::string, std::unique_ptr<BackendMetrics>, std::less<>> backends_
      ABSL_GUARDED_BY(handles_mu_);
  std::map<std::string, std::unique_ptr<DeviceMetrics>, std::less<>> devices_
      ABSL_GUARDED_BY(handles_mu_);

  // Held while callbacks run, so that ~ScrapeHook waits for a run in progress.
  mutable Mutex hooks_mu_;
  std::map<uint64_t, std::function<void()>> hooks_ ABSL_GUARDED_BY(hooks_mu_);
  uint64_t next_hook_id_ ABSL_GUARDED_BY(hooks_mu_) = 0;

  // Declared last: destroyed first, so no scrape runs while the members above go away.
  std::shared_ptr<Scraped> scraped_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int listening_port_ = 0;
  std::string listen_address_;  // options.listen_address, with an endpoint
};

// Unregisters its callback when destroyed (see Metrics::OnScrape).
class Metrics::ScrapeHook {
 public:
  ~ScrapeHook();
  ScrapeHook(const ScrapeHook&) = delete;
  ScrapeHook& operator=(const ScrapeHook&) = delete;

 private:
  friend class Metrics;
  ScrapeHook(Metrics* metrics, uint64_t id) : metrics_(metrics), id_(id) {}
  Metrics* metrics_;
  uint64_t id_;
};

// Times one request and keeps it counted in flight, for a handler or a callback reactor:
// construct it when the request arrives, call Finish with the final status code when the
// response is handed to gRPC. Thread-compatible (one request, one owner). Uses the steady
// clock; tests that need exact times call Metrics::RequestFinished directly.
class RequestScope {
 public:
  // REQUIRES: metrics outlives the scope.
  RequestScope(Metrics* metrics, Rpc rpc);
  // Without a Finish, records the request as UNKNOWN: every request that started is counted,
  // and a path that forgets to finish shows up as an error instead of vanishing.
  ~RequestScope();
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;

  // Records the request with its code; later calls do nothing.
  void Finish(int code);

 private:
  Metrics* metrics_;
  Rpc rpc_;
  std::chrono::steady_clock::time_point start_;
  bool finished_ = false;
};

}  // namespace attnserve::metrics

#endif  // ATTNSERVE_SERVER_METRICS_METRICS_H_
