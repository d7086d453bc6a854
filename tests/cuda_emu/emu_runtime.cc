// The host implementation of shim/cuda_runtime_api.h (README.md): launch checks, errors, and
// the memory, stream and device calls of the backend on one emulated device.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>

#include "base/mutex.h"
#include "cuda.h"
#include "cuda_runtime_api.h"

namespace {

// CUDA's per-block limits (compute capability 8.x/9.x): dynamic shared memory beyond 48 KiB
// needs the kernel's attribute raised, up to 227 KiB.
constexpr size_t kDefaultSmemBytes = 48 * 1024;
constexpr int kMaxSmemBytes = 227 * 1024;

thread_local cudaError_t t_last_error = cudaSuccess;

struct Attributes {
  attnserve::Mutex mu;
  // Kernel -> its cudaFuncAttributeMaxDynamicSharedMemorySize.
  std::map<const void*, int> max_smem ABSL_GUARDED_BY(mu);
};
Attributes& Attrs() {
  static Attributes* attrs = new Attributes;
  return *attrs;
}

}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

namespace {
struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", "invalid address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};

// The emulated device's memory, as cudaMemGetInfo reports it; a larger allocation fails.
constexpr size_t kDeviceBytes = size_t{16} << 30;

// Virtual memory management (shim/cuda.h): memory made by cuMemCreate (a memfd) and where it
// is mapped.
constexpr size_t kGranule = size_t{64} << 10;
struct PhysicalMemory {
  int fd;
  size_t size;
  bool released = false;  // cuMemRelease called: freed when its last mapping goes
  int mappings = 0;
};
struct Mapping {
  size_t size;
  CUmemGenericAllocationHandle handle;
};

// The device's state: its live allocations (which cudaDeviceReset frees, as CUDA's does) and
// an injected sticky error (emu::InjectStickyError).
struct Device {
  attnserve::Mutex mu;
  std::set<void*> allocations ABSL_GUARDED_BY(mu);
  std::map<uintptr_t, size_t> reservations ABSL_GUARDED_BY(mu);  // base -> size
  std::map<CUmemGenericAllocationHandle, PhysicalMemory> memory ABSL_GUARDED_BY(mu);
  CUmemGenericAllocationHandle next_handle ABSL_GUARDED_BY(mu) = 1;
  size_t created_bytes ABSL_GUARDED_BY(mu) = 0;               // of `memory`
  size_t memory_limit ABSL_GUARDED_BY(mu) = kDeviceBytes;     // of created_bytes
  std::map<uintptr_t, Mapping> mappings ABSL_GUARDED_BY(mu);  // address -> mapping
  size_t mapped_bytes ABSL_GUARDED_BY(mu) = 0;
  cudaError_t sticky ABSL_GUARDED_BY(mu) = cudaSuccess;
  size_t invalid_frees ABSL_GUARDED_BY(mu) = 0;
  size_t host_to_device_bytes ABSL_GUARDED_BY(mu) = 0;
};
Device& Dev() {
  static Device* device = new Device;
  return *device;
}
cudaError_t Sticky() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  return d.sticky;
}

