// Device-level entry points of the CUDA attention kernels: they take device pointers in a
// FlashFwdParams, enqueue work on `stream` and return without synchronising. No Abseil here:
// the standalone benchmark (tests/gpu/) links these without the rest of the service.
//
// Error handling: a failure to launch returns a non-ok GpuStatus; errors of the kernels
// themselves surface at the caller's next synchronisation.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_FWD_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_FWD_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/gpu_status.h"

namespace attnserve::kernels::cuda {

// The kernel FlashForward picks for p.
enum class FlashPath { kTensorCore, kGeneric, kUnsupported };
// kTensorCore (flash_fwd_kernel.h) when head_dim and v_head_dim are multiples of 8 in [8, 256]
// and q, k, v are 16-byte aligned with strides that are multiples of 8 elements (o: 8-byte
// aligned, even strides; a mask 4-byte aligned with a column stride of 0 or 1, as
// kernels/mask.h broadcasts), with or without ScoreMods: both are zero-padded to
// TensorCoreHeadDim(p); kGeneric (no tensor
// cores) for the other layouts and head dims with v_head_dim <= 256; else kUnsupported (use
// NaiveAttentionForward).
FlashPath SelectFlashPath(const FlashFwdParams& p);
const char* FlashPathName(FlashPath path);
// The instantiation kTensorCore runs: the smallest of kTensorCoreHeadDims (32, 64, ..., 256)
// that holds max(head_dim, v_head_dim); 0 when head_dim or v_head_dim is not a multiple of 8 in
// [8, 256]. Ignores the layout (SelectFlashPath checks it).
int TensorCoreHeadDim(const FlashFwdParams& p);

// The fused forward (flash_fwd_kernel.h or the generic kernel). REQUIRES a path other than
// kUnsupported.
GpuStatus FlashForward(const FlashFwdParams& p, ComputeType type, cudaStream_t stream);

// Instantiations, one .cu file each (flash_fwd_hdim*.cu, flash_fwd_generic_*.cu); kHeadDim is
// one of kTensorCoreHeadDims. kMods: the instantiation that takes ScoreMods (windows,
// soft-capping, ALiBi; flash_fwd_kernel.h), run for every p that has any.
template <int kHeadDim, ComputeType kType, bool kMods>
GpuStatus RunFlashFwdHdim(const FlashFwdParams& p, cudaStream_t stream);
template <ComputeType kType>
GpuStatus RunFlashFwdGeneric(const FlashFwdParams& p, cudaStream_t stream);

// The decode-shaped path (flash_decode_kernel.h): one query token per sequence, the query heads
// of a GQA group packed into one block's rows, the keys split into chunks of a fixed size and
// merged in order (batch-invariant). DecodeSupported: max_seqlen_q <= 1, num_heads /
// num_kv_heads in {1, 2, 4, 8}, v_head_dim <= 128, head_dim <= 256. `max_seqlen_k` is the
// largest kv_len of the batch (sizes the grid); `workspace` holds FlashDecodeWorkspaceBytes.
// CudaBackend takes it for items with q_len == 1; tested on the host emulation (tests/cuda_emu),
// not yet run on a GPU.
bool DecodeSupported(const FlashFwdParams& p);
size_t FlashDecodeWorkspaceBytes(const FlashFwdParams& p, int max_seqlen_k);
GpuStatus FlashDecode(const FlashFwdParams& p, ComputeType type, int max_seqlen_k, void* workspace,
                      cudaStream_t stream);

// The plain path, with the reference's semantics and materialised weights: per sequence and
// key/value head, S = scale * Q K^T (cuBLAS strided-batched GEMM, 16-bit operands, fp32
// output), a masked softmax kernel writing fp32 weights and 16-bit probabilities P, then
// O = P V (cuBLAS, fp32 output). Used when weights are asked for, for v_head_dim > 256, and as
// the "naive in the same precision" baseline of the tests and benchmarks.
//
// `cu_seqlens_q_host` / `cu_seqlens_k_host` / `key_lengths_host` are host copies of the
// device arrays in p (key_lengths_host may be null). `weights` (device, may be null) receives
// each sequence's [num_heads, q_len, kv_len] fp32 weights, sequences one after another.
// `workspace` holds NaiveAttentionWorkspaceBytes bytes. p.v_mean is not used.
size_t NaiveAttentionWorkspaceBytes(const FlashFwdParams& p, const int* cu_seqlens_q_host,
                                    const int* cu_seqlens_k_host);
GpuStatus NaiveAttentionForward(const FlashFwdParams& p, ComputeType type,
                                const int* cu_seqlens_q_host, const int* cu_seqlens_k_host,
                                const int* key_lengths_host, float* weights, void* workspace,
                                cublasHandle_t blas, cudaStream_t stream);

// Elementwise float32 -> ComputeType (round to nearest even), n elements, contiguous.
GpuStatus ConvertFromFloat(const float* src, void* dst, int64_t n, ComputeType type,
                           cudaStream_t stream);
// v_mean[s, g, c] = mean over the kv_len keys of sequence s of v[t, g, c] (float32 v, strided as
// in FlashFwdParams), summed in key order by one thread per (s, g, c): batch-invariant.
GpuStatus ValueMean(const float* v, int64_t v_row_stride, int64_t v_head_stride,
                    const int* cu_seqlens_k, int num_seqs, int num_kv_heads, int v_head_dim,
                    float* v_mean, cudaStream_t stream);
// y[r, c] += bias[c] for a row-major [rows, cols] y.
GpuStatus AddBias(float* y, const float* bias, int64_t rows, int cols, cudaStream_t stream);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_FWD_H_
