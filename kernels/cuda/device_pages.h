// A range of device addresses whose memory is mapped only where it is used (CUDA's virtual
// memory management: cuMemAddressReserve, cuMemCreate, cuMemMap), so that a page store can
// address a whole pool's worth of pages from one base pointer while the device holds only the
// granules its live pages lie in (CudaBackend's session pages, cuda_backend.h).
//
// The range is cut into granules (the device's allocation granularity, 2 MiB on current GPUs).
// Acquire(offset, len) counts one more user of every granule the bytes touch, mapping (read and
// write, on the range's device) each one that had none; Release undoes it, unmapping a granule
// whose last user went. Memory is created per granule and released as soon as it is mapped,
// so the mapping is its only owner: unmapping frees it.
//
// The driver's entry points come through the runtime (cudaGetDriverEntryPointByVersion): no
// link against libcuda, so a binary holding this code still starts on a machine without a GPU.
//
// Thread-compatible: the caller serialises Acquire, Release and the destructor. The calling
// thread must have the range's device current (cudaSetDevice). After a device reset (which
// destroys the range with its context) call Abandon() before destroying it.
#ifndef ATTNSERVE_KERNELS_CUDA_DEVICE_PAGES_H_
#define ATTNSERVE_KERNELS_CUDA_DEVICE_PAGES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/gpu_status.h"

namespace attnserve::kernels::cuda {

class DeviceAddressRange {
 public:
  // Reserves at least `bytes` (> 0) of addresses on `device`, rounded up to whole granules;
  // nothing is mapped. Fails when the driver lacks virtual memory management or the addresses
  // cannot be reserved.
  static GpuStatus Reserve(int device, int64_t bytes, std::unique_ptr<DeviceAddressRange>* out);
  ~DeviceAddressRange();
  DeviceAddressRange(const DeviceAddressRange&) = delete;
  DeviceAddressRange& operator=(const DeviceAddressRange&) = delete;

  char* base() const { return base_; }
  int64_t granule_bytes() const { return granule_; }
  // Bytes of device memory mapped now (whole granules).
  int64_t mapped_bytes() const { return mapped_granules_ * granule_; }

  // One more user of the granules of [offset, offset + len) (len > 0, inside the range), mapping
  // those that had none. On failure nothing changes (granules it mapped are unmapped again), and
  // out_of_memory() says whether the device had no memory left for a granule (any other failure
  // is the device's or the driver's).
  GpuStatus Acquire(int64_t offset, int64_t len);
  bool out_of_memory() const { return out_of_memory_; }
  // One user fewer of the granules of [offset, offset + len), as acquired before; unmaps those
  // left without one. Errors are not reported: the memory is lost to the range, not to the
  // caller, and freed with the context.
  void Release(int64_t offset, int64_t len);
  // The device was reset: the range and its mappings went with the context. The destructor
  // then calls nothing.
  void Abandon() { abandoned_ = true; }

 private:
  DeviceAddressRange(int device, char* base, int64_t bytes, int64_t granule)
      : device_(device),
        base_(base),
        bytes_(bytes),
        granule_(granule),
        users_(static_cast<size_t>(bytes / granule), 0) {}
  GpuStatus Map(int64_t granule_index);
  void Unmap(int64_t granule_index);

  const int device_;
  char* const base_;
  const int64_t bytes_;         // a multiple of granule_
  const int64_t granule_;       // the device's allocation granularity
  std::vector<int32_t> users_;  // per granule
  int64_t mapped_granules_ = 0;
  bool out_of_memory_ = false;  // of the last Map
  bool abandoned_ = false;
};

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_DEVICE_PAGES_H_