cudaError_t Allocate(void** ptr, size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > kDeviceBytes) return cudaErrorMemoryAllocation;
  // 256-byte aligned as cudaMalloc's; exact size, so ASan sees an overrun.
  if (posix_memalign(ptr, 256, bytes) != 0) return cudaErrorMemoryAllocation;
  return cudaSuccess;
}
cudaError_t AllocateDevice(void** ptr, size_t bytes) {
  if (const cudaError_t e = Sticky(); e != cudaSuccess) return e;
  const cudaError_t e = Allocate(ptr, bytes);
  if (e == cudaSuccess && *ptr != nullptr) {
    Device& d = Dev();
    attnserve::MutexLock lock(&d.mu);
    d.allocations.insert(*ptr);
  }
  return e;
}
// cudaFree of a pointer the device does not hold (freed, or freed by a reset) is
// cudaErrorInvalidValue and frees nothing, so a double free fails the call instead of the heap.
cudaError_t FreeDevice(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  if (d.allocations.erase(ptr) == 0) {
    ++d.invalid_frees;
    return cudaErrorInvalidValue;
  }
  std::free(ptr);
  return cudaSuccess;
}
}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
  for (const ErrorText& e : kErrors) {
    if (e.error == error) return e.name;
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  for (const ErrorText& e : kErrors) {
    if (e.error == error) return e.text;
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CUDA host emulation", sizeof(prop->name) - 1);
  prop->totalGlobalMem = kDeviceBytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return cudaErrorInvalidValue;
  *free_bytes = *total_bytes = kDeviceBytes;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return Sticky(); }
cudaError_t cudaDeviceReset() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  for (void* p : d.allocations) std::free(p);
  d.allocations.clear();
  for (const auto& [base, size] : d.reservations) munmap(reinterpret_cast<void*>(base), size);
  for (const auto& [handle, m] : d.memory) close(m.fd);
  d.reservations.clear();
  d.memory.clear();
  d.mappings.clear();
  d.created_bytes = d.mapped_bytes = 0;
  d.sticky = cudaSuccess;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** ptr, size_t bytes) { return AllocateDevice(ptr, bytes); }
cudaError_t cudaFree(void* ptr) { return FreeDevice(ptr); }
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t /*stream*/) {
  return AllocateDevice(ptr, bytes);
}
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t /*stream*/) { return FreeDevice(ptr); }
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned /*flags*/) {
  return Allocate(ptr, bytes);
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t /*stream*/) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return cudaErrorInvalidMemcpyDirection;
  }
  if (const cudaError_t e = Sticky(); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (kind == cudaMemcpyHostToDevice) {
    Device& d = Dev();
    attnserve::MutexLock lock(&d.mu);
    d.host_to_device_bytes += bytes;
  }
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

struct CUstream_st {};
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned /*flags*/) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t /*stream*/) { return Sticky(); }

namespace {

bool IsDeviceZero(const CUmemLocation& l) {
  return l.type == CU_MEM_LOCATION_TYPE_DEVICE && l.id == 0;
}

// The reservation holding [p, p + size), or end().
std::map<uintptr_t, size_t>::const_iterator ReservationOf(const Device& d, uintptr_t p, size_t size)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  auto it = d.reservations.upper_bound(p);
  if (it == d.reservations.begin()) return d.reservations.end();
  --it;
  if (p + size > it->first + it->second) return d.reservations.end();
  return it;
}

// Whether [p, p + size) is exactly a run of whole, adjacent mappings (at least one).
bool WholeMappings(const Device& d, uintptr_t p, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  uintptr_t at = p;
  while (at < p + size) {
    const auto it = d.mappings.find(at);
    if (it == d.mappings.end()) return false;
    at += it->second.size;
  }
  return at == p + size && size > 0;
}

