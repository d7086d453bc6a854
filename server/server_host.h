// Assembles and runs a complete attnserve server: backend, module registry, dispatcher, the
// gRPC service with health checking and reflection. main() uses it, and so do the in-process
// tests, so both run the same wiring.
#ifndef ATTNSERVE_SERVER_SERVER_HOST_H_
#define ATTNSERVE_SERVER_SERVER_HOST_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "grpcpp/server.h"
#include "kernels/backend.h"
#include "kernels/backend_factory.h"
#include "server/core/dispatcher.h"
#include "server/core/drain.h"
#include "server/core/idle_release.h"
#include "server/core/module_registry.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/transport/attention_service.h"
#include "server/transport/limits.h"

namespace attnserve::server {

// A module to load at start-up: --module=NAME=PATH[:NUM_HEADS].
struct ModuleSpec {
  std::string name;
  std::string path;
  int num_heads = 0;  // 0: from the file's metadata
};
// Parses "NAME=PATH" or "NAME=PATH:NUM_HEADS"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<ModuleSpec> ParseModuleSpec(absl::string_view spec);

// Transport security. All empty: plaintext.
struct TlsOptions {
  std::string cert_file;       // PEM server certificate chain; REQUIRES key_file
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA: when set, clients must present a certificate it signed
                               // (mutual TLS)
};

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see ServerHost::port()).
  std::string listen_address = "0.0.0.0:50051";
  // "auto" (CPU), "cpu" or "reference".
  std::string backend = "auto";
  // Threads of the CPU backend; 0 = one per core.
  int backend_threads = 0;
  // How the CPU backend computes FLOAT32 (and FLOAT16) requests: "fp32" (exact float32) or
  // "bf16" (bfloat16 operands, float32 accumulation, where the CPU has AVX512_BF16; BFLOAT16
  // requests always are). Reported in GetServerInfo.float32_precision.
  std::string cpu_float32_precision = "fp32";
  // The CPU backend's work per thread of a parallel step (CpuBackendOptions::min_flops_per_thread;
  // 0 = every step on every thread).
  double cpu_min_flops_per_thread = kernels::CpuSettings{}.min_flops_per_thread;
  // The three above, as MakeBackend takes them.
  kernels::CpuSettings cpu_settings() const {
    return {backend_threads, cpu_float32_precision, cpu_min_flops_per_thread};
  }
  Limits limits;
  // The batcher's defaults, except that a batch waits for no companions: max_queue_delay 0
  // (measured in tests/bench/BATCHING.md).
  BatchingOptions batching = [] {
    BatchingOptions batching;
    batching.batcher.max_queue_delay = absl::ZeroDuration();
    return batching;
  }();
  bool allow_module_rpc = true;
  TlsOptions tls;
  // Non-empty: every AttentionService call must carry "authorization: Bearer <auth_token>",
  // and every caller with it is one tenant (server/transport/auth.h).
  std::string auth_token;
  // Non-empty: the tenants, their tokens and roles (server/transport/auth.h gives the format);
  // read again by ReloadTenants() and when it changes. Takes precedence over auth_token.
  std::string tenants_file;
  // Closes client connections after this long (plus a grace for calls in flight), so that clients
  // re-resolve DNS and spread over replicas added since. Zero: never.
  absl::Duration max_connection_age = absl::ZeroDuration();
  // On SIGTERM/SIGINT, how long queued work may take before what is left is answered
  // UNAVAILABLE (main's drain; ServerHost::Shutdown takes it as an argument).
  absl::Duration shutdown_grace = absl::Seconds(10);
  // Transport admission: what gRPC accepts before a call costs the server anything.
  // Most calls (HTTP/2 streams) open at once on one connection; a client's further calls wait
  // on its side (and expire there) instead of piling up in the server. This is what paces a
  // client's burst before its first answers: a fresh caller at 10x a small server's capacity
  // sends a deadline's worth of calls at once, which a server under a CPU quota cannot even
  // refuse in time; with 64 it sees 64 at a time and answers them (tests/bench/OVERLOAD.md:
  // median goodput 0.50 of capacity at 10x against 0.04 with 1024). Open streams
  // (AttentionStream, AcceptSessions) count too: a client that keeps more open spreads them over
  // more connections. 0: gRPC's default (no limit). Default: 64.
  int max_concurrent_streams = 64;
  // Memory gRPC may use for its buffers across all connections (grpc::ResourceQuota): under
  // pressure it stops reading from sockets. 0: unbounded. REQUIRES: 0 or above
  // limits.max_message_bytes. Default: 0.
  int64_t transport_memory_bytes = 0;
  // Decode sessions: the KV pool and its policies (flags --session_*; owner empty: the
  // listening host:port, the hostname for a wildcard address). max_sessions is a flag of its
  // own (--max_sessions); max_session_tokens is set from limits.max_sequence_length.
  sessions::SessionOptions sessions;
  // Non-empty: a folder where the drain writes the sessions (sessions.snapshot) once the last
  // call is answered, and from which the next server of the same owner restores them before
  // its first call (server/sessions/session_snapshot.cc). The file holds the pool's pages in
  // use plus under a kilobyte a session: the disk it needs is at most --session_pool_bytes.
  std::string session_snapshot_dir;
  // The replicas this one moves its sessions to (MoveSession; and a drain, before anything
  // else: server/transport/session_mover.h). A drain that cannot place a session writes it to
  // the snapshot, when there is one, else it is lost. Empty: no moves.
  PeerOptions session_peers;
  // Once no call has been open or arrived for this long, the memory kept between calls (the
  // backend's per-thread scratch, the allocator's free pages) goes back to the system
  // (server/core/idle_release.h). Zero: never. Default: 2 s.
  absl::Duration idle_release = absl::Seconds(2);
  // Register the built-in "demo" module.
  bool demo_module = true;
  std::vector<ModuleSpec> modules;
};

