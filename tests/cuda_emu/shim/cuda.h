// Shim of the CUDA driver API for the host emulation (tests/cuda_emu/README.md): the virtual
// memory management calls kernels/cuda/device_pages.cc makes (and cuGetErrorName), reached as on a
// GPU through cudaGetDriverEntryPointByVersion, implemented on the host (emu_runtime.cc) with the
// semantics the driver documents and a GPU would enforce:
// - cuMemAddressReserve reserves inaccessible addresses (mmap PROT_NONE), aligned to the
//   granularity; cuMemAddressFree frees a whole reservation, which must hold no mapping;
// - cuMemCreate makes `size` bytes of device memory (a multiple of the granularity, counted
//   against the emulated device's 16 GiB, or a test's emu::LimitDeviceMemory: past it,
//   CUDA_ERROR_OUT_OF_MEMORY); with a sticky error injected (emu::InjectStickyError) it fails
//   with CUDA_ERROR_ILLEGAL_ADDRESS, as a broken context's calls do; cuMemRelease drops the
//   handle, and the memory goes once its mappings are gone too;
// - cuMemMap maps a handle's memory at a granule-aligned place inside a reservation where
//   nothing is mapped; the range is still inaccessible until cuMemSetAccess grants read and
//   write (an access before faults, as on a GPU); cuMemUnmap unmaps exactly what one cuMemMap
//   mapped;
// - the granularity is 64 KiB, smaller than a GPU's 2 MiB, so that the tests' small stores
//   span several granules;
// - cudaDeviceReset frees every reservation, mapping and handle (they die with the context).
// Any call breaking a rule fails with CUDA_ERROR_INVALID_VALUE and changes nothing.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_H_

#include <cstddef>

enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum CUmemAllocationType { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum CUmemAllocationHandleType { CU_MEM_HANDLE_TYPE_NONE = 0 };
enum CUmemLocationType { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum CUmemAccess_flags {
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
};
enum CUmemAllocationGranularity_flags {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};

struct CUmemLocation {
  CUmemLocationType type;
  int id;
};
struct CUmemAllocationProp {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
// The names of the results above; CUDA_ERROR_INVALID_VALUE for any other.
CUresult cuGetErrorName(CUresult error, const char** name);

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_H_
