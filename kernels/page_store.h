// Where the pages of a paged KV cache live (decode sessions): the memory behind
// PagedAttentionParams::k_pages and v_pages, made by the backend that computes on it
// (Backend::NewPageStore). The reference and CPU backends keep pages in host memory; the CUDA
// backend keeps them in device memory, so that a decode step moves its new tokens' K and V to
// the device and never the cache.
//
// A store holds `capacity` pages of one PageLayout (page_layout.h: HND within a page). Its unit
// of writing is a row: one token's K (head_dim elements) or V (v_head_dim elements) of one kv
// head, at PageLayout::row.
//
// Thread-safety: thread-safe for calls that touch disjoint pages (the session manager writes
// only pages its extend holds alone); PagedAttention may read other pages meanwhile.
#ifndef ATTNSERVE_KERNELS_PAGE_STORE_H_
#define ATTNSERVE_KERNELS_PAGE_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/page_layout.h"

namespace attnserve::kernels {

// A store's pages (their layout, page_layout.h) and how many it holds.
struct PageStoreShape : PageLayout {
  int32_t capacity = 0;  // pages
};

class PageStore {
 public:
  virtual ~PageStore() = default;

  const PageStoreShape& shape() const { return shape_; }
  // Whether k_base() and v_base() are device addresses (only the backend that made the store
  // can compute on them).
  virtual bool on_device() const = 0;
  // Base pointers of the K and V pages (PagedAttentionParams::k_pages, v_pages).
  virtual void* k_base() const = 0;
  virtual void* v_base() const = 0;
  // Whether the pages' contents are gone (the CUDA backend re-initialised its device after a
  // fault): every later call fails, and the sessions on it must be prefilled again.
  virtual bool lost() const { return false; }

  // Writes rows.size() rows: k_rows [n, head_dim] and v_rows [n, v_head_dim], host memory in the
  // store's dtype, to rows rows[i] of the pages. REQUIRES: every row < capacity * num_kv_heads *
  // page_size, no row twice. Non-OK only for failures of the device (or lost()).
  virtual absl::Status WriteRows(const void* k_rows, const void* v_rows,
                                 absl::Span<const int64_t> rows) = 0;
  // Copies page `from` (K and V) over page `to`.
  virtual absl::Status CopyPage(int32_t from, int32_t to) = 0;
  // Copies page `page` to host memory: k_page_bytes() to k, v_page_bytes() to v (snapshots,
  // session moves, tests).
  virtual absl::Status ReadPage(int32_t page, void* k, void* v) const = 0;
  // Writes a whole page from host memory laid out as ReadPage gives it. The default writes its
  // rows (WriteRows); a store may do better.
  virtual absl::Status WritePage(int32_t page, const void* k, const void* v);
  // No session holds `page` any longer: the store may hand its memory back.
  virtual void Discard(int32_t page) { (void)page; }

 protected:
  explicit PageStore(const PageStoreShape& shape) : shape_(shape) {}

 private:
  const PageStoreShape shape_;
};

// Host memory: address ranges reserved with mmap for the whole capacity, touched as pages are
// written, 2 MiB-aligned and advised for transparent huge pages (the decode kernel's reads are
// scattered over the store: fewer TLB misses; tests/bench/DECODE.md). A discarded page is handed
// back to the system (madvise) when its size is a multiple of the system page, so resident
// memory follows the pages the pool holds (server/sessions/kv_pool.h). INTERNAL when the address
// range cannot be reserved.
absl::StatusOr<std::unique_ptr<PageStore>> NewHostPageStore(const PageStoreShape& shape);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_PAGE_STORE_H_