// Counts the AttentionService calls gRPC has open (server_host.cc).
// Thread-safe: Shutdown may be called from any thread, once or more.
class ServerHost {
 public:
  // Builds everything, loads modules, warms the backend up, starts listening and reports
  // SERVING on grpc.health.v1. Errors: a bad option, an unreadable module file, a port in use.
  // Computes on `backend`; `metrics` (not owned; outlives the host) records every request.
  static absl::StatusOr<std::unique_ptr<ServerHost>> Start(
      const ServerOptions& options, std::unique_ptr<kernels::Backend> backend,
      metrics::Metrics* metrics);
  // As above, with the backend MakeBackend(options.backend, options.cpu_settings()) makes.
  static absl::StatusOr<std::unique_ptr<ServerHost>> Start(const ServerOptions& options,
                                                           metrics::Metrics* metrics);
  ~ServerHost();

  // The port actually bound.
  int port() const { return port_; }
  ModuleRegistry& modules() { return modules_; }
  sessions::SessionManager& sessions() { return *sessions_; }
  kernels::Backend& backend() { return *backend_; }

  // The drain. Reports NOT_SERVING on grpc.health.v1; from then on the service answers new
  // Attend/MultiHeadAttention requests UNAVAILABLE (gRPC keeps accepting calls while queued work
  // finishes, so a late caller gets a code retry policies retry, not CANCELLED); computes what is
  // queued for up to `grace` and answers the rest UNAVAILABLE; waits until no AttentionService
  // call is open (at most until `grace` + 1 s, for answers still being written); then stops
  // gRPC, which cancels what is left (health Watch streams, streams held open by their callers)
  // and closes the connections. Returns when all of that is done: at once when idle.
  void Shutdown(absl::Duration grace);

  // Reads the tenants file again (SIGHUP): OK, or why the table in force stays.
  absl::Status ReloadTenants();

  // Cuts a Shutdown() running on another thread short (a second SIGTERM): what is still queued
  // is answered UNAVAILABLE now, and gRPC waits for open calls no more than 200 ms longer;
  // Shutdown() returns once the batch being computed, if any, is done too. May precede
  // Shutdown() (which then drains nothing). Never blocks.
  void EndGracePeriod();

 private:
  ServerHost() = default;
  // Restores the sessions of options.session_snapshot_dir (Start, before the first call) and
  // sets snapshot_path_, where Shutdown writes them.
  void RestoreSessions(const ServerOptions& options);

  metrics::Metrics* metrics_ = nullptr;  // not owned: outlives the host (may be null)
  std::unique_ptr<Authenticator> auth_;  // read by sessions_ and service_: goes last
  // The drain and the count of open calls (core/drain.h), shared with gRPC's interceptor
  // factory; read by service_ and idle_releaser_.
  std::shared_ptr<Drain> drain_;
  std::unique_ptr<kernels::Backend> backend_;
  // The CPU backend, for what backend_ lacks (linear attention, for a backend without it: none
  // of the shipped ones since the CUDA backend has its kernel); null when backend_ has it all.
  std::unique_ptr<kernels::Backend> fallback_;
  std::unique_ptr<metrics::Metrics::ScrapeHook> memory_hook_;  // reads backend_: declared after
  ModuleRegistry modules_;
  std::unique_ptr<Executor> executor_;
  // Before the dispatcher: its jobs hold session leases, so it goes first.
  std::unique_ptr<sessions::SessionManager> sessions_;
  std::unique_ptr<metrics::Metrics::ScrapeHook> sessions_hook_;  // reads sessions_
  std::unique_ptr<SessionMover> mover_;  // reads sessions_; null without peers
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<AttentionService> service_;

  std::unique_ptr<grpc::Server> server_;
  batching::RealClock idle_clock_;
  // Reads drain_, backend_, fallback_, sessions_: goes first.
  std::unique_ptr<IdleReleaser> idle_releaser_;
  int port_ = 0;
  std::string snapshot_path_;  // empty: no snapshots
  bool restored_snapshot_ = false;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVER_HOST_H_
