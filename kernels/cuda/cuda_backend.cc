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
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::cuda {

struct CudaBackend::Worker {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  char* device = nullptr;  // grown on demand (ReserveDevice)
  size_t device_bytes = 0;
  char* pinned = nullptr;  // grown on demand (ReservePinned)
  size_t pinned_bytes = 0;
};

namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
constexpr size_t kGrowGranule = size_t{16} << 20;

absl::Status ToStatus(const GpuStatus& s) {
  return s.ok() ? absl::OkStatus() : absl::InternalError(absl::StrCat("cuda backend: ", s.error));
}
#define RETURN_IF_GPU_ERROR(expr)           \
  do {                                      \
    const absl::Status _s = ToStatus(expr); \
    if (!_s.ok()) return _s;                \
  } while (0)

// Offsets of buffers carved out of one allocation, 256-byte aligned.
class Layout {
 public:
  size_t Add(size_t bytes) {
    const size_t at = size_;
    size_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

template <typename T>
T* At(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

// Byte extent of a mask view over [B, H, Lq, Lk] (strides are non-negative).
int64_t MaskExtent(const MaskView& m, int64_t b, int64_t h, int64_t lq, int64_t lk) {
  return (b - 1) * m.batch_stride + (h - 1) * m.head_stride + (lq - 1) * m.row_stride +
         (lk - 1) * m.col_stride + 1;
}

bool MayHaveBlockedRows(bool mask, const int32_t* key_lengths, bool causal, int lq, int lk) {
  return mask || key_lengths != nullptr || (causal && lq > lk);
}

// Row strides, in elements, of q, k, v and o as a launch lays them out on the device: each row
// holds one token's heads side by side (head stride = head_dim, or v_head_dim for v and o).
struct DeviceRows {
  int64_t q, k, v, o;
};

// The one place FlashFwdParams is filled from AttentionParams: heads, dims, scale, causal and
// mask strides from `a` (every item of a launch shares them), the sequences and row strides from
// the launch. The device pointers (q, k, v, o, sequence tables, mask, v_mean) are left null for
// the caller to set once its buffers exist.
FlashFwdParams FlashParamsFor(const AttentionParams& a, int num_seqs, int max_seqlen_q,
                              DeviceRows rows) {
  FlashFwdParams fp;
  fp.num_seqs = num_seqs;
  fp.max_seqlen_q = max_seqlen_q;
  fp.num_heads = a.num_heads;
  fp.num_kv_heads = a.num_kv_heads;
  fp.head_dim = a.head_dim;
  fp.v_head_dim = a.v_head_dim;
  fp.scale = a.scale;
  fp.scale_log2 = a.scale * kLog2e;
  fp.causal = a.causal;
  fp.q_row_stride = rows.q;
  fp.k_row_stride = rows.k;
  fp.v_row_stride = rows.v;
  fp.o_row_stride = rows.o;
  fp.q_head_stride = fp.k_head_stride = a.head_dim;
  fp.v_head_stride = fp.o_head_stride = a.v_head_dim;
  if (a.mask.present()) {
    fp.mask_batch_stride = a.mask.batch_stride;
    fp.mask_head_stride = a.mask.head_stride;
    fp.mask_row_stride = a.mask.row_stride;
    fp.mask_col_stride = a.mask.col_stride;
  }
  return fp;
}

bool Compatible(const AttentionParams& a, const AttentionParams& b) {
  return a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.v_head_dim == b.v_head_dim && a.causal == b.causal &&
         a.scale == b.scale && !a.mask.present() && !b.mask.present() && a.weights == nullptr &&
         b.weights == nullptr && (a.q_len == 1) == (b.q_len == 1);
}

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

// An upper bound of the pinned staging an item adds to a launch group (RunAttentionGroup's
// host layout without the alignment, which kGroupSlack covers): q, k, v, out, a float32 copy
// of v, the sequence tables.
int64_t PinnedBytes(const AttentionParams& p) {
  const int64_t q = int64_t{p.batch} * p.q_len * p.num_heads;
  const int64_t k = int64_t{p.batch} * p.kv_len * p.num_kv_heads;
  return int64_t{sizeof(float)} *
             (q * (p.head_dim + p.v_head_dim) + k * (p.head_dim + 2 * p.v_head_dim)) +
         int64_t{3 * sizeof(int)} * p.batch;
}
constexpr int64_t kGroupSlack = 16 * 256;  // Layout rounds each of a group's buffers to 256

}  // namespace

std::vector<std::pair<size_t, size_t>> PlanAttentionGroups(absl::Span<const AttentionParams> batch,
                                                           int64_t pinned_limit) {
  std::vector<std::pair<size_t, size_t>> groups;
  size_t i = 0;
  while (i < batch.size()) {
    int64_t bytes = kGroupSlack + PinnedBytes(batch[i]);
    size_t j = i + 1;
    while (j < batch.size() && Compatible(batch[i], batch[j]) &&
           bytes + PinnedBytes(batch[j]) <= pinned_limit) {
      bytes += PinnedBytes(batch[j]);
      ++j;
    }
    groups.emplace_back(i, j);
    i = j;
  }
  return groups;
}

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

namespace {

// FLOAT16 and BFLOAT16 requests compute in their own type (their float32 copies convert back
// exactly); FLOAT32 ones in the configured operand type.
ComputeType OperandType(DType input, ComputeType float32_compute) {
  switch (input) {
    case DType::kFloat16:
      return ComputeType::kFloat16;
    case DType::kBFloat16:
      return ComputeType::kBFloat16;
    default:
      return float32_compute;
  }
}

// Runs `batch` through `run` in runs of items sharing an input dtype (the server's batches
// share one, so this is a single call there).
template <typename Params, typename Run>
absl::Status ByOperandType(absl::Span<const Params> batch, ComputeType float32_compute, Run run) {
  size_t begin = 0;
  while (begin < batch.size()) {
    size_t end = begin + 1;
    while (end < batch.size() && batch[end].input_dtype == batch[begin].input_dtype) ++end;
    if (absl::Status s = run(batch.subspan(begin, end - begin),
                             OperandType(batch[begin].input_dtype, float32_compute));
        !s.ok()) {
      return s;
    }
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<DeviceMemory> CudaBackend::device_memory() const {
  const CudaMemoryFigures f = MemoryFigures();
  return {DeviceMemory{absl::StrCat("cuda:", options_.device), f.device_used_bytes,
                       f.device_total_bytes, f.pool_held_bytes + f.session_pages_bytes}};
}

absl::Status CudaBackend::Attend(absl::Span<const AttentionParams> batch) {
  return ByOperandType(batch, options_.float32_compute,
                       [this](auto items, ComputeType type) { return AttendAs(items, type); });
}

absl::Status CudaBackend::MultiHead(absl::Span<const MultiHeadParams> batch) {
  return ByOperandType(batch, options_.float32_compute,
                       [this](auto items, ComputeType type) { return MultiHeadAs(items, type); });
}

absl::Status CudaBackend::AttendAs(absl::Span<const AttentionParams> batch, ComputeType type) {
  if (batch.empty()) return absl::OkStatus();
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  for (const auto& [begin, end] :
       PlanAttentionGroups(batch, options_.pinned_staging_bytes_per_stream)) {
    absl::Status s = RunAttentionGroup(w, batch.subspan(begin, end - begin), type);
    if (!s.ok()) {
      // Leave the stream idle for the next call whatever happened.
      cudaStreamSynchronize(w->stream);
      return MarkFaulted(std::move(s));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunAttentionGroup(Worker* w, absl::Span<const AttentionParams> items,
                                            ComputeType type) {
  const AttentionParams& first = items[0];
  const int hq = first.num_heads, hkv = first.num_kv_heads;
  const int d = first.head_dim, dv = first.v_head_dim;
  int num_seqs = 0, max_q = 0;
  int64_t tq = 0, tk = 0;
  bool any_key_lengths = false, need_mean = false;
  for (const AttentionParams& p : items) {
    num_seqs += p.batch;
    tq += int64_t{p.batch} * p.q_len;
    tk += int64_t{p.batch} * p.kv_len;
    max_q = std::max(max_q, p.q_len);
    any_key_lengths |= p.key_lengths != nullptr;
    need_mean |= MayHaveBlockedRows(p.mask.present(), p.key_lengths, p.causal, p.q_len, p.kv_len);
  }
  const bool with_weights = first.weights != nullptr;  // then items.size() == 1
  const int64_t mask_bytes =
      first.mask.present() ? MaskExtent(first.mask, first.batch, hq, first.q_len, first.kv_len) : 0;

  // Pinned staging: inputs, output, sequence tables.
  Layout host;
  const size_t h_q = host.Add(tq * hq * d * sizeof(float));
  const size_t h_k = host.Add(tk * hkv * d * sizeof(float));
  const size_t h_v = host.Add(tk * hkv * dv * sizeof(float));
  const size_t h_o = host.Add(tq * hq * dv * sizeof(float));
  const size_t h_cu = host.Add((3 * num_seqs + 2) * sizeof(int));
  // 16-bit inputs (the group shares one input_dtype, and OperandType made it `type`) go to the
  // device as they are; only the value mean, when needed, reads a float32 copy of v.
  const bool as_is = first.input_dtype != DType::kFloat32;
  const size_t h_v32 = host.Add(as_is && need_mean ? tk * hkv * dv * sizeof(float) : 0);
  // Device buffers.
  Layout dev;
  const size_t d_q32 = dev.Add(tq * hq * d * sizeof(float));
  const size_t d_k32 = dev.Add(tk * hkv * d * sizeof(float));
  const size_t d_v32 = dev.Add(tk * hkv * dv * sizeof(float));
  const size_t d_q16 = dev.Add(tq * hq * d * 2);
  const size_t d_k16 = dev.Add(tk * hkv * d * 2);
  const size_t d_v16 = dev.Add(tk * hkv * dv * 2);
  const size_t d_o = dev.Add(tq * hq * dv * sizeof(float));
  const size_t d_cu = dev.Add((3 * num_seqs + 2) * sizeof(int));
  const size_t d_mean = dev.Add(need_mean ? size_t(num_seqs) * hkv * dv * sizeof(float) : 0);
  const size_t d_mask = dev.Add(mask_bytes);
  const size_t d_weights = dev.Add(
      with_weights ? size_t(first.batch) * hq * first.q_len * first.kv_len * sizeof(float) : 0);

  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;

  // Sequence tables (host copies are also what the naive path reads).
  int* cu_q = At<int>(w->pinned, h_cu);
  int* cu_k = cu_q + num_seqs + 1;
  int* klen = cu_k + num_seqs + 1;
  {
    int s = 0;
    cu_q[0] = cu_k[0] = 0;
    for (const AttentionParams& p : items) {
      for (int b = 0; b < p.batch; ++b, ++s) {
        cu_q[s + 1] = cu_q[s] + p.q_len;
        cu_k[s + 1] = cu_k[s] + p.kv_len;
        klen[s] = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
      }
    }
  }
  // Packed [tokens, heads, dim] (below).
  FlashFwdParams fp =
      FlashParamsFor(first, num_seqs, max_q,
                     {int64_t{hq} * d, int64_t{hkv} * d, int64_t{hkv} * dv, int64_t{hq} * dv});
  const bool naive = with_weights || SelectFlashPath(fp) == FlashPath::kUnsupported;
  // Decode steps (one query token per sequence) take the decode path (flash_decode_kernel.h).
  // Compatible() never packs a q_len == 1 item with others, so the choice depends only on the
  // item itself (batch invariance).
  const bool decode = !naive && DecodeSupported(fp);
  int max_k = 0;
  for (int s = 0; s < num_seqs; ++s) max_k = std::max(max_k, cu_k[s + 1] - cu_k[s]);
  const size_t d_ws = dev.Add(naive    ? NaiveAttentionWorkspaceBytes(fp, cu_q, cu_k)
                              : decode ? FlashDecodeWorkspaceBytes(fp, max_k)
                                       : 0);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  fp.q = At<void>(base, d_q16);
  fp.k = At<void>(base, d_k16);
  fp.v = At<void>(base, d_v16);
  fp.o = At<float>(base, d_o);
  fp.cu_seqlens_q = At<int>(base, d_cu);
  fp.cu_seqlens_k = fp.cu_seqlens_q + num_seqs + 1;
  fp.key_lengths = any_key_lengths ? fp.cu_seqlens_k + num_seqs + 1 : nullptr;
  fp.v_mean = need_mean ? At<float>(base, d_mean) : nullptr;
  if (first.mask.present()) fp.mask = At<uint8_t>(base, d_mask);
  cudaStream_t stream = w->stream;
  RETURN_IF_GPU_ERROR(
      CudaCheck(cudaMemcpyAsync(At<int>(base, d_cu), cu_q, (3 * num_seqs + 2) * sizeof(int),
                                cudaMemcpyHostToDevice, stream),
                "copying sequence tables"));
  if (first.mask.present()) {
    RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(At<uint8_t>(base, d_mask), first.mask.data,
                                                  mask_bytes, cudaMemcpyHostToDevice, stream),
                                  "copying the mask"));
  }

  // Pack q, k, v into [tokens, heads, dim] and send each while the next is packed.
  struct Tensor {
    size_t host, dev32, dev16;
    int heads, dim;
    int64_t tokens;
    int which;  // 0 q, 1 k, 2 v
  };
  const Tensor tensors[3] = {{h_q, d_q32, d_q16, hq, d, tq, 0},
                             {h_k, d_k32, d_k16, hkv, d, tk, 1},
                             {h_v, d_v32, d_v16, hkv, dv, tk, 2}};
  const size_t esize = DTypeSize(first.input_dtype);
  for (const Tensor& t : tensors) {
    char* dst = At<char>(w->pinned, t.host);
    float* dst32 = At<float>(w->pinned, h_v32);
    const bool widen_v = as_is && need_mean && t.which == 2;
    int64_t token0 = 0;
    for (const AttentionParams& p : items) {
      const InputView& view = t.which == 0 ? p.q : (t.which == 1 ? p.k : p.v);
      const int len = t.which == 0 ? p.q_len : p.kv_len;
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < t.heads; ++h) {
          for (int r = 0; r < len; ++r) {
            const int64_t at = ((token0 + r) * t.heads + h) * t.dim;
            const char* src = static_cast<const char*>(view.data) + view.offset(b, h, r) * esize;
            std::memcpy(dst + at * esize, src, t.dim * esize);
            if (widen_v) ToFloat32(first.input_dtype, src, t.dim, dst32 + at);
          }
        }
        token0 += len;
      }
    }
    const int64_t n = t.tokens * t.heads * t.dim;
    if (as_is) {
      RETURN_IF_GPU_ERROR(CudaCheck(
          cudaMemcpyAsync(At<char>(base, t.dev16), dst, n * esize, cudaMemcpyHostToDevice, stream),
          "copying inputs to the device"));
      if (widen_v) {
        RETURN_IF_GPU_ERROR(
            CudaCheck(cudaMemcpyAsync(At<float>(base, t.dev32), dst32, n * sizeof(float),
                                      cudaMemcpyHostToDevice, stream),
                      "copying inputs to the device"));
      }
      continue;
    }
    RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(At<float>(base, t.dev32), dst, n * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream),
                                  "copying inputs to the device"));
    RETURN_IF_GPU_ERROR(
        ConvertFromFloat(At<float>(base, t.dev32), At<void>(base, t.dev16), n, type, stream));
  }
  if (need_mean) {
    RETURN_IF_GPU_ERROR(ValueMean(At<float>(base, d_v32), fp.v_row_stride, fp.v_head_stride,
                                  fp.cu_seqlens_k, num_seqs, hkv, dv, At<float>(base, d_mean),
                                  stream));
  }
  if (naive) {
    RETURN_IF_GPU_ERROR(NaiveAttentionForward(fp, type, cu_q, cu_k,
                                              any_key_lengths ? klen : nullptr,
                                              with_weights ? At<float>(base, d_weights) : nullptr,
                                              At<void>(base, d_ws), w->blas, stream));
  } else if (decode) {
    RETURN_IF_GPU_ERROR(FlashDecode(fp, type, max_k, At<void>(base, d_ws), stream));
  } else {
    RETURN_IF_GPU_ERROR(FlashForward(fp, type, stream));
  }
  float* out_host = At<float>(w->pinned, h_o);
  RETURN_IF_GPU_ERROR(CudaCheck(
      cudaMemcpyAsync(out_host, fp.o, tq * hq * dv * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "copying the output back"));
  if (with_weights) {
    RETURN_IF_GPU_ERROR(CudaCheck(
        cudaMemcpyAsync(first.weights, At<float>(base, d_weights),
                        size_t(first.batch) * hq * first.q_len * first.kv_len * sizeof(float),
                        cudaMemcpyDeviceToHost, stream),
        "copying the weights back"));
  }
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "attention"));

  int64_t token0 = 0;
  for (const AttentionParams& p : items) {
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < hq; ++h) {
        for (int r = 0; r < p.q_len; ++r) {
          std::memcpy(p.out.row(b, h, r), out_host + ((token0 + r) * hq + h) * dv,
                      dv * sizeof(float));
        }
      }
      token0 += p.q_len;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::MultiHeadAs(absl::Span<const MultiHeadParams> batch, ComputeType type) {
  if (batch.empty()) return absl::OkStatus();
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  for (const MultiHeadParams& p : batch) {
    absl::Status s = RunMultiHead(w, p, type);
    if (!s.ok()) {
      cudaStreamSynchronize(w->stream);
      return MarkFaulted(std::move(s));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Project(absl::Span<const ProjectionParams> batch) {
  if (batch.empty()) return absl::OkStatus();
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  for (const ProjectionParams& p : batch) {
    absl::Status s = RunProjection(w, p);
    if (!s.ok()) {
      cudaStreamSynchronize(w->stream);
      return MarkFaulted(std::move(s));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunProjection(Worker* w, const ProjectionParams& p) {
  const int dm = p.module->d_model, n = p.n();
  const int64_t rows = p.rows;
  Layout host;
  const size_t h_x = host.Add(rows * dm * sizeof(float));
  const size_t h_y = host.Add(rows * n * sizeof(float));
  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;
  Layout dev;
  const size_t d_x = dev.Add(rows * dm * sizeof(float));
  const size_t d_w = dev.Add(size_t(n) * dm * sizeof(float));
  const size_t d_b = dev.Add(size_t(n) * sizeof(float));
  const size_t d_y = dev.Add(rows * n * sizeof(float));
  const size_t d_lt = dev.Add(kLtWorkspaceBytes);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  cudaStream_t stream = w->stream;
  auto h2d = [&](size_t dev_off, const void* src, size_t bytes, const char* what) {
    return CudaCheck(cudaMemcpyAsync(base + dev_off, src, bytes, cudaMemcpyHostToDevice, stream),
                     what);
  };
  // 16-bit inputs widened (exactly) while they are staged, as MultiHead's.
  float* x = At<float>(w->pinned, h_x);
  ToFloat32(p.x_type, p.x, rows * dm, x);
  RETURN_IF_GPU_ERROR(h2d(d_x, x, rows * dm * sizeof(float), "copying projection inputs"));
  RETURN_IF_GPU_ERROR(h2d(d_w, p.w(), size_t(n) * dm * sizeof(float), "copying weights"));
  RETURN_IF_GPU_ERROR(h2d(d_b, p.bias(), size_t(n) * sizeof(float), "copying the bias"));
  RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_x), At<float>(base, d_w),
                                     At<float>(base, d_b), At<float>(base, d_y), rows, dm, n},
                                    w->lt, w->blas, At<void>(base, d_lt), kLtWorkspaceBytes,
                                    stream));
  float* y = At<float>(w->pinned, h_y);
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(y, At<float>(base, d_y), rows * n * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream),
                                "copying projections back"));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "projection"));
  std::memcpy(p.y, y, rows * n * sizeof(float));
  return absl::OkStatus();
}

absl::Status CudaBackend::RunMultiHead(Worker* w, const MultiHeadParams& p, ComputeType type) {
  const MultiHeadWeights& m = *p.module;
  const int dm = m.d_model, h = m.num_heads, dk = m.head_dim();
  const int64_t nq = int64_t{p.batch} * p.q_len, nk = int64_t{p.batch} * p.kv_len;
  const bool self = p.self_attention;
  const int num_seqs = p.batch;
  const bool with_weights = p.weights != nullptr;
  const bool need_mean =
      MayHaveBlockedRows(p.mask.present(), p.key_lengths, p.causal, p.q_len, p.kv_len);
  const int64_t mask_bytes =
      p.mask.present() ? MaskExtent(p.mask, p.batch, h, p.q_len, p.kv_len) : 0;

  Layout host;
  const size_t h_xq = host.Add(nq * dm * sizeof(float));
  const size_t h_xk = host.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t h_xv = host.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t h_out = host.Add(nq * dm * sizeof(float));
  const size_t h_cu = host.Add((3 * num_seqs + 2) * sizeof(int));
  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;

  int* cu_q = At<int>(w->pinned, h_cu);
  int* cu_k = cu_q + num_seqs + 1;
  int* klen = cu_k + num_seqs + 1;
  cu_q[0] = cu_k[0] = 0;
  for (int b = 0; b < num_seqs; ++b) {
    cu_q[b + 1] = cu_q[b] + p.q_len;
    cu_k[b + 1] = cu_k[b] + p.kv_len;
    klen[b] = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  }

  // Projections: self-attention -> one [nq, 3 dm] GEMM; else three.
  const int64_t proj_elems = self ? nq * 3 * dm : nq * dm + 2 * nk * dm;
  Layout dev;
  const size_t d_xq = dev.Add(nq * dm * sizeof(float));
  const size_t d_xk = dev.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t d_xv = dev.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t d_wqkv = dev.Add(m.w_qkv.size() * sizeof(float));
  const size_t d_bqkv = dev.Add(m.b_qkv.size() * sizeof(float));
  const size_t d_wo = dev.Add(m.w_o.size() * sizeof(float));
  const size_t d_bo = dev.Add(m.b_o.size() * sizeof(float));
  const size_t d_proj = dev.Add(proj_elems * sizeof(float));
  const size_t d_proj16 = dev.Add(proj_elems * 2);
  const size_t d_attn = dev.Add(nq * dm * sizeof(float));
  const size_t d_out = dev.Add(nq * dm * sizeof(float));
  const size_t d_cu = dev.Add((3 * num_seqs + 2) * sizeof(int));
  const size_t d_mean = dev.Add(need_mean ? size_t(num_seqs) * h * dk * sizeof(float) : 0);
  const size_t d_mask = dev.Add(mask_bytes);
  const size_t d_weights =
      dev.Add(with_weights ? size_t(p.batch) * h * p.q_len * p.kv_len * sizeof(float) : 0);
  const size_t d_lt = dev.Add(kLtWorkspaceBytes);

  // The heads of the projections as HeadAttentionParams splits them for every backend: rows of
  // the fused [nq, 3 dm] buffer (self-attention) or of three [n, dm] ones, the concatenated
  // output [nq, dm]. Only its shape is used here; the pointers are device ones, set below.
  const int64_t proj_ld = self ? 3 * dm : dm;
  const AttentionParams heads = HeadAttentionParams(
      p, ProjectedQkv{nullptr, proj_ld, nullptr, proj_ld, nullptr, proj_ld, DType::kFloat32},
      nullptr, dm);
  FlashFwdParams fp = FlashParamsFor(
      heads, num_seqs, p.q_len, {heads.q.row_stride, heads.k.row_stride, heads.v.row_stride, dm});
  // The naive path's workspace is sized before the pointers are known; SelectFlashPath only
  // returns kUnsupported for v_head_dim > 256 here (the buffers are all suitably aligned).
  const bool naive_expected = with_weights || dk > kGenericMaxVHeadDim;
  const size_t d_ws = dev.Add(naive_expected ? NaiveAttentionWorkspaceBytes(fp, cu_q, cu_k) : 0);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  cudaStream_t stream = w->stream;
  float* proj = At<float>(base, d_proj);
  char* proj16 = At<char>(base, d_proj16);
  const float* q32 = proj;
  const float* k32 = self ? proj + dm : proj + nq * dm;
  const float* v32 = self ? proj + 2 * dm : proj + nq * dm + nk * dm;
  fp.q = proj16 + (q32 - proj) * 2;
  fp.k = proj16 + (k32 - proj) * 2;
  fp.v = proj16 + (v32 - proj) * 2;
  fp.o = At<float>(base, d_attn);
  fp.cu_seqlens_q = At<int>(base, d_cu);
  fp.cu_seqlens_k = fp.cu_seqlens_q + num_seqs + 1;
  fp.key_lengths = p.key_lengths != nullptr ? fp.cu_seqlens_k + num_seqs + 1 : nullptr;
  fp.v_mean = need_mean ? At<float>(base, d_mean) : nullptr;
  if (p.mask.present()) fp.mask = At<uint8_t>(base, d_mask);
  const bool naive = naive_expected;

  auto h2d = [&](size_t dev_off, const void* src, size_t bytes, const char* what) {
    return CudaCheck(cudaMemcpyAsync(base + dev_off, src, bytes, cudaMemcpyHostToDevice, stream),
                     what);
  };
  RETURN_IF_GPU_ERROR(h2d(d_cu, cu_q, (3 * num_seqs + 2) * sizeof(int), "copying tables"));
  if (p.mask.present()) RETURN_IF_GPU_ERROR(h2d(d_mask, p.mask.data, mask_bytes, "copying mask"));
  // Weights straight from the module's vectors (pageable; see the report on caching them).
  RETURN_IF_GPU_ERROR(h2d(d_wqkv, m.w_qkv.data(), m.w_qkv.size() * sizeof(float), "copying W_qkv"));
  RETURN_IF_GPU_ERROR(h2d(d_bqkv, m.b_qkv.data(), m.b_qkv.size() * sizeof(float), "copying b_qkv"));
  RETURN_IF_GPU_ERROR(h2d(d_wo, m.w_o.data(), m.w_o.size() * sizeof(float), "copying W_o"));
  RETURN_IF_GPU_ERROR(h2d(d_bo, m.b_o.data(), m.b_o.size() * sizeof(float), "copying b_o"));
  const float* wqkv = At<float>(base, d_wqkv);
  const float* bqkv = At<float>(base, d_bqkv);
  void* lt_ws = At<void>(base, d_lt);
  // The projections take float32: 16-bit inputs are widened while they are staged (the staging
  // copy is made either way).
  auto stage = [&](size_t host_off, size_t dev_off, const void* src, int64_t rows) {
    float* dst = At<float>(w->pinned, host_off);
    ToFloat32(p.input_dtype, src, rows * dm, dst);
    return h2d(dev_off, dst, rows * dm * sizeof(float), "copying inputs");
  };
  RETURN_IF_GPU_ERROR(stage(h_xq, d_xq, p.query, nq));
  if (self) {
    RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_xq), wqkv, bqkv, proj, nq, dm, 3 * dm},
                                      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  } else {
    RETURN_IF_GPU_ERROR(stage(h_xk, d_xk, p.key, nk));
    RETURN_IF_GPU_ERROR(stage(h_xv, d_xv, p.value, nk));
    const int64_t dd = int64_t{dm} * dm;
    RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_xq), wqkv, bqkv, proj, nq, dm, dm}, w->lt,
                                      w->blas, lt_ws, kLtWorkspaceBytes, stream));
    RETURN_IF_GPU_ERROR(
        LinearForward({At<float>(base, d_xk), wqkv + dd, bqkv + dm, proj + nq * dm, nk, dm, dm},
                      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
    RETURN_IF_GPU_ERROR(LinearForward(
        {At<float>(base, d_xv), wqkv + 2 * dd, bqkv + 2 * dm, proj + nq * dm + nk * dm, nk, dm, dm},
        w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  }
  RETURN_IF_GPU_ERROR(ConvertFromFloat(proj, proj16, proj_elems, type, stream));
  if (need_mean) {
    RETURN_IF_GPU_ERROR(ValueMean(v32, fp.v_row_stride, fp.v_head_stride, fp.cu_seqlens_k, num_seqs,
                                  h, dk, At<float>(base, d_mean), stream));
  }
  if (naive) {
    RETURN_IF_GPU_ERROR(NaiveAttentionForward(fp, type, cu_q, cu_k,
                                              p.key_lengths != nullptr ? klen : nullptr,
                                              with_weights ? At<float>(base, d_weights) : nullptr,
                                              At<void>(base, d_ws), w->blas, stream));
  } else {
    RETURN_IF_GPU_ERROR(FlashForward(fp, type, stream));
  }
  RETURN_IF_GPU_ERROR(LinearForward(
      {fp.o, At<float>(base, d_wo), At<float>(base, d_bo), At<float>(base, d_out), nq, dm, dm},
      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  float* out_host = At<float>(w->pinned, h_out);
  RETURN_IF_GPU_ERROR(
      CudaCheck(cudaMemcpyAsync(out_host, At<float>(base, d_out), nq * dm * sizeof(float),
                                cudaMemcpyDeviceToHost, stream),
                "copying the output back"));
  if (with_weights) {
    RETURN_IF_GPU_ERROR(
        CudaCheck(cudaMemcpyAsync(p.weights, At<float>(base, d_weights),
                                  size_t(p.batch) * h * p.q_len * p.kv_len * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  "copying the weights back"));
  }
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "multi-head attention"));
  std::memcpy(p.out, out_host, nq * dm * sizeof(float));
  return absl::OkStatus();
}

namespace {

absl::Status LostPagesError() {
  return absl::FailedPreconditionError(
      "cuda backend: the session pages of this store were lost: the device was re-initialised "
      "after a fault");
}

}  // namespace

// A PageStore in device memory (the header comment's "Session pages"). Every operation takes a
// worker of the backend, like a call: its stream, staging and device buffer, and the exclusion
// of a device reset while it runs, so that lost() checked after taking it stays true or false
// until the operation ends.
//
// K and V each have a DeviceAddressRange of the whole capacity; a page gets device memory when
// it is first written (WriteRows, CopyPage's target) and gives it back when discarded: the
// granules a page lies in stay mapped while any live page lies in them.
class CudaPageStore final : public PageStore {
 public:
  CudaPageStore(CudaBackend* backend, const PageStoreShape& shape, uint64_t epoch,
                std::unique_ptr<DeviceAddressRange> k, std::unique_ptr<DeviceAddressRange> v)
      : PageStore(shape),
        backend_(backend),
        epoch_(epoch),
        k_(std::move(k)),
        v_(std::move(v)),
        live_(static_cast<size_t>(shape.capacity), false) {}

  ~CudaPageStore() override {
    cudaSetDevice(backend_->options_.device);
    CudaBackend::Worker* w = backend_->AcquireWorker();
    MutexLock lock(&map_mu_);
    // After a reset the ranges are gone with the context (and the count was zeroed).
    if (lost()) {
      k_->Abandon();
      v_->Abandon();
    } else {
      ReleaseDiscardedLocked();
      const int64_t mapped = MappedBytesLocked();
      k_.reset();
      v_.reset();
      cudaGetLastError();
      MutexLock backend_lock(&backend_->mu_);
      backend_->session_pages_bytes_ -= mapped;
    }
    backend_->ReleaseWorker(w);
  }

  bool on_device() const override { return true; }
  void* k_base() const override { return k_->base(); }
  void* v_base() const override { return v_->base(); }
  bool lost() const override { return backend_->epoch_.load() != epoch_; }

  // The device memory behind `page` goes back to the device at the store's next operation (or
  // its destruction), which holds a worker and so excludes a reset; once no live page shares
  // its granules. Here: no worker is taken under the caller's (the session manager's) lock.
  void Discard(int32_t page) override {
    MutexLock lock(&map_mu_);
    if (!live_[page]) return;
    live_[page] = false;
    discarded_.push_back(page);
  }

  absl::Status WriteRows(const void* k_rows, const void* v_rows,
                         absl::Span<const int64_t> rows) override {
    if (rows.empty()) return absl::OkStatus();
    return WithWorker([&](CudaBackend::Worker* w) -> absl::Status {
      {
        const int64_t rows_per_page = int64_t{shape().num_kv_heads} * shape().page_size;
        MutexLock lock(&map_mu_);
        for (const int64_t row : rows) {
          if (absl::Status s = MakeLiveLocked(static_cast<int32_t>(row / rows_per_page)); !s.ok())
            return s;
        }
      }
      const size_t esize = DTypeSize(shape().dtype);
      const size_t k_row = static_cast<size_t>(shape().head_dim) * esize;
      const size_t v_row = static_cast<size_t>(shape().v_head_dim) * esize;
      // Rows in chunks that fit the staging and the device pool (a long prefill's rows may not
      // fit at once); one copy and one scatter launch per chunk.
      const size_t limit =
          static_cast<size_t>(std::min(backend_->options_.pinned_staging_bytes_per_stream,
                                       backend_->options_.device_pool_bytes));
      const size_t chunk =
          std::max<size_t>(1, (limit - 3 * 256) / (k_row + v_row + sizeof(int64_t)));
      const auto* k = static_cast<const char*>(k_rows);
      const auto* v = static_cast<const char*>(v_rows);
      for (size_t begin = 0; begin < rows.size(); begin += chunk) {
        const size_t n = std::min(chunk, rows.size() - begin);
        Layout lay;
        const size_t o_k = lay.Add(n * k_row);
        const size_t o_v = lay.Add(n * v_row);
        const size_t o_rows = lay.Add(n * sizeof(int64_t));
        absl::Status st = backend_->ReservePinned(w, lay.size());
        if (st.ok()) st = backend_->ReserveDevice(w, lay.size());
        if (!st.ok()) return st;
        char* host = w->pinned;
        std::memcpy(host + o_k, k + begin * k_row, n * k_row);
        std::memcpy(host + o_v, v + begin * v_row, n * v_row);
        std::memcpy(host + o_rows, rows.data() + begin, n * sizeof(int64_t));
        char* dev = w->device;
        RETURN_IF_GPU_ERROR(
            CudaCheck(cudaMemcpyAsync(dev, host, lay.size(), cudaMemcpyHostToDevice, w->stream),
                      "copying new K and V rows"));
        RETURN_IF_GPU_ERROR(PagedScatterRows(
            shape().dtype, dev + o_k, dev + o_v, At<int64_t>(dev, o_rows), static_cast<int64_t>(n),
            shape().head_dim, shape().v_head_dim, k_->base(), v_->base(), w->stream));
        // The staging is rewritten by the next chunk (and the next call).
        RETURN_IF_GPU_ERROR(
            CudaCheck(cudaStreamSynchronize(w->stream), "writing K and V rows to the pages"));
      }
      return absl::OkStatus();
    });
  }

  absl::Status CopyPage(int32_t from, int32_t to) override {
    return WithWorker([&](CudaBackend::Worker* w) -> absl::Status {
      {
        MutexLock lock(&map_mu_);
        if (absl::Status s = LiveOrError(from); !s.ok()) return s;
        if (absl::Status s = MakeLiveLocked(to); !s.ok()) return s;
      }
      const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
      char* k = k_->base();
      char* v = v_->base();
      RETURN_IF_GPU_ERROR(
          CudaCheck(cudaMemcpyAsync(k + to * kb, k + from * kb, static_cast<size_t>(kb),
                                    cudaMemcpyDeviceToDevice, w->stream),
                    "copying a K page"));
      RETURN_IF_GPU_ERROR(
          CudaCheck(cudaMemcpyAsync(v + to * vb, v + from * vb, static_cast<size_t>(vb),
                                    cudaMemcpyDeviceToDevice, w->stream),
                    "copying a V page"));
      return ToStatus(CudaCheck(cudaStreamSynchronize(w->stream), "copying a page"));
    });
  }

  absl::Status ReadPage(int32_t page, void* k, void* v) const override {
    return WithWorker([&](CudaBackend::Worker* w) -> absl::Status {
      {
        MutexLock lock(&map_mu_);
        if (absl::Status s = LiveOrError(page); !s.ok()) return s;
      }
      const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
      RETURN_IF_GPU_ERROR(
          CudaCheck(cudaMemcpyAsync(k, k_->base() + page * kb, static_cast<size_t>(kb),
                                    cudaMemcpyDeviceToHost, w->stream),
                    "reading a K page"));
      RETURN_IF_GPU_ERROR(
          CudaCheck(cudaMemcpyAsync(v, v_->base() + page * vb, static_cast<size_t>(vb),
                                    cudaMemcpyDeviceToHost, w->stream),
                    "reading a V page"));
      return ToStatus(CudaCheck(cudaStreamSynchronize(w->stream), "reading a page"));
    });
  }

 private:
  friend class CudaBackend;  // PagedAttention checks that a store is its own

  // Runs op(worker) holding a worker; lost() is checked after taking it. A failure is handled
  // as a failed call's (MarkFaulted: a sticky error re-initialises the device).
  template <typename Op>
  absl::Status WithWorker(Op op) const {
    RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(backend_->options_.device), "cudaSetDevice"));
    CudaBackend::Worker* w = backend_->AcquireWorker();
    absl::Cleanup release = [&] { backend_->ReleaseWorker(w); };
    if (lost()) return LostPagesError();
    {
      MutexLock lock(&map_mu_);
      ReleaseDiscardedLocked();
    }
    absl::Status s = op(w);
    if (!s.ok()) {
      cudaStreamSynchronize(w->stream);
      return backend_->MarkFaulted(std::move(s));
    }
    return absl::OkStatus();
  }

  // Gives `page` device memory if it has none: RESOURCE_EXHAUSTED when the device has no more,
  // INTERNAL for any other failure of the driver (a device fault: WithWorker's MarkFaulted).
  absl::Status MakeLiveLocked(int32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_) {
    if (live_[page]) return absl::OkStatus();
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    const int64_t before = MappedBytesLocked();
    GpuStatus st = k_->Acquire(page * kb, kb);
    bool out_of_memory = k_->out_of_memory();
    if (st.ok()) {
      st = v_->Acquire(page * vb, vb);
      out_of_memory = v_->out_of_memory();
      if (!st.ok()) k_->Release(page * kb, kb);
    }
    if (!st.ok()) {
      const std::string what = absl::StrCat(
          "cuda backend: cannot map device memory for session page ", page, ": ", st.error);
      if (out_of_memory) return absl::ResourceExhaustedError(what);
      return absl::InternalError(what);
    }
    live_[page] = true;
    CountMappedSinceLocked(before);
    return absl::OkStatus();
  }
  // Unmaps what the pages discarded since the last operation alone held. REQUIRES: a worker
  // held, the store not lost.
  void ReleaseDiscardedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_) {
    if (discarded_.empty()) return;
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    const int64_t before = MappedBytesLocked();
    for (const int32_t page : discarded_) {
      k_->Release(page * kb, kb);
      v_->Release(page * vb, vb);
    }
    discarded_.clear();
    cudaGetLastError();
    CountMappedSinceLocked(before);
  }
  int64_t MappedBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_) {
    return k_->mapped_bytes() + v_->mapped_bytes();
  }
  // Adds what was mapped (or, negative, unmapped) since MappedBytesLocked() was `before` to the
  // backend's session_pages_bytes_.
  void CountMappedSinceLocked(int64_t before) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_) {
    const int64_t delta = MappedBytesLocked() - before;
    MutexLock lock(&backend_->mu_);
    backend_->session_pages_bytes_ += delta;
  }
  absl::Status LiveOrError(int32_t page) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_) {
    if (live_[page]) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: session page ", page, " holds no memory (never written, or discarded)"));
  }

  CudaBackend* const backend_;
  const uint64_t epoch_;  // the backend's epoch_ when the memory was reserved
  // Held by operations that map or unmap, and by those that need a page mapped meanwhile.
  mutable Mutex map_mu_;
  std::unique_ptr<DeviceAddressRange> k_;
  std::unique_ptr<DeviceAddressRange> v_;
  std::vector<bool> live_ ABSL_GUARDED_BY(map_mu_);  // per page: held by a session
  // Pages discarded since the last operation, still counted in the ranges (Discard).
  mutable std::vector<int32_t> discarded_ ABSL_GUARDED_BY(map_mu_);
};

