// The host implementation of shim/cublas_v2.h and shim/cublasLt.h (README.md): the GEMMs of
// naive_attention.cu and linear.cc as plain loops over the widened operands. The shapes of the
// emulation tests are small; no BLAS library is needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "cublasLt.h"
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

// D = alpha * op(A) op(B) + beta * C (+ bias[i] on row i), column-major, one matrix; A and B are
// not read when alpha is 0, C not when beta is 0. C and D may be the same matrix.
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
          cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type, int64_t ldb,
          double beta, const float* c, int64_t ldc, float* d, int64_t ldd, const float* bias) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0;
      if (alpha != 0) {
        for (int64_t l = 0; l < k; ++l) {
          const int64_t ai = ta ? l + i * lda : i + l * lda;  // op(A)[i, l]
          const int64_t bi = tb ? j + l * ldb : l + j * ldb;  // op(B)[l, j]
          sum += double{Load(a, a_type, ai)} * double{Load(b, b_type, bi)};
        }
      }
      const double prior = beta != 0 ? beta * c[i + j * ldc] : 0.0;
      d[i + j * ldd] = static_cast<float>(alpha * sum + prior + (bias != nullptr ? bias[i] : 0.0));
    }
  }
}

std::atomic<bool> g_lt_algorithms{true};
std::atomic<int> g_lt_matmuls{0};

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
    float* c = static_cast<float*>(C) + batch * strideC;
    Gemm(ta, tb, m, n, k, a_scale, static_cast<const char*>(A) + batch * strideA * esize, Atype,
         lda, static_cast<const char*>(B) + batch * strideB * esize, Btype, ldb, c_scale, c, ldc, c,
         ldc, nullptr);
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

struct cublasLtContext {};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                        cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t{compute_type, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// Copies an attribute of exactly sizeof(T) bytes (cuBLASLt rejects another size).
template <typename T>
cublasStatus_t SetExact(T* field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return SetExact(&desc->trans_a, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return SetExact(&desc->trans_b, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return SetExact(&desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return SetExact(&desc->bias, buf, size);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_NOT_SUPPORTED;
  return SetExact(&pref->max_workspace_bytes, buf, size);
}

namespace {

// The shape checks of a matmul: op(A) m x k, op(B) k x n, C and D m x n, every ld at least its
// matrix's rows, all float32.
cublasStatus_t CheckMatmul(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                           cublasLtMatrixLayout_t d) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if ((desc->compute_type != CUBLAS_COMPUTE_32F &&
       desc->compute_type != CUBLAS_COMPUTE_32F_FAST_TF32) ||
      desc->scale_type != CUDA_R_32F || a->type != CUDA_R_32F || b->type != CUDA_R_32F ||
      c->type != CUDA_R_32F || d->type != CUDA_R_32F ||
      (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc->epilogue != CUBLASLT_EPILOGUE_BIAS)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const uint64_t m = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols;
  const uint64_t kb = tb ? b->cols : b->rows, n = tb ? b->rows : b->cols;
  for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
    if (l->ld < 1 || static_cast<uint64_t>(l->ld) < l->rows) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (k != kb || c->rows != m || c->cols != n || d->rows != m || d->cols != n ||
      (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && desc->bias == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
    cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || requested < 1 || results == nullptr || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cublasStatus_t st = CheckMatmul(desc, a_desc, b_desc, c_desc, d_desc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  *returned = 0;
  if (g_lt_algorithms.load()) {
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *returned = 1;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_desc, const void* B,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_desc, void* D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* /*workspace*/,
                              size_t /*workspace_bytes*/, cudaStream_t /*stream*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr || algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = CheckMatmul(desc, a_desc, b_desc, c_desc, d_desc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t m = static_cast<int64_t>(d_desc->rows), n = static_cast<int64_t>(d_desc->cols);
  const int64_t k = static_cast<int64_t>(ta ? a_desc->rows : a_desc->cols);
  Gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, CUDA_R_32F, a_desc->ld, B, CUDA_R_32F,
       b_desc->ld, *static_cast<const float*>(beta), static_cast<const float*>(C), c_desc->ld,
       static_cast<float*>(D), d_desc->ld,
       desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? static_cast<const float*>(desc->bias) : nullptr);
  g_lt_matmuls.fetch_add(1);
  return CUBLAS_STATUS_SUCCESS;
}

namespace emu {
void SetLtAlgorithmsAvailable(bool available) { g_lt_algorithms.store(available); }
int LtMatmulCount() { return g_lt_matmuls.load(); }
}  // namespace emu
