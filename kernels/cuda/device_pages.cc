#include "kernels/cuda/device_pages.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace attnserve::kernels::cuda {
namespace {

// The driver calls of the range, looked up once through the runtime.
struct Driver {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuGetErrorName) error_name = nullptr;
  std::string error;  // the first symbol not found, empty when all were
};

template <typename F>
void Lookup(const char* symbol, F* fn, std::string* error) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // The symbols' ABI as of CUDA 12.0 (unchanged since virtual memory management came, 10.2).
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    if (error->empty()) {
      *error = std::string("the CUDA driver has no ") + symbol + " (" +
               (e != cudaSuccess ? cudaGetErrorName(e) : "symbol not found") + ")";
    }
    return;
  }
  *fn = reinterpret_cast<F>(p);
}

const Driver& TheDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    Lookup("cuMemGetAllocationGranularity", &d->granularity, &d->error);
    Lookup("cuMemAddressReserve", &d->reserve, &d->error);
    Lookup("cuMemAddressFree", &d->address_free, &d->error);
    Lookup("cuMemCreate", &d->create, &d->error);
    Lookup("cuMemRelease", &d->release, &d->error);
    Lookup("cuMemMap", &d->map, &d->error);
    Lookup("cuMemSetAccess", &d->set_access, &d->error);
    Lookup("cuMemUnmap", &d->unmap, &d->error);
    Lookup("cuGetErrorName", &d->error_name, &d->error);
    return d;
  }();
  return *driver;
}

// "what: CUDA_ERROR_X (code)" on failure.
GpuStatus DriverCheck(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return {};
  const char* name = nullptr;
  if (TheDriver().error_name(r, &name) != CUDA_SUCCESS || name == nullptr) name = "CUresult";
  return {std::string(what) + ": " + name + " (" + std::to_string(static_cast<int>(r)) + ")"};
}

CUmemAllocationProp DeviceMemory(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUdeviceptr Address(const char* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

GpuStatus DeviceAddressRange::Reserve(int device, int64_t bytes,
                                      std::unique_ptr<DeviceAddressRange>* out) {
  const Driver& d = TheDriver();
  if (!d.error.empty()) return {"device memory on demand: " + d.error};
  if (bytes <= 0)
    return {"device memory on demand: a range of " + std::to_string(bytes) + " bytes"};
  const CUmemAllocationProp prop = DeviceMemory(device);
  size_t granule = 0;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      DriverCheck(d.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                  "cuMemGetAllocationGranularity"));
  if (granule == 0) return {"cuMemGetAllocationGranularity: a granularity of 0"};
  const int64_t g = static_cast<int64_t>(granule);
  const int64_t size = (bytes + g - 1) / g * g;
  CUdeviceptr base = 0;
  ATTNSERVE_GPU_RETURN_IF_ERROR(DriverCheck(
      d.reserve(&base, static_cast<size_t>(size), granule, 0, 0), "cuMemAddressReserve"));
  out->reset(new DeviceAddressRange(device, reinterpret_cast<char*>(static_cast<uintptr_t>(base)),
                                    size, g));
  return {};
}

DeviceAddressRange::~DeviceAddressRange() {
  if (abandoned_) return;
  const Driver& d = TheDriver();
  for (int64_t i = 0; i < static_cast<int64_t>(users_.size()); ++i) {
    if (users_[i] > 0) Unmap(i);
  }
  d.address_free(Address(base_), static_cast<size_t>(bytes_));
}

GpuStatus DeviceAddressRange::Map(int64_t i) {
  const Driver& d = TheDriver();
  const CUmemAllocationProp prop = DeviceMemory(device_);
  const CUdeviceptr at = Address(base_ + i * granule_);
  const size_t size = static_cast<size_t>(granule_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult created = d.create(&handle, size, &prop, 0);
  out_of_memory_ = created == CUDA_ERROR_OUT_OF_MEMORY;
  ATTNSERVE_GPU_RETURN_IF_ERROR(DriverCheck(created, "cuMemCreate"));
  // The mapping keeps the memory: released now, it is freed by the unmap.
  GpuStatus st = DriverCheck(d.map(at, size, 0, handle, 0), "cuMemMap");
  d.release(handle);
  if (!st.ok()) return st;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  st = DriverCheck(d.set_access(at, size, &access, 1), "cuMemSetAccess");
  if (!st.ok()) {
    d.unmap(at, size);
    return st;
  }
  ++mapped_granules_;
  return {};
}

void DeviceAddressRange::Unmap(int64_t i) {
  TheDriver().unmap(Address(base_ + i * granule_), static_cast<size_t>(granule_));
  --mapped_granules_;
}

GpuStatus DeviceAddressRange::Acquire(int64_t offset, int64_t len) {
  const int64_t first = offset / granule_, last = (offset + len - 1) / granule_;
  for (int64_t i = first; i <= last; ++i) {
    if (users_[i] == 0) {
      if (GpuStatus st = Map(i); !st.ok()) {
        if (i > first) Release(offset, i * granule_ - offset);
        return st;
      }
    }
    ++users_[i];
  }
  return {};
}

void DeviceAddressRange::Release(int64_t offset, int64_t len) {
  const int64_t first = offset / granule_, last = (offset + len - 1) / granule_;
  for (int64_t i = first; i <= last; ++i) {
    if (--users_[i] == 0) Unmap(i);
  }
}

}  // namespace attnserve::kernels::cuda
