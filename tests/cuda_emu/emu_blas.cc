// The host implementation of shim/cublas_v2.h (README.md): the GEMMs of naive_attention.cu as
// plain loops over the widened operands. The shapes of the emulation tests are small; no BLAS
// library is needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cublas_v2.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace {

bool Is16Bit(cudaDataType_t t) { return t == CUDA_R_16F || t == CUDA_R_16BF; }

float Load(const void* base, cudaDataType_t type, int64_t i) {
  switch (type) {
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDA_R_32F:
      break;
  }
  return static_cast<const float*>(base)[i];
}

}  // namespace

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
  }
  return "unknown error";
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType_t Atype, int lda, long long int strideA,
    const void* B, cudaDataType_t Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType_t Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t /*algo*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if ((!ta && transa != CUBLAS_OP_N) || (!tb && transb != CUBLAS_OP_N) || m < 0 || n < 0 || k < 0 ||
      batchCount < 0 || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) ||
      ldc < std::max(1, m) || alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool types_ok =
      Atype == Btype && Ctype == CUDA_R_32F && (Is16Bit(Atype) || Atype == CUDA_R_32F);
  if (!types_ok ||
      (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // Host and device pointer modes read the same memory here (a device pointer is a host one).
  const double a_scale = *static_cast<const float*>(alpha);
  const double c_scale = *static_cast<const float*>(beta);
  const int64_t esize = Is16Bit(Atype) ? 2 : 4;
  for (int batch = 0; batch < batchCount; ++batch) {
    const char* a = static_cast<const char*>(A) + batch * strideA * esize;
    const char* b = static_cast<const char*>(B) + batch * strideB * esize;
    float* c = static_cast<float*>(C) + batch * strideC;
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        // op(A)[i, l] and op(B)[l, j], column-major; A and B are not read when alpha is 0.
        double sum = 0;
        if (a_scale != 0) {
          for (int l = 0; l < k; ++l) {
            const int64_t ai = ta ? l + int64_t{i} * lda : i + int64_t{l} * lda;
            const int64_t bi = tb ? j + int64_t{l} * ldb : l + int64_t{j} * ldb;
            sum += double{Load(a, Atype, ai)} * double{Load(b, Btype, bi)};
          }
        }
        float& out = c[i + int64_t{j} * ldc];
        const double prior = c_scale != 0 ? c_scale * out : 0.0;  // beta 0: C not read
        out = static_cast<float>(a_scale * sum + prior);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
                                    Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}
