// attnserve: the server binary. Flags configure everything; see --help.
//
// Signals. SIGTERM and SIGINT start a drain (ServerHost::Shutdown); the process exits 0 once it
// is done. A second SIGTERM or SIGINT during the drain cuts it short (ServerHost::EndGracePeriod):
// queued requests are answered UNAVAILABLE, gRPC waits for open calls 200 ms more at most, and the
// process exits with status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT) within
// kForcedExitWait, leaving a batch still computing behind if need be (its callers see the
// connection close, which gRPC clients report as UNAVAILABLE).
//
// The signals are blocked in every thread and taken by the main thread with sigwait: no handler,
// no async-signal-safety concerns. Blocking them in main() would be too late: a thread inherits
// its creator's mask, and libopenblas starts its thread pool in its library constructor, which
// runs before main() and before the executable's own static constructors. So they are blocked
// from .preinit_array, which the dynamic loader runs before any library constructor. (A thread
// with the signals unblocked receives them whenever the main thread is not inside sigwait, and
// the default action kills the process: that is how a second SIGTERM used to kill it at once.)
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/allocator.h"
#include "base/file.h"
#include "base/flags_usage.h"
#include "server/server_host.h"
#include "server/version.h"

// The defaults of the flags that set ServerOptions are ServerOptions' own (server_host.h).
static const attnserve::server::ServerOptions kDefaults;

ABSL_FLAG(std::string, listen, kDefaults.listen_address,
          "host:port for gRPC; port 0 picks a free one");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "host:port serving Prometheus /metrics; empty = no endpoint");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written to this file once the server is SERVING");
ABSL_FLAG(
    std::string, backend, kDefaults.backend,
    "compute backend: auto (CUDA when a device is present, else CPU), cuda, cpu, reference, or "
    "sleep:US (cpu's answers, each batch at least US microseconds per request: for tests)");
ABSL_FLAG(int, backend_threads, kDefaults.backend_threads,
          "threads of the CPU backend; 0 = one per core this process may use (its CPU affinity "
          "within its cgroup's CPU limit, rounded up: a Kubernetes CPU limit of 0.5 gives 1)");
ABSL_FLAG(std::string, cpu_float32_precision, kDefaults.cpu_float32_precision,
          "CPU backend, FLOAT32 and FLOAT16 requests: fp32 (exact) or bf16 (bfloat16 operands, "
          "float32 accumulation, on CPUs with AVX512_BF16)");
ABSL_FLAG(double, cpu_min_flops_per_thread, kDefaults.cpu_min_flops_per_thread,
          "CPU backend: a parallel step gets one thread per this many floating-point operations "
          "(at least 1, at most --backend_threads): smaller shares do not pay for waking a "
          "thread; 0 = every step on every thread");
ABSL_FLAG(std::vector<std::string>, module, {},
          "modules to load at start-up, NAME=PATH[:NUM_HEADS] (safetensors), comma-separated");
ABSL_FLAG(bool, demo_module, kDefaults.demo_module,
          "register the built-in 'demo' module (d_model 64, 4 heads)");
ABSL_FLAG(bool, allow_module_rpc, kDefaults.allow_module_rpc,
          "allow LoadModule/UnloadModule over the API");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.limits.max_message_bytes,
          "largest request message, bytes");
ABSL_FLAG(int64_t, max_tensor_elements, kDefaults.limits.max_tensor_elements,
          "largest tensor, elements");
ABSL_FLAG(int64_t, max_sequence_length, kDefaults.limits.max_sequence_length, "largest Lq or Lk");
ABSL_FLAG(int64_t, max_module_bytes, kDefaults.limits.max_module_bytes,
          "largest module weights, bytes");
ABSL_FLAG(bool, batching, kDefaults.batching.enabled,
          "batch requests dynamically; false: compute each alone");
ABSL_FLAG(int, max_batch_requests, kDefaults.batching.batcher.max_batch_requests,
          "most requests in one batch");
ABSL_FLAG(int64_t, max_batch_tokens, kDefaults.batching.batcher.max_batch_tokens,
          "most tokens (query rows, B*Lq each) in one batch");
ABSL_FLAG(int64_t, max_queue_delay_us,
          absl::ToInt64Microseconds(kDefaults.batching.batcher.max_queue_delay),
          "longest a request waits for companions before its batch leaves");
