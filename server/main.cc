// attnserve: the server binary. Flags configure everything; see --help.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/safetensors.h"
#include "server/server_host.h"
#include "server/version.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "host:port for gRPC; port 0 picks a free one");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "host:port serving Prometheus /metrics; empty = no endpoint");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written to this file once the server is SERVING");
ABSL_FLAG(
    std::string, backend, "auto",
    "compute backend: auto (CUDA when a device is present, else CPU), cuda, cpu or reference");
ABSL_FLAG(int, backend_threads, 0, "threads of the CPU backend; 0 = one per core");
ABSL_FLAG(std::string, cpu_float32_precision, "fp32",
          "CPU backend, FLOAT32 and FLOAT16 requests: fp32 (exact) or bf16 (bfloat16 operands, "
          "float32 accumulation, on CPUs with AVX512_BF16)");
ABSL_FLAG(std::vector<std::string>, module, {},
          "modules to load at start-up, NAME=PATH[:NUM_HEADS] (safetensors), comma-separated");
ABSL_FLAG(bool, demo_module, true, "register the built-in 'demo' module (d_model 64, 4 heads)");
ABSL_FLAG(bool, allow_module_rpc, true, "allow LoadModule/UnloadModule over the API");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{256} << 20, "largest request message, bytes");
ABSL_FLAG(int64_t, max_tensor_elements, int64_t{64} << 20, "largest tensor, elements");
ABSL_FLAG(int64_t, max_sequence_length, 65536, "largest Lq or Lk");
ABSL_FLAG(int64_t, max_module_bytes, int64_t{1} << 30, "largest module weights, bytes");
ABSL_FLAG(bool, batching, true, "batch requests dynamically; false: compute each alone");
ABSL_FLAG(int, max_batch_requests, 32, "most requests in one batch");
ABSL_FLAG(int64_t, max_batch_tokens, 4096, "most tokens (query rows, B*Lq each) in one batch");
ABSL_FLAG(int64_t, max_queue_delay_us, 0,
          "longest a request waits for companions before its batch leaves");
ABSL_FLAG(int, max_queued_requests, 1024, "requests queued before UNAVAILABLE");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{1} << 30,
          "bytes of queued requests before UNAVAILABLE");
ABSL_FLAG(int, batch_threads, 1, "threads computing batches (the backend parallelises inside one)");
ABSL_FLAG(int64_t, max_stream_in_flight, 256, "most requests of one stream in flight");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM server certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token every call must carry ('authorization: Bearer <token>')");
ABSL_FLAG(int64_t, max_connection_age_ms, 0,
          "close client connections after this long so clients re-resolve and spread over new "
          "replicas (0 = never)");
ABSL_FLAG(int64_t, shutdown_grace_ms, 10000,
          "on SIGTERM/SIGINT, time to finish queued work before answering it UNAVAILABLE");

namespace {

int Run() {
  using attnserve::server::ServerOptions;
  ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.backend_threads = absl::GetFlag(FLAGS_backend_threads);
  options.cpu_float32_precision = absl::GetFlag(FLAGS_cpu_float32_precision);
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
  options.max_connection_age = absl::Milliseconds(absl::GetFlag(FLAGS_max_connection_age_ms));
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    auto token = attnserve::kernels::ReadFileToString(path);
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
  for (const std::string& spec : absl::GetFlag(FLAGS_module)) {
    auto parsed = attnserve::server::ParseModuleSpec(spec);
    if (!parsed.ok()) {
      std::fprintf(stderr, "attnserve: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    options.modules.push_back(*parsed);
  }

  // Block the shutdown signals in every thread (gRPC's start after this), and wait for them
  // here with sigwait: no async-signal-safety concerns, no self-pipe.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto backend = attnserve::server::MakeBackend(options.backend, options.backend_threads,
                                                options.cpu_float32_precision);
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
  sigwait(&signals, &signal);
  const absl::Duration grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  std::fprintf(stderr, "attnserve: %s received; draining for up to %s\n", strsignal(signal),
               absl::FormatDuration(grace).c_str());
  (*host)->Shutdown(grace);
  std::fprintf(stderr, "attnserve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "attnserve: Transformer attention over gRPC.\n"
      "  attnserve --listen=0.0.0.0:50051 [--module=NAME=PATH[:NUM_HEADS],...]");
  absl::ParseCommandLine(argc, argv);
  return Run();
}
