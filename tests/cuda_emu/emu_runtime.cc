// The host implementation of shim/cuda_runtime_api.h (README.md): launch checks, errors, and
// the memory, stream and device calls of the backend on one emulated device.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "base/mutex.h"
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

// The device's state: its live allocations (which cudaDeviceReset frees, as CUDA's does) and
// an injected sticky error (emu::InjectStickyError).
struct Device {
  attnserve::Mutex mu;
  std::set<void*> allocations ABSL_GUARDED_BY(mu);
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

namespace emu {

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