absl::StatusOr<std::unique_ptr<PageStore>> CudaBackend::NewPageStore(const PageStoreShape& shape) {
  PagedAttentionParams layout;
  layout.num_heads = layout.num_kv_heads = shape.num_kv_heads;
  layout.head_dim = shape.head_dim;
  layout.v_head_dim = shape.v_head_dim;
  layout.page_size = shape.page_size;
  layout.dtype = shape.dtype;
  if (!PagedAttentionSupported(layout)) return NewHostPageStore(shape);  // the reference's
  const int64_t k_bytes = int64_t{shape.capacity} * shape.k_page_bytes();
  const int64_t v_bytes = int64_t{shape.capacity} * shape.v_page_bytes();
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  if (k_bytes + v_bytes > static_cast<int64_t>(total_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: the session pages of a layout (", shape.capacity, " pages, ",
                     k_bytes + v_bytes, " bytes) would not fit in the device's ", total_bytes,
                     " bytes; lower --session_pool_bytes"));
  }
  // Reserved holding a worker, so that no reset falls between reading the epoch and the
  // reservations it covers.
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  const uint64_t epoch = epoch_.load();
  std::unique_ptr<DeviceAddressRange> k, v;
  GpuStatus st = DeviceAddressRange::Reserve(options_.device, k_bytes, &k);
  if (st.ok()) st = DeviceAddressRange::Reserve(options_.device, v_bytes, &v);
  if (!st.ok()) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: cannot reserve device addresses for the session pages of a "
                     "layout (",
                     shape.capacity, " pages, ", k_bytes + v_bytes, " bytes): ", st.error));
  }
  return std::unique_ptr<PageStore>(
      new CudaPageStore(this, shape, epoch, std::move(k), std::move(v)));
}