void DropIfUnused(Device& d, CUmemGenericAllocationHandle handle)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  const auto it = d.memory.find(handle);
  if (it == d.memory.end() || !it->second.released || it->second.mappings > 0) return;
  close(it->second.fd);
  d.created_bytes -= it->second.size;
  d.memory.erase(it);
}

}  // namespace

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags /*option*/) {
  if (granularity == nullptr || prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      !IsDeviceZero(prop->location)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranule;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  if (ptr == nullptr || size == 0 || size % kGranule != 0 || addr != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t align = alignment < kGranule ? kGranule : alignment;
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (begin + align - 1) / align * align;
  if (base > begin) munmap(raw, base - begin);
  if (begin + size + align > base + size) {
    munmap(reinterpret_cast<void*>(base + size), begin + size + align - (base + size));
  }
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  d.reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  const auto it = d.reservations.find(static_cast<uintptr_t>(ptr));
  if (it == d.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  const auto m = d.mappings.lower_bound(it->first);
  if (m != d.mappings.end() && m->first < it->first + it->second) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(it->first), it->second);
  d.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || size % kGranule != 0 || flags != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || !IsDeviceZero(prop->location)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  if (d.sticky != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (d.created_bytes + size > d.memory_limit) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("attnserve-emu-device-memory", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = d.next_handle++;
  d.memory[*handle] = PhysicalMemory{fd, size};
  d.created_bytes += size;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  const auto it = d.memory.find(handle);
  if (it == d.memory.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  DropIfUnused(d, handle);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  const uintptr_t p = static_cast<uintptr_t>(ptr);
  if (size == 0 || p % kGranule != 0 || size % kGranule != 0 || offset % kGranule != 0 ||
      flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  const auto mem = d.memory.find(handle);
  if (mem == d.memory.end() || mem->second.released || offset + size > mem->second.size ||
      ReservationOf(d, p, size) == d.reservations.end()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Nothing mapped in [p, p + size).
  auto next = d.mappings.lower_bound(p);
  if (next != d.mappings.end() && next->first < p + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != d.mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > p) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, mem->second.fd,
           static_cast<off_t>(offset)) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ++mem->second.mappings;
  d.mappings[p] = Mapping{size, handle};
  d.mapped_bytes += size;
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  const uintptr_t p = static_cast<uintptr_t>(ptr);
  if (desc == nullptr || count != 1 || !IsDeviceZero(desc->location)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int prot;
  switch (desc->flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE:
      prot = PROT_NONE;
      break;
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      prot = PROT_READ;
      break;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      prot = PROT_READ | PROT_WRITE;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  if (!WholeMappings(d, p, size)) return CUDA_ERROR_INVALID_VALUE;
  if (mprotect(reinterpret_cast<void*>(p), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  const uintptr_t p = static_cast<uintptr_t>(ptr);
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  if (!WholeMappings(d, p, size)) return CUDA_ERROR_INVALID_VALUE;
  // Back to reserved, inaccessible addresses.
  if (mmap(reinterpret_cast<void*>(p), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (auto it = d.mappings.find(p); it != d.mappings.end() && it->first < p + size;) {
    const CUmemGenericAllocationHandle handle = it->second.handle;
    d.mapped_bytes -= it->second.size;
    --d.memory[handle].mappings;
    it = d.mappings.erase(it);
    DropIfUnused(d, handle);
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS:
      *name = "CUDA_SUCCESS";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
      *name = "CUDA_ERROR_INVALID_VALUE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *name = "CUDA_ERROR_ILLEGAL_ADDRESS";
      return CUDA_SUCCESS;
  }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned /*version*/,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || fn == nullptr || flags != cudaEnableDefault)
    return cudaErrorInvalidValue;
  struct Entry {
    const char* name;
    void* fn;
  };
  const Entry entries[] = {
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
  };
  *fn = nullptr;
  for (const Entry& e : entries) {
    if (std::strcmp(e.name, symbol) == 0) *fn = e.fn;
  }
  if (status != nullptr) {
    *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

namespace emu {

size_t MappedBytes() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  return d.mapped_bytes;
}

void LimitDeviceMemory(size_t bytes) {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  d.memory_limit = bytes;
}

void InjectStickyError(cudaError_t error) {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  d.sticky = error;
}

size_t DeviceAllocations() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  return d.allocations.size();
}

size_t InvalidFrees() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  return d.invalid_frees;
}

size_t HostToDeviceBytes() {
  Device& d = Dev();
  attnserve::MutexLock lock(&d.mu);
  return d.host_to_device_bytes;
}

cudaError_t FuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > kMaxSmemBytes) {
    return cudaErrorInvalidValue;
  }
  Attributes& a = Attrs();
  attnserve::MutexLock lock(&a.mu);
  a.max_smem[kernel] = value;
  return cudaSuccess;
}

bool LaunchAllowed(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535u ||
      grid.z > 65535u || threads == 0 || threads > 1024) {
    t_last_error = cudaErrorInvalidConfiguration;
    return false;
  }
  if (smem_bytes > kDefaultSmemBytes) {
    Attributes& a = Attrs();
    attnserve::MutexLock lock(&a.mu);
    const auto it = a.max_smem.find(kernel);
    if (it == a.max_smem.end() || smem_bytes > static_cast<size_t>(it->second)) {
      t_last_error = cudaErrorInvalidValue;
      return false;
    }
  }
  return true;
}

}  // namespace emu
