// Launch code of the paged attention kernels (paged_attention_kernel.h): float32, float16 and
// bfloat16 caches, up to 128 or 256 output columns; and of the scatter of new rows into the
// pages (paged_scatter_kernel.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_kernel.h"
#include "kernels/cuda/paged_attention_shape.h"
#include "kernels/cuda/paged_scatter_kernel.h"

namespace attnserve::kernels::cuda {
namespace {

template <typename Element, int kOutPerLane>
GpuStatus Launch(const PagedAttentionParams& p, int max_q_len, int max_kv_len, void* workspace,
                 cudaStream_t stream) {
  const int max_splits = PagedSplits(max_kv_len);
  const int row_blocks = PagedRowBlocks(max_q_len, p.num_heads / p.num_kv_heads);
  if (max_splits == 0 || row_blocks == 0 || p.num_seqs == 0) return {};
  const int64_t combine_blocks = int64_t{p.num_seqs} * p.num_kv_heads * row_blocks;
  const int64_t split_blocks = combine_blocks * max_splits;
  if (split_blocks > kMaxGridX) return {"paged attention: more than 2^31 - 1 blocks"};
  float* partial = static_cast<float*>(workspace);
  const int smem = PagedSplitSmemBytes(p.head_dim, p.v_head_dim);
  auto* split_kernel = &PagedAttentionSplitKernel<Element, kOutPerLane>;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      AllowSharedMemory(split_kernel, smem, "paged attention: raising the shared-memory limit"));
  split_kernel<<<static_cast<unsigned>(split_blocks), kPagedWarps * 32, smem, stream>>>(
      p, row_blocks, max_splits, partial);
  ATTNSERVE_GPU_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "paged attention: split launch"));
  PagedAttentionCombineKernel<Element>
      <<<static_cast<unsigned>(combine_blocks), kPagedWarps * 32, 0, stream>>>(
          p, p.window_left, row_blocks, max_splits, partial);
  return CudaCheck(cudaGetLastError(), "paged attention: combine launch");
}

template <typename Element>
GpuStatus LaunchForWidth(const PagedAttentionParams& p, int max_q_len, int max_kv_len,
                         void* workspace, cudaStream_t stream) {
  return PagedOutPerLane(p.v_head_dim) == 4
             ? Launch<Element, 4>(p, max_q_len, max_kv_len, workspace, stream)
             : Launch<Element, 8>(p, max_q_len, max_kv_len, workspace, stream);
}

// Blocks of a scatter: one thread per word, at most kMaxScatterBlocks blocks (the kernel's
// threads stride over the rest; a prefill of many rows needs no more to fill the device).
constexpr int64_t kMaxScatterBlocks = 4096;

template <typename Word>
GpuStatus LaunchScatter(const void* k_rows, const void* v_rows, const int64_t* rows, int64_t n,
                        int head_dim, int v_head_dim, void* k_pages, void* v_pages,
                        cudaStream_t stream) {
  const int64_t words = n * (int64_t{head_dim} + v_head_dim);
  if (words == 0) return {};
  const int64_t blocks =
      std::min(kMaxScatterBlocks, (words + kPagedScatterThreads - 1) / kPagedScatterThreads);
  PagedScatterRowsKernel<Word><<<static_cast<unsigned>(blocks), kPagedScatterThreads, 0, stream>>>(
      static_cast<const Word*>(k_rows), static_cast<const Word*>(v_rows), rows, n, head_dim,
      v_head_dim, static_cast<Word*>(k_pages), static_cast<Word*>(v_pages));
  return CudaCheck(cudaGetLastError(), "paged scatter: launch");
}

}  // namespace

GpuStatus PagedScatterRows(DType dtype, const void* k_rows, const void* v_rows, const int64_t* rows,
                           int64_t n, int head_dim, int v_head_dim, void* k_pages, void* v_pages,
                           cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32:
      return LaunchScatter<uint32_t>(k_rows, v_rows, rows, n, head_dim, v_head_dim, k_pages,
                                     v_pages, stream);
    case DType::kFloat16:
    case DType::kBFloat16:
      return LaunchScatter<uint16_t>(k_rows, v_rows, rows, n, head_dim, v_head_dim, k_pages,
                                     v_pages, stream);
    default:
      return {"paged scatter: the cache dtype must be FLOAT32, FLOAT16 or BFLOAT16"};
  }
}

bool PagedAttentionSupported(const PagedAttentionParams& p) {
  const bool dtype_ok =
      (p.dtype == DType::kFloat32 || p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) &&
      (p.q_dtype == DType::kFloat32 || p.q_dtype == p.dtype);
  return dtype_ok && p.num_kv_heads >= 1 && p.num_heads % p.num_kv_heads == 0 && p.head_dim >= 1 &&
         p.head_dim <= kPagedMaxHeadDim && p.v_head_dim >= 1 && p.v_head_dim <= kPagedMaxVHeadDim &&
         p.page_size >= 1;
}

size_t PagedAttentionWorkspaceBytes(const PagedAttentionParams& p, int max_kv_len) {
  return static_cast<size_t>(PagedWorkspaceBytes(p.total_q, p.num_heads, max_kv_len, p.v_head_dim));
}

GpuStatus PagedAttentionForward(const PagedAttentionParams& p, int max_q_len, int max_kv_len,
                                void* workspace, cudaStream_t stream) {
  if (!PagedAttentionSupported(p)) {
    return {"paged attention: shape not supported (PagedAttentionSupported)"};
  }
  switch (p.dtype) {
    case DType::kFloat16:
      return LaunchForWidth<__half>(p, max_q_len, max_kv_len, workspace, stream);
    case DType::kBFloat16:
      return LaunchForWidth<__nv_bfloat16>(p, max_q_len, max_kv_len, workspace, stream);
    default:
      return LaunchForWidth<float>(p, max_q_len, max_kv_len, workspace, stream);
  }
}

}  // namespace attnserve::kernels::cuda
