// Internals of the CUDA backend shared by its files (cuda_backend.cc: device, workers, faults
// and staging; cuda_attention.cc: dense attention; cuda_multi_head.cc: multi-head and module
// projections; cuda_page_store.cc: session pages on the device; cuda_paged_attention.cc:
// attention over them). Not for use outside kernels/cuda/.
#ifndef ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_INTERNAL_H_
#define ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_INTERNAL_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/gpu_status.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/page_store.h"

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

// cuBLASLt's scratch in a worker's device buffer.
inline constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

inline absl::Status ToStatus(const GpuStatus& s) {
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
inline int64_t MaskExtent(const MaskView& m, int64_t b, int64_t h, int64_t lq, int64_t lk) {
  return (b - 1) * m.batch_stride + (h - 1) * m.head_stride + (lq - 1) * m.row_stride +
         (lk - 1) * m.col_stride + 1;
}

inline bool MayHaveBlockedRows(bool mask, const int32_t* key_lengths, bool causal, int lq, int lk,
                               bool windowed) {
  return mask || key_lengths != nullptr || (causal && lq > lk) || windowed;
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
inline FlashFwdParams FlashParamsFor(const AttentionParams& a, int num_seqs, int max_seqlen_q,
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
  fp.window = {a.mods.window_left, a.mods.window_right};
  fp.softcap = a.mods.softcap;  // alibi_slopes: a device copy, set by the caller
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

// FLOAT16 and BFLOAT16 requests compute in their own type (their float32 copies convert back
// exactly); FLOAT32 ones in the configured operand type.
inline ComputeType OperandType(DType input, ComputeType float32_compute) {
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
inline absl::Status ByOperandType(absl::Span<const Params> batch, ComputeType float32_compute,
                                  Run run) {
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

// What the linear-attention kernel takes (linear_attention.h), for Attend's and MultiHead's
// items: no mask, score modifications or weights (INVALID_ARGUMENT: the server never sends
// them), head dims up to kLinearMaxHeadDim (UNIMPLEMENTED naming it).
inline absl::Status CheckLinearAttention(bool mask, bool mods, bool weights, int head_dim) {
  if (mask || mods || weights) {
    return absl::InvalidArgumentError(
        "cuda backend: linear attention takes no mask, score modifications or weights");
  }
  if (head_dim > kLinearMaxHeadDim) {
    return absl::UnimplementedError(absl::StrCat("cuda backend: linear attention at head_dim ",
                                                 head_dim, " (at most ", kLinearMaxHeadDim, ")"));
  }
  return absl::OkStatus();
}

inline absl::Status LostPagesError() {
  return absl::FailedPreconditionError(
      "cuda backend: the session pages of this store were lost: the device was re-initialised "
      "after a fault");
}

// Whether `store` is a device store that `backend` made (cuda_page_store.cc).
bool IsDeviceStoreOf(const PageStore& store, const CudaBackend* backend);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_CUDA_BACKEND_INTERNAL_H_
