// Shim of CUDA's library_types.h for the host emulation (tests/cuda_emu/README.md): the data
// types the cuBLAS calls of kernels/cuda/ name, with CUDA's values.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_LIBRARY_TYPES_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_LIBRARY_TYPES_H_

enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_32F = 0,
  CUDA_R_16BF = 14,
};
typedef enum cudaDataType_t cudaDataType;

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_LIBRARY_TYPES_H_
