// The geometry of a paged KV cache's pages, defined once: what a page holds and where each
// token's key and value rows sit in it. The session pool keys its arenas by it
// (server/sessions/kv_pool.h), a page store is sized by it (PageStoreShape, page_store.h) and
// the kernels address pages through it (PagedAttentionParams, paged_attention_params.h).
//
// A page holds `page_size` tokens of `num_kv_heads` heads in `dtype`, K rows of `head_dim` and
// V rows of `v_head_dim` elements, in two arrays of pages, "HND" within a page:
//
//   k_pages[page][kv_head][slot][0..head_dim)       k_page_elements = num_kv_heads * page_size * D
//   v_pages[page][kv_head][slot][0..v_head_dim)     v_page_elements = num_kv_heads * page_size * Dv
//
// (one kv head's `page_size` keys are contiguous, so a decode kernel streams them with unit
// stride and the query heads of a GQA group read them once). Row r = (page * num_kv_heads +
// kv_head) * page_size + slot starts at element r * head_dim of the K pages and r * v_head_dim
// of the V pages.
#ifndef ATTNSERVE_KERNELS_PAGE_LAYOUT_H_
#define ATTNSERVE_KERNELS_PAGE_LAYOUT_H_

#include <cstdint>
#include <utility>

#include "kernels/dtype.h"

// The offsets are used by the CUDA kernels on the device too.
#if defined(__CUDACC__)
#define ATTNSERVE_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define ATTNSERVE_LAYOUT_HD inline
#endif

namespace attnserve::kernels {

struct PageLayout {
  int num_kv_heads = 0;
  int head_dim = 0;    // D, of K
  int v_head_dim = 0;  // Dv, of V
  int page_size = 0;   // tokens per page
  DType dtype = DType::kFloat32;

  // Elements of one page of K (of V): also the page stride in elements.
  ATTNSERVE_LAYOUT_HD int64_t k_page_stride() const {
    return int64_t{num_kv_heads} * page_size * head_dim;
  }
  ATTNSERVE_LAYOUT_HD int64_t v_page_stride() const {
    return int64_t{num_kv_heads} * page_size * v_head_dim;
  }
  // The row of (page, kv_head, slot) (see above).
  ATTNSERVE_LAYOUT_HD int64_t row(int32_t page, int kv_head, int slot) const {
    return int64_t{page} * num_kv_heads * page_size + int64_t{kv_head} * page_size + slot;
  }
  // Element offset of (page, kv head, slot) in k_pages / v_pages.
  ATTNSERVE_LAYOUT_HD int64_t k_offset(int32_t page, int kv_head, int slot) const {
    return row(page, kv_head, slot) * head_dim;
  }
  ATTNSERVE_LAYOUT_HD int64_t v_offset(int32_t page, int kv_head, int slot) const {
    return row(page, kv_head, slot) * v_head_dim;
  }

  int64_t k_page_bytes() const { return k_page_stride() * static_cast<int64_t>(DTypeSize(dtype)); }
  int64_t v_page_bytes() const { return v_page_stride() * static_cast<int64_t>(DTypeSize(dtype)); }
  int64_t page_bytes() const { return k_page_bytes() + v_page_bytes(); }

  // The geometry alone (a page store's capacity is not compared).
  const PageLayout& layout() const { return *this; }
  bool operator==(const PageLayout& o) const {
    return num_kv_heads == o.num_kv_heads && head_dim == o.head_dim && v_head_dim == o.v_head_dim &&
           page_size == o.page_size && dtype == o.dtype;
  }
  bool operator!=(const PageLayout& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const PageLayout& l) {
    return H::combine(std::move(h), l.num_kv_heads, l.head_dim, l.v_head_dim, l.page_size, l.dtype);
  }
};

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_PAGE_LAYOUT_H_