ABSL_FLAG(int, max_queued_requests, kDefaults.batching.batcher.max_queued_requests,
          "requests queued before UNAVAILABLE");
ABSL_FLAG(int64_t, max_queued_bytes, kDefaults.batching.batcher.max_queued_bytes,
          "bytes of queued requests before UNAVAILABLE");
ABSL_FLAG(int, batch_threads, kDefaults.batching.batcher.num_batch_threads,
          "threads computing batches (the backend parallelises inside one)");
ABSL_FLAG(double, inline_max_flops, kDefaults.batching.inline_max_flops,
          "requests of at most this many FLOPs are computed on the thread that received them "
          "when a batch thread would take them at once anyway (0 = never)");
ABSL_FLAG(int64_t, max_stream_in_flight, kDefaults.limits.max_stream_in_flight,
          "most requests of one stream in flight");
ABSL_FLAG(std::string, tls_cert_file, kDefaults.tls.cert_file,
          "PEM server certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key_file, kDefaults.tls.key_file, "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, kDefaults.tls.client_ca_file,
          "PEM CA: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token every call must carry ('authorization: Bearer <token>')");
ABSL_FLAG(
    std::string, tenants_file, "",
    "file naming the tenants, their bearer tokens (or their SHA-256) and roles, one a line: "
    "'<tenant> token:<token>|sha256:<hex>|cert [admin,operator,compute]' (docs/operations.md, "
    "Tenants); read again on SIGHUP and when it changes; overrides --auth_token_file");
ABSL_FLAG(int64_t, max_connection_age_ms, absl::ToInt64Milliseconds(kDefaults.max_connection_age),
          "close client connections after this long so clients re-resolve and spread over new "
          "replicas (0 = never)");
ABSL_FLAG(int, max_concurrent_streams, kDefaults.max_concurrent_streams,
          "most calls (HTTP/2 streams) open at once on one connection; 0 = no limit");
ABSL_FLAG(int64_t, transport_memory_bytes, kDefaults.transport_memory_bytes,
          "memory gRPC may use for its buffers over all connections (it stops reading sockets "
          "beyond); 0 = unbounded");
ABSL_FLAG(int64_t, idle_release_ms, absl::ToInt64Milliseconds(kDefaults.idle_release),
          "once no call has been open or arrived for this long, memory kept between calls goes "
          "back to the system; 0 = never");
ABSL_FLAG(int64_t, shutdown_grace_ms, absl::ToInt64Milliseconds(kDefaults.shutdown_grace),
          "on SIGTERM/SIGINT, time to finish queued work before answering it UNAVAILABLE");
ABSL_FLAG(int64_t, session_pool_bytes, kDefaults.sessions.pool_bytes,
          "bytes of the decode sessions' paged KV pool (K and V of every session): host memory, "
          "or GPU memory with --backend=cuda (mapped by the granule under the pages in use)");
ABSL_FLAG(int, session_page_tokens, kDefaults.sessions.page_tokens,
          "tokens per page of the session KV pool (1..4096)");
ABSL_FLAG(std::string, session_when_full,
          kDefaults.sessions.when_full == attnserve::server::sessions::WhenFull::kRefuse ? "refuse"
                                                                                         : "evict",
          "when an extend needs pages the pool lacks: 'evict' (idle unpinned sessions, least "
          "recently used first) or 'refuse' (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, session_idle_ttl_ms, absl::ToInt64Milliseconds(kDefaults.sessions.idle_ttl),
          "a session unused this long is lost (expired); also the longest a session may ask for");
ABSL_FLAG(double, session_max_pinned_fraction, kDefaults.sessions.max_pinned_fraction,
          "most of the pool pinned sessions may hold (0..1)");
ABSL_FLAG(int64_t, session_prefill_chunk_tokens, kDefaults.sessions.prefill_chunk_tokens,
          "new tokens of a prefill computed per batch; the rest goes back to the queue, behind "
          "the decode steps that arrived meanwhile");
ABSL_FLAG(std::string, session_owner, kDefaults.sessions.owner,
          "the replica's address in session ids (empty: the listening host:port, the hostname "
          "for a wildcard address); clients route a session's calls by it");
