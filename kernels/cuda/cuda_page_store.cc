// CudaPageStore: session pages in device memory (cuda_backend.h, "Session pages"), and
// CudaBackend::NewPageStore.
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
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::cuda {

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
  // PagedAttention checks that a store is its own.
  friend bool IsDeviceStoreOf(const PageStore& store, const CudaBackend* backend);

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

bool IsDeviceStoreOf(const PageStore& store, const CudaBackend* backend) {
  const auto* s = dynamic_cast<const CudaPageStore*>(&store);
  return s != nullptr && s->backend_ == backend;
}

}  // namespace attnserve::kernels::cuda