absl::Status CudaBackend::PagedAttention(const PagedAttentionParams& p) {
  const bool device_pages = p.store != nullptr && p.store->on_device();
  if (device_pages) {
    const auto* store = dynamic_cast<const CudaPageStore*>(p.store);
    if (store == nullptr || store->backend_ != this) {
      return absl::InvalidArgumentError(
          "cuda backend: the pages are in a device store of another backend");
    }
    // NewPageStore makes device stores only for layouts the kernels take; a call whose query
    // heads they do not take (Hq not a multiple of Hkv) must not reach the host reference.
    if (!PagedAttentionSupported(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda backend: paged attention with ", p.num_heads, " query heads over ",
                       p.num_kv_heads, " kv heads is not supported on device pages"));
    }
  } else if (!PagedAttentionSupported(p)) {
    return Backend::PagedAttention(p);  // the reference
  }
  if (p.num_seqs == 0 || p.total_q == 0) return absl::OkStatus();
  RETURN_IF_GPU_ERROR(CudaCheck(cudaSetDevice(options_.device), "cudaSetDevice"));
  Worker* w = AcquireWorker();
  absl::Cleanup release = [&] { ReleaseWorker(w); };
  // Checked while holding a worker: no reset can happen until it is released.
  if (device_pages && p.store->lost()) return LostPagesError();
  absl::Status s = RunPagedAttention(w, p);
  if (!s.ok()) {
    cudaStreamSynchronize(w->stream);
    return MarkFaulted(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunPagedAttention(Worker* w, const PagedAttentionParams& p) {
  const int S = p.num_seqs;
  int max_q = 0, max_kv = 0, max_pages = 1;
  for (int s = 0; s < S; ++s) {
    max_q = std::max(max_q, p.q_lens[s]);
    max_kv = std::max(max_kv, p.kv_lens[s]);
    max_pages = std::max(max_pages, (p.kv_lens[s] + p.page_size - 1) / p.page_size);
  }
  // The page table's rows cut to the pages the sequences use (max_pages). Device pages are
  // read where they are, under the caller's page numbers. Host pages: the pages the batch uses
  // are staged, renumbered 0..used-1 in order of first use (a page shared by forked sequences
  // is staged once), and the page table rewritten to those numbers.
  const bool device_pages = p.store != nullptr && p.store->on_device();
  std::vector<int32_t> used;  // staged page i is pool page used[i]
  std::vector<int32_t> table(size_t(S) * max_pages, 0);
  if (device_pages) {
    for (int s = 0; s < S; ++s) {
      const int pages = (p.kv_lens[s] + p.page_size - 1) / p.page_size;
      std::copy_n(p.page_table + int64_t{s} * p.max_pages_per_seq, pages,
                  table.begin() + size_t(s) * max_pages);
    }
  } else {
    std::unordered_map<int32_t, int32_t> staged;
    for (int s = 0; s < S; ++s) {
      const int pages = (p.kv_lens[s] + p.page_size - 1) / p.page_size;
      for (int i = 0; i < pages; ++i) {
        const int32_t page = p.page_table[int64_t{s} * p.max_pages_per_seq + i];
        auto [it, added] = staged.emplace(page, static_cast<int32_t>(used.size()));
        if (added) used.push_back(page);
        table[size_t(s) * max_pages + i] = it->second;
      }
    }
  }
  const size_t esize = DTypeSize(p.dtype);
  const size_t k_page_bytes = static_cast<size_t>(p.k_page_stride()) * esize;
  const size_t v_page_bytes = static_cast<size_t>(p.v_page_stride()) * esize;
  const size_t q_bytes = size_t(p.total_q) * p.num_heads * p.head_dim * DTypeSize(p.q_dtype);
  const size_t out_bytes = size_t(p.total_q) * p.num_heads * p.v_head_dim * sizeof(float);
  const size_t lse_bytes = size_t(p.total_q) * p.num_heads * sizeof(float);
  const size_t table_bytes = (table.size() + 3 * size_t(S)) * sizeof(int32_t);

  // One layout serves the pinned staging and the device buffer (same offsets); the device one
  // adds the kernel's workspace.
  Layout lay;
  const size_t o_k = lay.Add(used.size() * k_page_bytes);
  const size_t o_v = lay.Add(used.size() * v_page_bytes);
  const size_t o_q = lay.Add(q_bytes);
  const size_t o_tables = lay.Add(table_bytes);
  const size_t o_out = lay.Add(out_bytes);
  const size_t o_lse = lay.Add(p.lse != nullptr ? lse_bytes : 0);
  const size_t staged_bytes = lay.size();
  absl::Status st = ReservePinned(w, staged_bytes);
  if (!st.ok()) return st;
  PagedAttentionParams dp = p;
  dp.max_pages_per_seq = max_pages;
  const size_t o_ws = lay.Add(PagedAttentionWorkspaceBytes(dp, max_kv));
  st = ReserveDevice(w, lay.size());
  if (!st.ok()) return st;

  char* host = w->pinned;
  const char* k_src = static_cast<const char*>(p.k_pages);
  const char* v_src = static_cast<const char*>(p.v_pages);
  for (size_t i = 0; i < used.size(); ++i) {
    std::memcpy(host + o_k + i * k_page_bytes, k_src + used[i] * k_page_bytes, k_page_bytes);
    std::memcpy(host + o_v + i * v_page_bytes, v_src + used[i] * v_page_bytes, v_page_bytes);
  }
  std::memcpy(host + o_q, p.q, q_bytes);
  int32_t* tables = At<int32_t>(host, o_tables);
  std::copy(table.begin(), table.end(), tables);
  std::copy(p.kv_lens, p.kv_lens + S, tables + table.size());
  std::copy(p.q_lens, p.q_lens + S, tables + table.size() + S);
  std::copy(p.q_offsets, p.q_offsets + S, tables + table.size() + 2 * S);

  char* dev = w->device;
  cudaStream_t stream = w->stream;
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(dev, host, o_out, cudaMemcpyHostToDevice, stream),
                                "copying pages"));
  dp.k_pages = device_pages ? p.store->k_base() : dev + o_k;
  dp.v_pages = device_pages ? p.store->v_base() : dev + o_v;
  dp.q = dev + o_q;
  dp.page_table = At<int32_t>(dev, o_tables);
  dp.kv_lens = dp.page_table + table.size();
  dp.q_lens = dp.kv_lens + S;
  dp.q_offsets = dp.q_lens + S;
  dp.out = At<float>(dev, o_out);
  dp.lse = p.lse != nullptr ? At<float>(dev, o_lse) : nullptr;
  RETURN_IF_GPU_ERROR(PagedAttentionForward(dp, max_q, max_kv, dev + o_ws, stream));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(host + o_out, dev + o_out, staged_bytes - o_out,
                                                cudaMemcpyDeviceToHost, stream),
                                "copying the output back"));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "paged attention"));
  std::memcpy(p.out, host + o_out, out_bytes);
  if (p.lse != nullptr) std::memcpy(p.lse, host + o_lse, lse_bytes);
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cuda
