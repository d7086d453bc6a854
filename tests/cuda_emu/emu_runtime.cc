// The host implementation of shim/cuda_runtime_api.h (README.md).
#include <cstdint>
#include <map>

#include "base/mutex.h"
#include "cuda_runtime_api.h"

namespace {

// CUDA's per-block limits (compute capability 8.x/9.x): dynamic shared memory beyond 48 KiB
// needs the kernel's attribute raised, up to 227 KiB.
constexpr size_t kDefaultSmemBytes = 48 * 1024;
constexpr int kMaxSmemBytes = 227 * 1024;

thread_local cudaError_t t_last_error = cudaSuccess;

struct Attributes {
  attnserve::Mutex mu;
  // Kernel -> its cudaFuncAttributeMaxDynamicSharedMemorySize.
  std::map<const void*, int> max_smem ABSL_GUARDED_BY(mu);
};
Attributes& Attrs() {
  static Attributes* attrs = new Attributes;
  return *attrs;
}

}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
  }
  return "unknown error";
}

namespace emu {

cudaError_t FuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > kMaxSmemBytes) {
    return cudaErrorInvalidValue;
  }
  Attributes& a = Attrs();
  attnserve::MutexLock lock(&a.mu);
  a.max_smem[kernel] = value;
  return cudaSuccess;
}

bool LaunchAllowed(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535u ||
      grid.z > 65535u || threads == 0 || threads > 1024) {
    t_last_error = cudaErrorInvalidConfiguration;
    return false;
  }
  if (smem_bytes > kDefaultSmemBytes) {
    Attributes& a = Attrs();
    attnserve::MutexLock lock(&a.mu);
    const auto it = a.max_smem.find(kernel);
    if (it == a.max_smem.end() || smem_bytes > static_cast<size_t>(it->second)) {
      t_last_error = cudaErrorInvalidValue;
      return false;
    }
  }
  return true;
}

}  // namespace emu
