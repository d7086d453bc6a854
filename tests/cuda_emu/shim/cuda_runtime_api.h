// Shim of the CUDA runtime API for the host emulation (tests/cuda_emu/README.md): the types and
// calls the launch code of kernels/cuda/ uses, implemented on the host (emu_runtime.cc). A
// "device" pointer is a host pointer, and a launch on a stream runs every block to completion
// before it returns, so stream order holds trivially (and a missing stream synchronisation
// cannot show here). A launch is checked as CUDA checks it: the grid and block limits, and
// dynamic shared memory above 48 KiB only after cudaFuncSetAttribute raised the kernel's limit;
// a failed check sets the error cudaGetLastError returns and runs nothing.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_RUNTIME_API_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_RUNTIME_API_H_

#include <cstddef>
#include <type_traits>

#include "tests/cuda_emu/emu.h"

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorECCUncorrectable = 214,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;
typedef struct CUstream_st* cudaStream_t;

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
inline constexpr unsigned cudaStreamNonBlocking = 0x01;

// The emulated device (one, device 0): its name says what it is; compute capability 9.0.
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
};

// Device memory is host memory (exact size, so ASan sees overruns); a copy, a stream
// synchronisation or an allocation "on a stream" completes before it returns. cudaDeviceReset
// frees every live cudaMalloc / cudaMallocAsync allocation (CUDA's reset destroys the context
// and its memory) and clears an injected sticky error; cudaFree of a pointer not allocated (or
// already freed, by a free or a reset) fails with cudaErrorInvalidValue and frees nothing.
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

// The driver's virtual memory calls (shim/cuda.h), by name: cuMemGetAllocationGranularity,
// cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease, cuMemMap, cuMemSetAccess,
// cuMemUnmap and cuGetErrorName (any version); any other symbol is not found.
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};
inline constexpr unsigned long long cudaEnableDefault = 0x0;
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status);

// The last launch error of the calling thread, reset to cudaSuccess by the call.
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);

namespace emu {

// Breaks the emulated device's context as a device fault does (an illegal address, ...):
// until cudaDeviceReset, cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpyAsync and the
// allocations return `error` (tests of the backend's recovery).
void InjectStickyError(cudaError_t error);
// Live device allocations (cudaMalloc, cudaMallocAsync not yet freed).
size_t DeviceAllocations();
// Frees of pointers the device did not hold (cudaErrorInvalidValue), since the start.
size_t InvalidFrees();
// Bytes copied host to device (cudaMemcpyHostToDevice), since the start.
size_t HostToDeviceBytes();
// Device memory mapped into reserved address ranges now (shim/cuda.h), in bytes.
size_t MappedBytes();
// At most `bytes` of device memory made by cuMemCreate at once (16 GiB until a test says
// otherwise); cuMemCreate past it fails with CUDA_ERROR_OUT_OF_MEMORY.
void LimitDeviceMemory(size_t bytes);

// cudaFuncAttributeMaxDynamicSharedMemorySize of `kernel` (any other attribute is an error).
cudaError_t FuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value);
// Checks a launch of `kernel` as CUDA would; on failure records the error for
// cudaGetLastError and returns false.
bool LaunchAllowed(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes);

// kernel<<<grid, block, smem_bytes, stream>>>(args...), which host_cu.sh rewrites .cu files
// into LaunchKernel(KernelLaunch{}, grid, block, smem_bytes, stream, kernel, args...): every
// block runs on the emulator before it returns. Arguments are passed by value, as CUDA copies
// them. The tag ranks the two forms: a kernel named as a function, a specialisation or a
// pointer binds to the first; a function template whose arguments nvcc deduces from the
// launch's arguments (MaskedSoftmaxKernel<<<...>>>(s, static_cast<__half*>(p), ...)) only to
// the second, which takes the specialisation whose parameters are the arguments' types (a
// kernel whose parameters differ from its arguments does not compile here).
struct DeducedKernelLaunch {};
struct KernelLaunch : DeducedKernelLaunch {};

template <typename... Params, typename... Args>
void LaunchKernel(KernelLaunch, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t /*stream*/,
                  void (*kernel)(Params...), const Args&... args) {
  if (!LaunchAllowed(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes)) return;
  Launch(grid, block, smem_bytes, [&] { kernel(args...); });
}
template <typename... Args>
void LaunchKernel(DeducedKernelLaunch, dim3 grid, dim3 block, size_t smem_bytes,
                  cudaStream_t stream, void (*kernel)(std::type_identity_t<Args>...),
                  const Args&... args) {
  LaunchKernel(KernelLaunch{}, grid, block, smem_bytes, stream, kernel, args...);
}

}  // namespace emu

template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute,
                                 int value) {
  return emu::FuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_RUNTIME_API_H_
