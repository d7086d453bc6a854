// Making the compute backend the server runs on, by name.
#ifndef ATTNSERVE_KERNELS_BACKEND_FACTORY_H_
#define ATTNSERVE_KERNELS_BACKEND_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnserve::kernels {

// How MakeBackend makes the CPU backend (the server's --backend_threads,
// --cpu_float32_precision and --cpu_min_flops_per_thread).
struct CpuSettings {
  int threads = 0;  // CpuBackendOptions::num_threads: 0 = one per core this process may use
  // How FLOAT32 and FLOAT16 requests compute: "fp32" or "bf16" (else INVALID_ARGUMENT), as
  // CpuBackendOptions::float32_as_bf16 false or true.
  std::string float32_precision = "fp32";
  double min_flops_per_thread = cpu::CpuBackendOptions{}.min_flops_per_thread;
};

// The backend named by `name`:
//   "reference"  the float64 reference path
//   "cpu"        the fast CPU backend, made as `cpu` says
//   "cuda"       the CUDA backend, loaded from its plugin (libattnserve_cuda.so); UNAVAILABLE
//                when the plugin, the CUDA libraries or a device are missing
//   "auto"       "cuda" when it loads, else "cpu" (saying why on stderr, once)
//   "sleep:US"   "cpu"'s answers, each batch taking at least US microseconds per request: a slow
//                server whose compute time does not depend on the machine, for tests and load
//                experiments (not for serving)
// INVALID_ARGUMENT for any other name, or for `cpu` settings the CPU backend refuses.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const CpuSettings& cpu = {});

// Loads the CUDA backend plugin: $ATTNSERVE_CUDA_PLUGIN if set, else libattnserve_cuda.so in
// <binary>/../lib/attnserve/ (installed) or in the build tree it was built in.
absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend();

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_BACKEND_FACTORY_H_
