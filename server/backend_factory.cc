#include "server/backend_factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference.h"

namespace attnserve::server {
namespace {

// The plugin's entry point (kernels/cuda/cuda_plugin.cc).
using CreateFn = int (*)(kernels::Backend** backend, char* message, size_t message_size);

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

}  // namespace

absl::StatusOr<std::unique_ptr<kernels::Backend>> LoadCudaBackend() {
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
    kernels::Backend* backend = nullptr;
    char message[512] = {0};
    const int code = create(&backend, message, sizeof message);
    if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), message);
    return std::unique_ptr<kernels::Backend>(backend);
  }
  return absl::UnavailableError(
      absl::StrCat("the CUDA backend plugin cannot be loaded (", absl::StrJoin(errors, "; "), ")"));
}

absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(
    absl::string_view name, int threads, absl::string_view cpu_float32_precision) {
  if (cpu_float32_precision != "fp32" && cpu_float32_precision != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu_float32_precision must be fp32 or bf16; was '", cpu_float32_precision, "'"));
  }
  if (name == "reference") return std::make_unique<kernels::ReferenceBackend>();
  if (name == "cuda") return LoadCudaBackend();
  if (name == "auto") {
    auto cuda = LoadCudaBackend();
    if (cuda.ok()) return cuda;
    std::fprintf(stderr, "attnserve: no CUDA backend (%s); using the CPU backend\n",
                 std::string(cuda.status().message()).c_str());
  }
  if (name == "auto" || name == "cpu") {
    kernels::cpu::CpuBackendOptions options;
    options.num_threads = threads;
    options.float32_as_bf16 = cpu_float32_precision == "bf16";
    auto cpu = kernels::cpu::CpuBackend::Create(options);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<kernels::Backend>(*std::move(cpu));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cuda, cpu or reference; was '", name, "'"));
}

}  // namespace attnserve::server
