// The CUDA backend: kernels::Backend on one NVIDIA GPU (sm_80 or newer).
//
// A call copies each item's host inputs, in their input_dtype, into pinned staging, then to the
// device (the copy of one tensor overlaps the packing of the next); float32 inputs are converted
// there to the 16-bit operand type (16-bit inputs are already in theirs); it runs the fused
// attention kernel (flash_fwd.h) and copies float32 outputs back.
// Consecutive items that share heads, head dims, causality and scale and have no mask and no
// weights are packed into one variable-length launch (cumulative sequence offsets); each
// (sequence, head, query block) is computed by one thread block over all of its keys in a fixed
// order, so an item's bits never depend on its batch companions (backend.h). Items asking for
// weights take the cuBLAS path that materialises them (NaiveAttentionForward). Decode steps
// (q_len == 1) are packed only with each other and, where DecodeSupported, take the decode path
// (flash_decode_kernel.h: GQA heads packed, keys split in chunks of a fixed size).
//
// Precision (PrecisionPolicy() returns this as one line, for GetServerInfo):
//   attention  q, k, v rounded to the operand type (bfloat16 by default for FLOAT32 requests,
//              see CudaBackendOptions::float32_compute; FLOAT16 and BFLOAT16 requests in their
//              own type, exactly), products accumulated in float32,
//              softmax in float32, probabilities rounded to the operand type before P.V,
//              output float32. Expected error against the float64 reference: relative
//              Frobenius error about 2^-9 (bf16) or 2^-12 (fp16) times a small factor; the
//              tests bound it by 2 x the error of a plain cuBLAS attention in the same
//              operand type, + 1e-5.
//   projections TF32 tensor cores (10-bit mantissa operands), float32 accumulation and bias.
//   sessions   (PagedAttention) the queries as the server passes them (float32, or the cache
//              dtype when the request sent them in it), keys and values in the cache dtype,
//              scores and softmax in float32.
//
// Session pages (decode sessions, kernels/page_store.h): NewPageStore gives each head layout the
// paged kernels take a CudaPageStore: device addresses for its whole capacity (capacity x page
// bytes, the --session_pool_bytes budget) reserved at its creation, and device memory mapped
// only under the pages in use (device_pages.h: a page gets memory when first written, and a
// granule, 2 MiB on current GPUs, is unmapped at the store's next operation once every page in
// it was discarded). So the layouts in use share the one budget on the device too, each
// rounded up to its granules; the memory is outside device_pool_bytes. A decode step then copies
// only its new tokens' K and V to the device (WriteRows: one copy, one scatter kernel) and its
// queries; PagedAttention reads the pages where they are. Layouts the kernels do not take
// (head dims above 256) keep host pages, which the reference computes on. The mapped bytes
// are reported in MemoryFigures().session_pages_bytes and, added to the workers' buffers, in
// device_memory()'s pool_bytes. A device reset (below) frees them: the stores made before it
// are lost() (their calls fail with FAILED_PRECONDITION; the sessions on them must prefill
// again).
//
// Errors: a CUDA or cuBLAS failure fails the call with INTERNAL naming the step (the process
// never aborts); after a device fault that breaks the CUDA context (an illegal address, ...)
// the backend re-initialises the device before its next call instead of failing every later
// one; a call needing more device memory than the pool allows, or more pinned staging
// than allowed, fails with RESOURCE_EXHAUSTED.
//
// Thread-safety: thread-safe. Each call takes one of num_streams workers (stream, cuBLAS
// handles, workspace, staging) for its duration, waiting while all are busy.
#ifndef ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "kernels/backend.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/page_store.h"

namespace attnserve::kernels::cuda {

// Number of CUDA devices; 0 when there is no driver or no device (never fails).
int CudaDeviceCount();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for each device; empty when none.
std::vector<std::string> CudaDeviceNames();

struct CudaBackendOptions {
  // Affects results.
  // The operand type of FLOAT32 requests (FLOAT16 and BFLOAT16 requests compute in their own
  // type: AttentionParams::input_dtype).
  // bfloat16 keeps float32's range (no overflow on any finite input) at 8 bits of mantissa;
  // float16 has 11 bits but overflows above 65504. Default: kBFloat16.
  ComputeType float32_compute = ComputeType::kBFloat16;