ABSL_FLAG(std::string, session_snapshot_dir, kDefaults.session_snapshot_dir,
          "a folder the drain writes the sessions to (sessions.snapshot, at most "
          "--session_pool_bytes), restored by the next server of the same owner (empty: off)");
ABSL_FLAG(std::vector<std::string>, session_peers, {},
          "comma-separated host:port of the replicas this one may move its sessions to: "
          "MoveSession, and a drain, which moves every session to them before it stops; "
          "dns:host:port stands for every address the name resolves to when a move starts (a "
          "headless Service's ready pods), this replica's own (--session_owner) left out");
ABSL_FLAG(std::string, session_peer_token_file, "",
          "file holding the bearer token sent to --session_peers (their AcceptSessions needs the "
          "admin role); empty: --auth_token_file's token, if any");
ABSL_FLAG(std::string, session_peer_ca_file, "",
          "PEM roots that verify the TLS certificates of --session_peers (empty: plaintext)");
ABSL_FLAG(std::string, session_peer_cert_file, "",
          "PEM certificate chain presented to --session_peers that require client certificates "
          "(their --tls_client_ca_file); needs --session_peer_key_file and --session_peer_ca_file");
ABSL_FLAG(std::string, session_peer_key_file, "", "PEM private key of --session_peer_cert_file");
ABSL_FLAG(std::string, session_peer_server_name, "",
          "the name the peers' TLS certificates are checked against instead of the address "
          "dialled (a dns: entry's addresses are pod IPs: name the Service the certificate is "
          "for); needs --session_peer_ca_file");
ABSL_FLAG(int64_t, max_sessions, kDefaults.sessions.max_sessions,
          "most decode sessions held at once");

namespace {

// SIGTERM, SIGINT and SIGUSR1 (the drain thread's wake-up call to the main thread).
sigset_t ControlSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGHUP);  // reload --tenants_file
  return signals;
}

