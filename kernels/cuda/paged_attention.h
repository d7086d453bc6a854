// Device-level entry point of the paged attention kernels (paged_attention_kernel.h): attention
// of the sequences' new queries over their paged KV caches, on device pointers. Like
// flash_fwd.h: enqueues work on `stream` and returns without synchronising; a failure to launch
// returns a non-ok GpuStatus, errors of the kernels surface at the caller's next
// synchronisation. Tested on the host emulation (tests/cuda_emu/paged_attention_emu_test.cc).
#ifndef ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_H_
#define ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gpu_status.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels::cuda {

// Whether the kernels take p: dtype FLOAT32, FLOAT16 or BFLOAT16, 1 <= head_dim <=
// kPagedMaxHeadDim, 1 <= v_head_dim <= kPagedMaxVHeadDim, num_heads % num_kv_heads == 0. Any
// group size and page size.
bool PagedAttentionSupported(const PagedAttentionParams& p);

// Bytes of the workspace PagedAttentionForward needs (partial states of every query row and
// split); `max_kv_len` is the largest kv_lens[s] of the batch.
size_t PagedAttentionWorkspaceBytes(const PagedAttentionParams& p, int max_kv_len);

// Every pointer of p (pages, page table, lengths, offsets, q, out, lse) is a device pointer.
// `max_q_len` / `max_kv_len`: the largest q_lens[s] / kv_lens[s] of the batch (they size the
// grid). REQUIRES PagedAttentionSupported(p) and a valid p (paged_attention_params.h).
GpuStatus PagedAttentionForward(const PagedAttentionParams& p, int max_q_len, int max_kv_len,
                                void* workspace, cudaStream_t stream);

// Writes n rows into the pages of a store (page_store.h's rows; the device store's WriteRows):
// k_rows [n, head_dim] and v_rows [n, v_head_dim] in `dtype` go to rows rows[i] of k_pages and
// v_pages, in one launch (paged_scatter_kernel.h). Every pointer is a device pointer.
// REQUIRES: dtype FLOAT32, FLOAT16 or BFLOAT16; rows[i] distinct and inside the pages.
GpuStatus PagedScatterRows(DType dtype, const void* k_rows, const void* v_rows, const int64_t* rows,
                           int64_t n, int head_dim, int v_head_dim, void* k_pages, void* v_pages,
                           cudaStream_t stream);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_H_