  // Affects performance.
  // The device to compute on. Default: 0. REQUIRES: 0 <= device < CudaDeviceCount().
  int device = 0;
  // Workers: concurrent calls, each with its own stream, cuBLAS handles and buffers.
  // Default: 2. REQUIRES: 1 <= num_streams <= 64.
  int num_streams = 2;
  // Bound on device memory held by all workers' buffers together (grown on demand, kept).
  // Default: 8 GiB. REQUIRES: >= 64 MiB.
  int64_t device_pool_bytes = int64_t{8} << 30;
  // Bound on pinned host staging per worker (grown on demand, kept). Default: 1 GiB.
  // REQUIRES: >= 1 MiB.
  int64_t pinned_staging_bytes_per_stream = int64_t{1} << 30;
};

// Device memory figures for metrics (bytes).
struct CudaMemoryFigures {
  int64_t device_used_bytes = 0;  // used on the device, by every process (cudaMemGetInfo)
  int64_t device_total_bytes = 0;
  int64_t pool_held_bytes = 0;      // held by this backend's workers
  int64_t pinned_held_bytes = 0;    // pinned host staging held by this backend
  int64_t session_pages_bytes = 0;  // device memory of the live page stores (NewPageStore)
};

class CudaBackend final : public Backend {
 public:
  // UNAVAILABLE when no device is present (message says why: no driver, no device), so that
  // --backend=auto can fall back to the CPU; INVALID_ARGUMENT for bad options (naming the
  // field and value); INTERNAL when creating streams or handles fails.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  // See Backend.
  std::string name() const override { return "cuda"; }
  // Linear attention: its own kernel (linear_attention.h), in float32, head dims up to 256.
  bool supports_linear_attention() const override { return true; }
  // The paged kernels take a session's sliding window, soft-cap and ALiBi slopes.
  bool supports_session_score_mods() const override { return true; }
  std::vector<DeviceInfo> devices() const override;
  // pool_bytes: the workers' buffers plus the session pages (CudaMemoryFigures).
  std::vector<DeviceMemory> device_memory() const override;
  std::string float32_precision() const override { return PrecisionPolicy(); }
  absl::Status Attend(absl::Span<const AttentionParams> batch) override;
  absl::Status MultiHead(absl::Span<const MultiHeadParams> batch) override;
  // On the device, as MultiHead's projections (TF32 tensor cores, float32 accumulation and
  // bias): the inputs staged in float32, one GEMM per item, y copied back.
  absl::Status Project(absl::Span<const ProjectionParams> batch) override;
  // Pages in a store of this backend's (p.store->on_device()): the call stages only the
  // queries, the page table and the lengths, and the paged kernel (paged_attention.h) reads the
  // pages in device memory; FAILED_PRECONDITION when the store is lost(). Pages in host memory
  // (Backend's contract): the call stages what the batch needs to the device (the pages its
  // sequences use, gathered and renumbered, their page-table rows, the queries) and runs the
  // same kernel on them. Shapes the kernel does not take (head_dim or v_head_dim above 256; never
  // in a device store) go to the reference. FLOAT16 and BFLOAT16 caches compute in float32 from
  // their own values, FLOAT32 caches in float32 (no rounding to a 16-bit operand type).
  // RESOURCE_EXHAUSTED when the staged data exceed the pinned staging or the device pool.
  absl::Status PagedAttention(const PagedAttentionParams& p) override;
  // Device memory (a CudaPageStore, header comment) when PagedAttentionSupported takes the
  // layout, else host memory (NewHostPageStore). RESOURCE_EXHAUSTED naming the bytes when the
  // device lacks them. REQUIRES: the store is destroyed before this backend.
  absl::StatusOr<std::unique_ptr<PageStore>> NewPageStore(const PageStoreShape& shape) override;