void BlockControlSignals(int, char**, char**) {
  const sigset_t signals = ControlSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

// Run by the dynamic loader before any shared library's constructor (see the top of the file).
__attribute__((section(".preinit_array"),
               used)) void (*const block_control_signals)(int, char**,
                                                          char**) = &BlockControlSignals;

// After a second signal, how long the drain may still take (the batch being computed) before the
// process exits without it.
constexpr absl::Duration kForcedExitWait = absl::Seconds(1);

int Run() {
  using attnserve::server::ServerOptions;
  ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.backend_threads = absl::GetFlag(FLAGS_backend_threads);
  options.cpu_float32_precision = absl::GetFlag(FLAGS_cpu_float32_precision);
  options.cpu_min_flops_per_thread = absl::GetFlag(FLAGS_cpu_min_flops_per_thread);
  options.demo_module = absl::GetFlag(FLAGS_demo_module);
  options.allow_module_rpc = absl::GetFlag(FLAGS_allow_module_rpc);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.limits.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.limits.max_sequence_length = absl::GetFlag(FLAGS_max_sequence_length);
  options.limits.max_module_bytes = absl::GetFlag(FLAGS_max_module_bytes);
  options.limits.max_stream_in_flight = absl::GetFlag(FLAGS_max_stream_in_flight);
  options.batching.enabled = absl::GetFlag(FLAGS_batching);
  options.batching.batcher.max_batch_requests = absl::GetFlag(FLAGS_max_batch_requests);
  options.batching.batcher.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.batching.batcher.max_queue_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
  options.batching.batcher.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.batching.batcher.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  options.batching.batcher.num_batch_threads = absl::GetFlag(FLAGS_batch_threads);
  options.batching.inline_max_flops = absl::GetFlag(FLAGS_inline_max_flops);
  options.max_connection_age = absl::Milliseconds(absl::GetFlag(FLAGS_max_connection_age_ms));
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.transport_memory_bytes = absl::GetFlag(FLAGS_transport_memory_bytes);
  options.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  options.idle_release = absl::Milliseconds(absl::GetFlag(FLAGS_idle_release_ms));
  options.sessions.pool_bytes = absl::GetFlag(FLAGS_session_pool_bytes);
  options.sessions.page_tokens = absl::GetFlag(FLAGS_session_page_tokens);
  if (const std::string when = absl::GetFlag(FLAGS_session_when_full); when == "refuse") {
    options.sessions.when_full = attnserve::server::sessions::WhenFull::kRefuse;
  } else if (when == "evict") {
    options.sessions.when_full = attnserve::server::sessions::WhenFull::kEvictLru;
  } else {
    std::fprintf(stderr, "attnserve: --session_when_full must be 'evict' or 'refuse'; was '%s'\n",
                 when.c_str());
    return 2;
  }
  options.sessions.idle_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_session_idle_ttl_ms));
  options.sessions.max_pinned_fraction = absl::GetFlag(FLAGS_session_max_pinned_fraction);
  options.sessions.prefill_chunk_tokens = absl::GetFlag(FLAGS_session_prefill_chunk_tokens);
  options.sessions.owner = absl::GetFlag(FLAGS_session_owner);
  options.session_snapshot_dir = absl::GetFlag(FLAGS_session_snapshot_dir);
  options.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    auto token = attnserve::ReadFileToString(path);
    if (!token.ok()) {
      std::fprintf(stderr, "attnserve: --auth_token_file: %s\n", token.status().ToString().c_str());
      return 2;
    }
    options.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.auth_token.empty()) {
      std::fprintf(stderr, "attnserve: --auth_token_file %s is empty\n", path.c_str());
      return 2;
    }
  }
  options.tenants_file = absl::GetFlag(FLAGS_tenants_file);
  for (const std::string& peer : absl::GetFlag(FLAGS_session_peers)) {
    if (!peer.empty()) options.session_peers.peers.push_back(peer);
  }
  if (absl::Status st = attnserve::server::CheckPeerEntries(options.session_peers.peers);
      !st.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  options.session_peers.token = options.auth_token;
  if (const std::string path = absl::GetFlag(FLAGS_session_peer_token_file); !path.empty()) {
    auto token = attnserve::ReadFileToString(path);
    if (!token.ok()) {
      std::fprintf(stderr, "attnserve: --session_peer_token_file: %s\n",
                   token.status().ToString().c_str());
      return 2;
    }
    options.session_peers.token = std::string(absl::StripAsciiWhitespace(*token));
  }
  if (const std::string path = absl::GetFlag(FLAGS_session_peer_ca_file); !path.empty()) {
    auto pem = attnserve::ReadFileToString(path);
    if (!pem.ok()) {
      std::fprintf(stderr, "attnserve: --session_peer_ca_file: %s\n",
                   pem.status().ToString().c_str());
      return 2;
    }
    options.session_peers.ca_pem = *pem;
  }
  for (auto [flag, path, pem] :
       {std::tuple{"--session_peer_cert_file", absl::GetFlag(FLAGS_session_peer_cert_file),
                   &options.session_peers.cert_pem},
        std::tuple{"--session_peer_key_file", absl::GetFlag(FLAGS_session_peer_key_file),
                   &options.session_peers.key_pem}}) {
    if (path.empty()) continue;
    auto read = attnserve::ReadFileToString(path);
    if (!read.ok()) {
      std::fprintf(stderr, "attnserve: %s: %s\n", flag, read.status().ToString().c_str());
      return 2;
    }
    *pem = *std::move(read);
  }
  options.session_peers.server_name = absl::GetFlag(FLAGS_session_peer_server_name);
  if (absl::Status st = attnserve::server::CheckPeerOptions(options.session_peers); !st.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  for (const std::string& spec : absl::GetFlag(FLAGS_module)) {
    auto parsed = attnserve::server::ParseModuleSpec(spec);
    if (!parsed.ok()) {
      std::fprintf(stderr, "attnserve: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    options.modules.push_back(*parsed);
  }

  // Blocked since before main() (see the top); again here in case the loader did not run
  // .preinit_array (a static or sanitizer-wrapped start), before any thread of ours starts.
  const sigset_t signals = ControlSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const pthread_t main_thread = pthread_self();

  auto backend = attnserve::kernels::MakeBackend(options.backend, options.cpu_settings());
  if (!backend.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", backend.status().ToString().c_str());
    return 2;
  }
  // The one metrics object, passed down to everything that records.
  attnserve::metrics::MetricsOptions metrics_options;
  metrics_options.listen_address = absl::GetFlag(FLAGS_metrics_address);
  metrics_options.version = attnserve::server::kVersion;
  metrics_options.backend = (*backend)->name();
  metrics_options.cuda = attnserve::server::kHaveCuda;
  auto metrics = attnserve::metrics::Metrics::Create(metrics_options);
  if (!metrics.ok()) {
    std::fprintf(stderr, "attnserve: cannot serve metrics: %s\n",
                 metrics.status().ToString().c_str());
    return 1;
  }
  auto host = attnserve::server::ServerHost::Start(options, *std::move(backend), metrics->get());
  if (!host.ok()) {
    std::fprintf(stderr, "attnserve: cannot start: %s\n", host.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "attnserve: allocator %s\n", attnserve::AllocatorDescription().c_str());
  // The CPU backend's threads among them: one per core the process may use (--backend_threads).
  for (const attnserve::kernels::DeviceInfo& device : (*host)->backend().devices()) {
    std::fprintf(stderr, "attnserve: device %s\n", device.name.c_str());
  }
  std::vector<std::string> modules;
  for (const auto& m : (*host)->modules().List()) modules.push_back(m->name);
  std::fprintf(stderr,
               "attnserve %s: SERVING on port %d, backend %s, modules [%s], metrics on %s\n",
               attnserve::server::kVersion, (*host)->port(), (*host)->backend().name().c_str(),
               absl::StrJoin(modules, ", ").c_str(),
               (*metrics)->listening_port() > 0
                   ? absl::StrCat("port ", (*metrics)->listening_port(), " (/metrics)").c_str()
                   : "no port");
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    // Written to a temporary name and renamed, so a reader never sees a partial file.
    const std::string tmp = path + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%d\n", (*host)->port());
      std::fclose(f);
      std::rename(tmp.c_str(), path.c_str());
    }
  }

  int signal = 0;
  for (;;) {
    sigwait(&signals, &signal);
    if (signal == SIGUSR1) continue;
    if (signal != SIGHUP) break;
    const absl::Status reloaded = (*host)->ReloadTenants();
    std::fprintf(stderr, "attnserve: SIGHUP: %s\n",
                 reloaded.ok()
                     ? "tenants file read again"
                     : absl::StrCat("tenants file kept as it was: ", reloaded.message()).c_str());
  }
  std::fprintf(stderr, "attnserve: %s received; draining for up to %s\n", strsignal(signal),
               absl::FormatDuration(options.shutdown_grace).c_str());
  absl::Notification drained;
  std::thread drain([&] {
    (*host)->Shutdown(options.shutdown_grace);
    drained.Notify();
    pthread_kill(main_thread, SIGUSR1);  // wakes the sigwait below
  });
  int exit_code = 0;
  while (!drained.HasBeenNotified()) {
    sigwait(&signals, &signal);
    if (signal == SIGUSR1 || signal == SIGHUP || drained.HasBeenNotified()) continue;
    exit_code = 128 + signal;
    std::fprintf(stderr, "attnserve: %s received again; answering what is queued UNAVAILABLE\n",
                 strsignal(signal));
    (*host)->EndGracePeriod();
    if (!drained.WaitForNotificationWithTimeout(kForcedExitWait)) {
      std::fprintf(stderr, "attnserve: exiting with a batch still computing\n");
      std::fflush(nullptr);
      _exit(exit_code);  // the batch thread still runs: no destructor may run
    }
  }
  drain.join();
  host->reset();
  metrics->reset();  // stops /metrics at once (Metrics::~Metrics)
  std::fprintf(stderr, "attnserve: stopped\n");
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so absl::Mutex (gRPC's mutexes) checks every lock
  // against a process-wide lock graph under one global spin lock: 4-7 % of the server's CPU on
  // tiny calls (perf, tests/bench/SERVING.md). attnserve's own locks are std::mutex (base/mutex.h);
  // the tests keep the check on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  attnserve::ShowFlagsOfFileInHelp(__FILE__);  // --help lists the flags above
  absl::SetProgramUsageMessage(
      "attnserve: Transformer attention over gRPC.\n"
      "  attnserve --listen=0.0.0.0:50051 [--module=NAME=PATH[:NUM_HEADS],...]");
  absl::ParseCommandLine(argc, argv);
  return Run();
}
