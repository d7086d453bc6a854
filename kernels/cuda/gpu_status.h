// The error type of the CUDA layer below the backend: a message, empty on success. Plain C++
// (no Abseil in .cu files); CudaBackend turns a failure into an absl::Status.
#ifndef ATTNSERVE_KERNELS_CUDA_GPU_STATUS_H_
#define ATTNSERVE_KERNELS_CUDA_GPU_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace attnserve::kernels::cuda {

struct GpuStatus {
  std::string error;  // empty: success
  bool ok() const { return error.empty(); }
};

// "what: cudaErrorX (description)" on failure.
inline GpuStatus CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return {std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}
inline GpuStatus CublasCheck(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return {std::string(what) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
          ")"};
}

// Lets `kernel` launch with `smem` bytes of dynamic shared memory: above 48 KiB a kernel must
// opt in first. `what` names the launch in the error.
template <typename... Params>
GpuStatus AllowSharedMemory(void (*kernel)(Params...), int smem, const char* what) {
  if (smem <= 48 * 1024) return {};
  return CudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                   what);
}

#define ATTNSERVE_GPU_RETURN_IF_ERROR(expr)             \
  do {                                                  \
    ::attnserve::kernels::cuda::GpuStatus _st = (expr); \
    if (!_st.ok()) return _st;                          \
  } while (0)

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_GPU_STATUS_H_
