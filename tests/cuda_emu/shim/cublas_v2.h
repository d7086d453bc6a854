// Shim of cuBLAS for the host emulation (tests/cuda_emu/README.md): the types the headers of
// kernels/cuda/ name and the calls of naive_attention.cu, answered on the host (emu_blas.cc).
// A "device" pointer is a host pointer and every call completes before it returns.
//
// The GEMMs follow cuBLAS's contract: column-major operands, op(A) m x k, op(B) k x n, C m x n,
// C = alpha * op(A) op(B) + beta * C; with beta == 0, C is not read (a NaN there does not
// propagate); the argument checks of cuBLAS's documentation (m, n, k, batchCount >= 0;
// lda >= max(1, m) for op N else max(1, k); ldb >= max(1, k) for op N else max(1, n);
// ldc >= max(1, m)) answer CUBLAS_STATUS_INVALID_VALUE. Emulated: 16-bit floating-point A and B
// (CUDA_R_16F, CUDA_R_16BF, both the same) with CUDA_R_32F C, or all CUDA_R_32F; compute
// CUBLAS_COMPUTE_32F (products of the widened operands summed in float64 and rounded once:
// not the device's summation order) or CUBLAS_COMPUTE_32F_FAST_TF32 (the same: no TF32
// rounding of fp32 inputs); host pointer mode only. Anything else is CUBLAS_STATUS_NOT_SUPPORTED.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_

#include <cstdint>

#include "cuda_runtime_api.h"
#include "library_types.h"

typedef struct cublasContext* cublasHandle_t;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
};
enum cublasPointerMode_t {
  CUBLAS_POINTER_MODE_HOST = 0,
  CUBLAS_POINTER_MODE_DEVICE = 1,
};
enum cublasComputeType_t {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t {
  CUBLAS_GEMM_DEFAULT = -1,
};

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
// Strides in elements; batch i uses A + i * strideA, B + i * strideB, C + i * strideC.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_
