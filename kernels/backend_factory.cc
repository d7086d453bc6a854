#include "kernels/backend_factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference.h"

namespace attnserve::kernels {
namespace {

// The plugin's entry point (kernels/cuda/cuda_plugin.cc).
using CreateFn = int (*)(Backend** backend, char* message, size_t message_size);

std::string ExecutableDir() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return ".";
  std::string exe(path.data(), static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

std::vector<std::string> PluginCandidates() {
  if (const char* env = std::getenv("ATTNSERVE_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    return {env};
  }
  std::vector<std::string> paths = {ExecutableDir() + "/../lib/attnserve/libattnserve_cuda.so"};
#ifdef ATTNSERVE_CUDA_PLUGIN_BUILD_PATH
  paths.push_back(ATTNSERVE_CUDA_PLUGIN_BUILD_PATH);
#endif
  return paths;
}

// "sleep:US": the CPU backend's answers, each batch taking at least US microseconds per request
// (slept after the compute). For tests and load experiments that need a slow server whose
// compute time does not depend on the machine: no CPU quota, no float64 reference burning the
// cores the load generator needs.
class SleepBackend final : public Backend {
 public:
  SleepBackend(std::unique_ptr<Backend> inner, absl::Duration per_request)
      : inner_(std::move(inner)), per_request_(per_request) {}
  std::string name() const override { return "sleep"; }
  std::vector<DeviceInfo> devices() const override { return inner_->devices(); }
  std::string float32_precision() const override { return inner_->float32_precision(); }
  bool supports_linear_attention() const override { return inner_->supports_linear_attention(); }
  bool supports_session_score_mods() const override {
    return inner_->supports_session_score_mods();
  }
  absl::Status Attend(absl::Span<const AttentionParams> batch) override {
    const absl::Time start = absl::Now();
    absl::Status s = inner_->Attend(batch);
    absl::SleepFor(start + per_request_ * static_cast<double>(batch.size()) - absl::Now());
    return s;
  }
  absl::Status MultiHead(absl::Span<const MultiHeadParams> batch) override {
    const absl::Time start = absl::Now();
    absl::Status s = inner_->MultiHead(batch);
    absl::SleepFor(start + per_request_ * static_cast<double>(batch.size()) - absl::Now());
    return s;
  }
  absl::Status Project(absl::Span<const ProjectionParams> batch) override {
    return inner_->Project(batch);
  }
  absl::Status PagedAttention(const PagedAttentionParams& p) override {
    return inner_->PagedAttention(p);
  }
  absl::StatusOr<std::unique_ptr<PageStore>> NewPageStore(const PageStoreShape& shape) override {
    return inner_->NewPageStore(shape);
  }
  int64_t ReleaseIdleMemory() override { return inner_->ReleaseIdleMemory(); }

 private:
  const std::unique_ptr<Backend> inner_;
  const absl::Duration per_request_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend() {
  std::vector<std::string> errors;
  for (const std::string& path : PluginCandidates()) {
    if (access(path.c_str(), F_OK) != 0) {
      errors.push_back(absl::StrCat(path, ": not found"));
      continue;
    }
    // Never closed: the backend's code lives in it for the life of the process.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      errors.push_back(dlerror());  // e.g. libcublas.so.13 missing on a CPU-only machine
      continue;
    }
    auto create = reinterpret_cast<CreateFn>(dlsym(handle, "attnserve_cuda_create_backend"));
    if (create == nullptr) return absl::InternalError(absl::StrCat(path, ": ", dlerror()));
    Backend* backend = nullptr;
    char message[512] = {0};
    const int code = create(&backend, message, sizeof message);
    if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), message);
    return std::unique_ptr<Backend>(backend);
  }
  return absl::UnavailableError(
      absl::StrCat("the CUDA backend plugin cannot be loaded (", absl::StrJoin(errors, "; "), ")"));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const CpuSettings& cpu) {
  if (cpu.float32_precision != "fp32" && cpu.float32_precision != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu_float32_precision must be fp32 or bf16; was '", cpu.float32_precision, "'"));
  }
  if (!(cpu.min_flops_per_thread >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu_min_flops_per_thread must be >= 0; was ", cpu.min_flops_per_thread));
  }
  if (name == "reference") return std::make_unique<ReferenceBackend>();
  if (absl::StartsWith(name, "sleep:")) {
    int64_t us = 0;
    if (!absl::SimpleAtoi(name.substr(6), &us) || us < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend=sleep:US needs a whole number of microseconds >= 0; was '", name, "'"));
    }
    auto inner = MakeBackend("cpu", cpu);
    if (!inner.ok()) return inner.status();
    return std::make_unique<SleepBackend>(*std::move(inner), absl::Microseconds(us));
  }
  if (name == "cuda") return LoadCudaBackend();
  if (name == "auto") {
    auto cuda = LoadCudaBackend();
    if (cuda.ok()) return cuda;
    std::fprintf(stderr, "attnserve: no CUDA backend (%s); using the CPU backend\n",
                 std::string(cuda.status().message()).c_str());
  }
  if (name == "auto" || name == "cpu") {
    cpu::CpuBackendOptions options;
    options.num_threads = cpu.threads;
    options.min_flops_per_thread = cpu.min_flops_per_thread;
    options.float32_as_bf16 = cpu.float32_precision == "bf16";
    auto backend = cpu::CpuBackend::Create(options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(*std::move(backend));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cuda, cpu, reference or sleep:US; was '", name, "'"));
}

}  // namespace attnserve::kernels
