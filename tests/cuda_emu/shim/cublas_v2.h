// Shim of cuBLAS for the host emulation: only the types the headers of kernels/cuda/ name
// (flash_fwd.h, gpu_status.h). No cuBLAS call is emulated yet (README.md: what remains).
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_

typedef struct cublasContext* cublasHandle_t;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUBLAS_V2_H_
