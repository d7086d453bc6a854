// backend_cost: what the compute backend alone costs for the requests attnserve-bench sends,
// the backend's share of serving_sweep.py's overhead ratio (SERVING.md).
//
// The requests are attnserve-bench's own (client/bench/workload.h, the same shapes, dtype and
// seed), turned into jobs by the server's own request builder (server/transport/request_builder.h)
// and computed by the backend the server would make (kernels/backend_factory.h) one request per
// batch, as a server computes a lone caller's calls. Nothing else runs in the process, so its
// CPU time over the timed calls is the backend's (its thread pool included).
//
//   backend_cost --rpc=attend --shapes=1,8,128,64 [--backend=cpu --threads=0 --min_time_s=1]
//
// Prints one JSON object: {"cpu_us_per_call": ..., "wall_us_per_call": ..., "calls": ...}.
#include <time.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/bench/workload.h"
#include "kernels/backend_factory.h"
#include "server/core/module_registry.h"
#include "server/transport/request_builder.h"

ABSL_FLAG(std::string, rpc, "attend", "attend or mha");
ABSL_FLAG(std::string, shapes, "1,8,128,64", "one attnserve-bench --shapes entry");
ABSL_FLAG(std::string, dtype, "float32", "float32, float16 or bfloat16");
ABSL_FLAG(std::string, backend, "cpu", "the backend, as the server's --backend");
ABSL_FLAG(int, threads, 0, "the backend's threads, as the server's --backend_threads");
ABSL_FLAG(double, min_flops_per_thread, attnserve::kernels::CpuSettings{}.min_flops_per_thread,
          "the CPU backend's work per thread, as the server's --cpu_min_flops_per_thread");
ABSL_FLAG(double, min_time_s, 1.0, "time the calls for at least this long");
ABSL_FLAG(uint64_t, seed, 1, "attnserve-bench's --seed");

namespace {

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "backend_cost: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  namespace bench = attnserve::bench;
  namespace server = attnserve::server;
  const bool mha = absl::GetFlag(FLAGS_rpc) == "mha";
  if (!mha && absl::GetFlag(FLAGS_rpc) != "attend") return Fail("--rpc must be attend or mha");
  auto shapes = bench::ParseShapes(absl::GetFlag(FLAGS_shapes), mha ? 2 : 4);
  if (!shapes.ok()) return Fail(std::string(shapes.status().message()));

  server::ModuleRegistry modules;
  const std::shared_ptr<const server::Module> demo = server::DemoModule();
  if (absl::Status s = modules.Add(demo, false); !s.ok()) return Fail(std::string(s.message()));
  bench::WorkloadOptions options;
  options.multi_head = mha;
  options.shapes = *shapes;
  options.d_model = demo->weights.d_model;
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  options.dtype = dtype == "float16"    ? attnserve::v1::DTYPE_FLOAT16
                  : dtype == "bfloat16" ? attnserve::v1::DTYPE_BFLOAT16
                                        : attnserve::v1::DTYPE_FLOAT32;
  auto workload = bench::Workload::Create(options);
  if (!workload.ok()) return Fail(std::string(workload.status().message()));
  const bench::Prepared& request = workload->at(0);

  server::Limits limits;
  auto job = mha ? server::BuildMultiHeadJob(*request.mha, modules, limits)
                 : server::BuildAttendJob(*request.attend, limits);
  if (!job.ok()) return Fail(std::string(job.status().message()));
  auto backend = attnserve::kernels::MakeBackend(
      absl::GetFlag(FLAGS_backend),
      {.threads = absl::GetFlag(FLAGS_threads),
       .min_flops_per_thread = absl::GetFlag(FLAGS_min_flops_per_thread)});
  if (!backend.ok()) return Fail(std::string(backend.status().message()));

  auto call = [&]() -> absl::Status {
    return mha ? (*backend)->MultiHead({(*job)->multi_head}) : (*backend)->Attend({(*job)->attend});
  };
  for (int i = 0; i < 3; ++i) {  // warm: the pool's threads, the output's pages, the caches
    if (absl::Status s = call(); !s.ok()) return Fail(std::string(s.message()));
  }
  const absl::Duration min_time = absl::Seconds(absl::GetFlag(FLAGS_min_time_s));
  const absl::Time start = absl::Now();
  const double cpu_start = ProcessCpuSeconds();
  int64_t calls = 0;
  while (absl::Now() - start < min_time || calls < 5) {
    if (absl::Status s = call(); !s.ok()) return Fail(std::string(s.message()));
    ++calls;
  }
  const double cpu = ProcessCpuSeconds() - cpu_start;
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "{\"cpu_us_per_call\": %.3f, \"wall_us_per_call\": %.3f, \"calls\": %lld, "
      "\"request_bytes\": %lld}\n",
      cpu / static_cast<double>(calls) * 1e6, wall / static_cast<double>(calls) * 1e6,
      static_cast<long long>(calls), static_cast<long long>(request.bytes));
  return 0;
}
