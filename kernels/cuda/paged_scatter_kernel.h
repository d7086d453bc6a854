// The scatter of new K and V rows into the pages of a device page store (CudaBackend's
// PageStore::WriteRows; vLLM's reshape_and_cache with a slot mapping): row i of the packed
// input goes to row rows[i] of the pages (page_store.h: row r starts at element r * head_dim of
// the K pages and r * v_head_dim of the V pages). Launched by PagedScatterRows
// (paged_attention.h); tested on the host emulation (tests/cuda_emu/paged_attention_emu_test.cc).
#ifndef ATTNSERVE_KERNELS_CUDA_PAGED_SCATTER_KERNEL_H_
#define ATTNSERVE_KERNELS_CUDA_PAGED_SCATTER_KERNEL_H_

#include <cstdint>

#include "kernels/cuda/device_utils.h"

namespace attnserve::kernels::cuda {

inline constexpr int kPagedScatterThreads = 256;

// `Word` is the cache element's width (uint16_t for 16-bit caches, uint32_t for float32): every
// row starts on an element boundary, whatever head_dim is. The grid's threads stride over the
// n * k_words words of the K rows, then the n * v_words of the V rows (one launch for both;
// consecutive threads write consecutive words of a row). REQUIRES: rows[i] distinct and inside
// the pages (the caller's contract).
template <typename Word>
__global__ void __launch_bounds__(kPagedScatterThreads)
    PagedScatterRowsKernel(const Word* __restrict__ k_rows, const Word* __restrict__ v_rows,
                           const int64_t* __restrict__ rows, int64_t n, int k_words, int v_words,
                           Word* __restrict__ k_pages, Word* __restrict__ v_pages) {
  const int64_t k_total = n * k_words;
  const int64_t total = k_total + n * v_words;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < total; t += stride) {
    if (t < k_total) {
      const int64_t i = t / k_words, c = t % k_words;
      k_pages[rows[i] * k_words + c] = k_rows[t];
    } else {
      const int64_t u = t - k_total;
      const int64_t i = u / v_words, c = u % v_words;
      v_pages[rows[i] * v_words + c] = v_rows[u];
    }
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_PAGED_SCATTER_KERNEL_H_
