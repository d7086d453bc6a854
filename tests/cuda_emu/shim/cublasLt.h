// Shim of cuBLASLt for the host emulation (tests/cuda_emu/README.md): the calls of linear.cc,
// answered on the host (emu_blas.cc). Matrices are column-major as cuBLASLt's default order;
// D = alpha * op(A) op(B) + beta * C (C not read when beta is 0), plus bias[i] on every row i
// of D with CUBLASLT_EPILOGUE_BIAS. Emulated: CUDA_R_32F A, B, C and D, compute
// CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32 (summed in float64 and rounded once: no
// TF32 rounding of the inputs), scale type CUDA_R_32F. The heuristic offers one algorithm for
// any consistent shape, or none after emu::SetLtAlgorithmsAvailable(false) (to reach a
// caller's fallback). Anything else is CUBLAS_STATUS_NOT_SUPPORTED or INVALID_VALUE.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLASLT_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLASLT_H_

#include <cstddef>
#include <cstdint>

#include "cublas_v2.h"

typedef struct cublasLtContext* cublasLtHandle_t;

enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute_type;
  cudaDataType_t scale_type;
  cublasOperation_t trans_a = CUBLAS_OP_N;
  cublasOperation_t trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows;
  uint64_t cols;
  int64_t ld;
};
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace_bytes = 0;
};
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                        cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
    cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_desc, const void* B,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_desc, void* D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream);

namespace emu {
// Whether cublasLtMatmulAlgoGetHeuristic offers an algorithm (default true).
void SetLtAlgorithmsAvailable(bool available);
// The number of cublasLtMatmul calls that computed a product, since the process started.
int LtMatmulCount();
}  // namespace emu

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLASLT_H_
