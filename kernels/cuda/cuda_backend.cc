// CudaBackend: the device, its workers (streams, handles, staging and device buffers), faults
// and the device reset, memory figures. The computations are in cuda_attention.cc,
// cuda_multi_head.cc, cuda_page_store.cc and cuda_paged_attention.cc.
#include "kernels/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::cuda {

namespace {

constexpr size_t kGrowGranule = size_t{16} << 20;

// Errors after which the CUDA context is unusable: every later CUDA call of the process fails
// with them until cudaDeviceReset.
bool IsStickyError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// Streams and handles of a worker (its buffers grow on demand).
GpuStatus InitWorker(CudaBackend::Worker* w);
// Releases everything a worker holds; errors are ignored (the context may be broken).
void FreeWorker(CudaBackend::Worker* w);

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

std::vector<std::string> CudaDeviceNames() {
  std::vector<std::string> names;
  const int n = CudaDeviceCount();
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    names.push_back(absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                                 prop.totalGlobalMem >> 20, " MiB)"));
  }
  return names;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  if (options.num_streams < 1 || options.num_streams > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_streams must be in [1, 64]; was ", options.num_streams));
  }
  if (options.device_pool_bytes < (int64_t{64} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool_bytes must be at least 64 MiB; was ", options.device_pool_bytes));
  }
  if (options.pinned_staging_bytes_per_stream < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned_staging_bytes_per_stream must be at least 1 MiB; was ",
                     options.pinned_staging_bytes_per_stream));
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                     cudaGetErrorString(e), ")"));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device present");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be in [0, ", count, "); was ", options.device));
  }
  cudaDeviceProp prop{};
  RETURN_IF_GPU_ERROR(
      CudaCheck(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties"));
  if (prop.major < 8) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", options.device, " (", prop.name,
                                               ") has compute capability ", prop.major, ".",
                                               prop.minor, "; the CUDA backend needs 8.0+"));
  }
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options.device), "cudaSetDevice"));
  std::unique_ptr<CudaBackend> backend(new CudaBackend(
      options,
      absl::StrCat("cuda:", options.device, ": ", prop.name, " (sm_", prop.major, prop.minor, ")"),
      static_cast<int64_t>(prop.totalGlobalMem)));
  for (int i = 0; i < options.num_streams; ++i) {
    backend->workers_.push_back(std::make_unique<Worker>());
    RETURN_IF_GPU_ERROR(InitWorker(backend->workers_.back().get()));
  }
  MutexLock lock(&backend->mu_);
  for (auto& w : backend->workers_) backend->idle_.push_back(w.get());
  return backend;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(std::move(*b));
}

CudaBackend::CudaBackend(const CudaBackendOptions& options, std::string device_name,
                         int64_t total_bytes)
    : options_(options), device_name_(std::move(device_name)), device_total_bytes_(total_bytes) {}

namespace {

GpuStatus InitWorker(CudaBackend::Worker* w) {
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(cublasCreate(&w->blas), "cublasCreate"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(cublasLtCreate(&w->lt), "cublasLtCreate"));
  return CublasCheck(cublasSetStream(w->blas, w->stream), "cublasSetStream");
}

void FreeWorker(CudaBackend::Worker* w) {
  if (w->stream != nullptr) cudaStreamSynchronize(w->stream);
  if (w->device != nullptr) cudaFree(w->device);
  if (w->pinned != nullptr) cudaFreeHost(w->pinned);
  if (w->lt != nullptr) cublasLtDestroy(w->lt);
  if (w->blas != nullptr) cublasDestroy(w->blas);
  if (w->stream != nullptr) cudaStreamDestroy(w->stream);
  cudaGetLastError();
  *w = CudaBackend::Worker{};
}

}  // namespace

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device);
  for (auto& w : workers_) FreeWorker(w.get());
}

std::vector<DeviceInfo> CudaBackend::devices() const {
  return {DeviceInfo{device_name_, device_total_bytes_}};
}

std::string CudaBackend::PrecisionPolicy() const {
  return absl::StrCat(
      "cuda: attention operands ", ComputeTypeName(options_.float32_compute),
      " for FLOAT32 requests (FLOAT16/BFLOAT16 requests in their own type), float32 "
      "accumulation and softmax, probabilities rounded to the operand type, float32 output; "
      "error <= 2x a cuBLAS attention in the same operand type; session queries as sent, keys "
      "and values in the cache dtype, float32 scores; projections TF32 tensor cores with float32 "
      "accumulation and bias");
}

CudaMemoryFigures CudaBackend::MemoryFigures() const {
  CudaMemoryFigures f;
  size_t free_bytes = 0, total = 0;
  cudaSetDevice(options_.device);
  if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) {
    f.device_total_bytes = static_cast<int64_t>(total);
    f.device_used_bytes = static_cast<int64_t>(total - free_bytes);
  } else {
    cudaGetLastError();
    f.device_total_bytes = device_total_bytes_;
  }
  MutexLock lock(&mu_);
  f.pool_held_bytes = pool_held_bytes_;
  f.pinned_held_bytes = pinned_held_bytes_;
  f.session_pages_bytes = session_pages_bytes_;
  return f;
}

CudaBackend::Worker* CudaBackend::AcquireWorker() {
  MutexLock lock(&mu_);
  while (idle_.empty()) idle_changed_.Wait(&mu_);
  if (needs_reset_) {
    while (idle_.size() != workers_.size()) idle_changed_.Wait(&mu_);
    if (needs_reset_) ResetDeviceLocked();
  }
  Worker* w = idle_.back();
  idle_.pop_back();
  return w;
}

