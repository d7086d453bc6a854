#include "kernels/cuda/linear.h"

#include <memory>
#include <string>

#include "kernels/cuda/flash_fwd.h"

namespace attnserve::kernels::cuda {
namespace {

// Owners of the cuBLASLt descriptors (destroyed on every return path).
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};

GpuStatus Fallback(const LinearArgs& a, cublasHandle_t blas, cudaStream_t stream) {
  const float one = 1.0f;
  const float zero = 0.0f;
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(cublasSetStream(blas, stream), "cublasSetStream"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
      cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, a.out_features, static_cast<int>(a.rows),
                   a.in_features, &one, a.w, CUDA_R_32F, a.in_features, a.x, CUDA_R_32F,
                   a.in_features, &zero, a.y, CUDA_R_32F, a.out_features,
                   CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
      "linear: cublasGemmEx"));
  if (a.bias == nullptr) return {};
  return AddBias(a.y, a.bias, a.rows, a.out_features, stream);
}

}  // namespace

GpuStatus LinearForward(const LinearArgs& a, cublasLtHandle_t lt, cublasHandle_t blas,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (a.rows == 0) return {};
  // Column-major view: Y^T (out x rows) = op(W) (out x in) * X^T (in x rows), where the
  // row-major W [out, in] is a column-major in x out matrix, hence op = transpose.
  cublasLtMatmulDesc_t desc_raw = nullptr;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasLtMatmulDescCreate(&desc_raw, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
                  "linear: cublasLtMatmulDescCreate"));
  std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter> desc(desc_raw);
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                 sizeof(trans_a)),
                  "linear: TRANSA"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                 sizeof(trans_b)),
                  "linear: TRANSB"));
  if (a.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ATTNSERVE_GPU_RETURN_IF_ERROR(
        CublasCheck(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof(epilogue)),
                    "linear: EPILOGUE"));
    ATTNSERVE_GPU_RETURN_IF_ERROR(
        CublasCheck(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &a.bias, sizeof(a.bias)),
                    "linear: BIAS_POINTER"));
  }
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
      cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, a.in_features, a.out_features, a.in_features),
      "linear: layout W"));
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter> layout_a(la);
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, a.in_features, a.rows, a.in_features),
                  "linear: layout X"));
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter> layout_b(lb);
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, a.out_features, a.rows, a.out_features),
      "linear: layout Y"));
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter> layout_c(lc);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasLtMatmulPreferenceCreate(&pref_raw), "linear: preference"));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter> pref(pref_raw);
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      "linear: workspace preference"));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, desc.get(), layout_a.get(), layout_b.get(), layout_c.get(),
                                     layout_c.get(), pref.get(), 1, &heuristic, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return Fallback(a, blas, stream);
  const float one = 1.0f;
  const float zero = 0.0f;
  return CublasCheck(cublasLtMatmul(lt, desc.get(), &one, a.w, layout_a.get(), a.x, layout_b.get(),
                                    &zero, a.y, layout_c.get(), a.y, layout_c.get(),
                                    &heuristic.algo, workspace, workspace_bytes, stream),
                     "linear: cublasLtMatmul");
}

}  // namespace attnserve::kernels::cuda