  // Attend and MultiHead with one operand type for every item: Attend and MultiHead cut a batch
  // into runs of one input_dtype and call these with its type (benchmarks call them directly).
  absl::Status AttendAs(absl::Span<const AttentionParams> batch, ComputeType type);
  absl::Status MultiHeadAs(absl::Span<const MultiHeadParams> batch, ComputeType type);

  // The precision policy in one line (see the header comment).
  std::string PrecisionPolicy() const;
  CudaMemoryFigures MemoryFigures() const;

  struct Worker;  // cuda_backend.cc

 private:
  friend class CudaPageStore;  // cuda_backend.cc: takes workers, staging and the epoch
  CudaBackend(const CudaBackendOptions& options, std::string device_name, int64_t total_bytes);
  // Takes an idle worker. After a device fault (MarkFaulted) it first waits for every worker to
  // be idle and re-initialises the device (cudaDeviceReset, new streams and handles).
  Worker* AcquireWorker();
  void ReleaseWorker(Worker* w);
  // Called on a failed call with w's stream drained: if the CUDA context is broken (a "sticky"
  // error such as an illegal address), every later call would fail, so the next AcquireWorker
  // re-initialises the device. Returns `s`, its message saying so when that is the case.
  // cudaDeviceReset resets the device for the whole process: one CudaBackend per device per
  // process (the server's case) is assumed.
  // Runs `run` on a worker: the device set, a worker taken and given back. When `run` fails,
  // its stream is drained and the failure goes through MarkFaulted.
  absl::Status OnWorker(absl::FunctionRef<absl::Status(Worker* w)> run);
  absl::Status MarkFaulted(absl::Status s);
  void ResetDeviceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grow `w`'s device buffer / pinned staging to at least `bytes`, within the bounds.
  absl::Status ReserveDevice(Worker* w, size_t bytes);
  absl::Status ReservePinned(Worker* w, size_t bytes);
  // One launch group of compatible Attend items (see the header comment).
  absl::Status RunAttentionGroup(Worker* w, absl::Span<const AttentionParams> items,
                                 ComputeType type);
  // One linear-attention item (AttentionKind::kLinear): staged in float32, one launch.
  absl::Status RunLinearAttention(Worker* w, const AttentionParams& p);
  absl::Status RunMultiHead(Worker* w, const MultiHeadParams& p, ComputeType type);
  absl::Status RunProjection(Worker* w, const ProjectionParams& p);
  absl::Status RunPagedAttention(Worker* w, const PagedAttentionParams& p);

  const CudaBackendOptions options_;
  const std::string device_name_;
  const int64_t device_total_bytes_;
  std::vector<std::unique_ptr<Worker>> workers_;  // fixed after Create

  mutable Mutex mu_;
  std::vector<Worker*> idle_ ABSL_GUARDED_BY(mu_);
  CondVar idle_changed_;  // idle_ gained a worker
  int64_t pool_held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pinned_held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool needs_reset_ ABSL_GUARDED_BY(mu_) = false;
  int64_t session_pages_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Device resets so far (ResetDeviceLocked): a page store made in an earlier epoch lost its
  // memory. Changes only while every worker is idle, so a caller holding a worker reads a value
  // that holds until it releases it.
  std::atomic<uint64_t> epoch_{0};
};

// The launch groups CudaBackend::AttendAs forms from `batch`, as [begin, end) index pairs:
// maximal runs of consecutive items that can share a launch (same heads, head dims, causality
// and scale, no mask, no weights, q_len == 1 or not) and whose pinned staging fits
// `pinned_limit` bytes together, so that a large batch is computed in several launches instead
// of failing whole. An item whose own staging exceeds the limit forms a group alone (and fails
// with RESOURCE_EXHAUSTED). Every item's bits are the same in any grouping (batch invariance).
std::vector<std::pair<size_t, size_t>> PlanAttentionGroups(absl::Span<const AttentionParams> batch,
                                                           int64_t pinned_limit);

// The factory the server calls (--backend=cuda|auto): CudaBackend::Create as a Backend.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
