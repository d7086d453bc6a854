// y = x W^T + b (nn.Linear) on device float32 buffers through cuBLASLt, TF32 tensor cores with
// fp32 accumulation, the bias added in the GEMM epilogue (CUBLASLT_EPILOGUE_BIAS). When cuBLASLt
// offers no algorithm for the shape, cublasGemmEx (TF32) plus a bias kernel.
//
// Shapes depend only on the request, so the algorithm (and the bits) do too: batch-invariant.
#ifndef ATTNSERVE_KERNELS_CUDA_LINEAR_H_
#define ATTNSERVE_KERNELS_CUDA_LINEAR_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gpu_status.h"

namespace attnserve::kernels::cuda {

struct LinearArgs {
  const float* x = nullptr;     // [rows, in_features], row-major
  const float* w = nullptr;     // [out_features, in_features] (nn.Linear)
  const float* bias = nullptr;  // [out_features] or nullptr
  float* y = nullptr;           // [rows, out_features]
  int64_t rows = 0;
  int in_features = 0;
  int out_features = 0;
};

// `workspace` (device, workspace_bytes) is cuBLASLt's scratch; 32 MiB is plenty on sm_90.
GpuStatus LinearForward(const LinearArgs& a, cublasLtHandle_t lt, cublasHandle_t blas,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LINEAR_H_