void CudaBackend::ReleaseWorker(Worker* w) {
  MutexLock lock(&mu_);
  idle_.push_back(w);
  idle_changed_.NotifyAll();
}

absl::Status CudaBackend::OnWorker(absl::FunctionRef<absl::Status(Worker* w)> run) {
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  absl::Status s = run(w);
  if (!s.ok()) {
    // Leave the stream idle for the next call whatever happened.
    cudaStreamSynchronize(w->stream);
    return MarkFaulted(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::MarkFaulted(absl::Status s) {
  // CUDA and cuBLAS failures are INTERNAL; a full pool or staging (RESOURCE_EXHAUSTED) is no
  // fault, and must not cost the device-wide synchronisation below.
  if (s.code() != absl::StatusCode::kInternal) return s;
  // The caller drained its stream; a sticky error now shows on any call.
  const cudaError_t last = cudaGetLastError();
  if (!IsStickyError(last) && !IsStickyError(cudaDeviceSynchronize())) return s;
  cudaGetLastError();
  {
    MutexLock lock(&mu_);
    needs_reset_ = true;
  }
  return absl::Status(s.code(), absl::StrCat(s.message(),
                                             " (device fault: the device is re-initialised "
                                             "before the next call)"));
}

void CudaBackend::ResetDeviceLocked() {
  // Every worker is idle (AcquireWorker waited), so nothing of this backend runs on the device.
  cudaSetDevice(options_.device);
  for (auto& w : workers_) FreeWorker(w.get());
  // The reset frees every allocation of the process on the device, the page stores' too: they
  // are lost from here on (CudaPageStore::lost), and must not free their stale pointers.
  cudaDeviceReset();
  cudaGetLastError();
  cudaSetDevice(options_.device);
  epoch_.fetch_add(1);
  pool_held_bytes_ = 0;
  pinned_held_bytes_ = 0;
  session_pages_bytes_ = 0;
  bool ok = true;
  for (auto& w : workers_) ok = InitWorker(w.get()).ok() && ok;
  needs_reset_ = !ok;  // a failed re-initialisation is retried by the next call
}

absl::Status CudaBackend::ReserveDevice(Worker* w, size_t bytes) {
  if (w->device_bytes >= bytes) return absl::OkStatus();
  const size_t want = (bytes + kGrowGranule - 1) / kGrowGranule * kGrowGranule;
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(w->stream), "synchronising before growth"));
  {
    MutexLock lock(&mu_);
    const int64_t after =
        pool_held_bytes_ - static_cast<int64_t>(w->device_bytes) + static_cast<int64_t>(want);
    if (after > options_.device_pool_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda backend: the call needs ", bytes, " bytes of device memory; the pool (",
          options_.device_pool_bytes, " bytes) holds ", pool_held_bytes_, " of which this worker ",
          w->device_bytes));
    }
    pool_held_bytes_ = after;
  }
  // Stream-ordered free and allocation: cudaFree/cudaMalloc synchronise the whole device, so
  // one worker growing its buffer stalled every other worker's kernels.
  if (w->device != nullptr) cudaFreeAsync(w->device, w->stream);
  w->device = nullptr;
  const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&w->device), want, w->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    w->device = nullptr;
    MutexLock lock(&mu_);
    pool_held_bytes_ -= static_cast<int64_t>(want);
    w->device_bytes = 0;
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: cudaMalloc of ", want, " bytes failed: ", cudaGetErrorName(e)));
  }
  w->device_bytes = want;
  return absl::OkStatus();
}

absl::Status CudaBackend::ReservePinned(Worker* w, size_t bytes) {
  if (w->pinned_bytes >= bytes) return absl::OkStatus();
  if (static_cast<int64_t>(bytes) > options_.pinned_staging_bytes_per_stream) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: the call needs ", bytes,
                     " bytes of pinned staging; the limit per stream is ",
                     options_.pinned_staging_bytes_per_stream));
  }
  const size_t want =
      std::min<size_t>((bytes + kGrowGranule - 1) / kGrowGranule * kGrowGranule,
                       static_cast<size_t>(options_.pinned_staging_bytes_per_stream));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(w->stream), "synchronising before growth"));
  if (w->pinned != nullptr) cudaFreeHost(w->pinned);
  {
    MutexLock lock(&mu_);
    pinned_held_bytes_ -= static_cast<int64_t>(w->pinned_bytes);
  }
  w->pinned = nullptr;
  w->pinned_bytes = 0;
  const cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&w->pinned), want, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    w->pinned = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat("cuda backend: cudaHostAlloc of ", want,
                                                     " bytes failed: ", cudaGetErrorName(e)));
  }
  w->pinned_bytes = want;
  MutexLock lock(&mu_);
  pinned_held_bytes_ += static_cast<int64_t>(want);
  return absl::OkStatus();
}

std::vector<DeviceMemory> CudaBackend::device_memory() const {
  const CudaMemoryFigures f = MemoryFigures();
  return {DeviceMemory{absl::StrCat("cuda:", options_.device), f.device_used_bytes,
                       f.device_total_bytes, f.pool_held_bytes + f.session_pages_bytes}};
}

}  // namespace attnserve::kernels::cuda
