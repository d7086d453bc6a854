// The paged KV pool of decode sessions: K and V pages in the layout
// kernels/paged_attention_params.h defines (HND within a page), refcounted so that forks share
// pages copy-on-write.
//
// The pool is a budget of `pool_bytes` shared by every head layout. Pages of one layout (kv
// heads, head dims, cache dtype) live in an arena of their own, whose memory is a
// kernels::PageStore made at the arena's first use by the pool's StoreFactory: the backend's
// (host memory for CPU backends, device memory for CUDA), or host memory by default. A store
// holds as many pages as the whole budget would, so page indices are stable and one
// PagedAttentionParams addresses every page of the layout from two base pointers. Both kinds
// reserve addresses for that capacity and give memory only to the pages written: a host store
// touches pages as they are written and hands discarded ones back (page_store.h); a CUDA store
// maps device memory by the granule as pages are written and unmaps a granule once no page it
// holds lies in it (kernels/cuda/cuda_backend.h), so the memory of all layouts together stays
// within the one budget, up to the granules' rounding.
//
// Freed pages keep their memory ("kept") until ReleaseFreeMemory (the server calls it once it
// has been idle, server/core/idle_release.h), and so does an arena whose last session went: the
// next session reuses them without faulting their memory in again (a page of a freshly mapped
// store costs a fault per huge or small page, zeroed by the kernel, on the batch thread). Kept
// pages are handed out before any other, and the pages in use and the kept ones together never
// exceed the budget: an allocation that would take them over it first discards other arenas'
// kept pages. A kept page handed out again still holds its old bytes until they are
// overwritten: the kernels read no slot past a session's length, so no session sees another's.
//
// Accounting is exact: bytes_used() is the sum over arenas of pages held times the layout's
// page bytes (K and V), and an allocation that would take it over pool_bytes fails.
//
// Thread-compatible: the SessionManager's lock guards every call. Page contents are written
// and read outside that lock by whoever holds the page (see session_manager.h).
#ifndef ATTNSERVE_SERVER_SESSIONS_KV_POOL_H_
#define ATTNSERVE_SERVER_SESSIONS_KV_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/page_layout.h"
#include "kernels/page_store.h"

namespace attnserve::server::sessions {

// What a page holds (kernels/page_layout.h): the arenas are keyed by it, and its page_size is
// always the pool's page_tokens.
using kernels::PageLayout;

// The pages of one layout.
class Arena {
 public:
  const PageLayout& layout() const { return store_->shape(); }
  // The pages' memory (PagedAttentionParams::store, k_pages, v_pages); its shape gives the page
  // size in bytes and the pages it holds.
  kernels::PageStore* store() const { return store_.get(); }
  int64_t k_page_bytes() const { return store_->shape().k_page_bytes(); }
  int64_t v_page_bytes() const { return store_->shape().v_page_bytes(); }
  int64_t page_bytes() const { return k_page_bytes() + v_page_bytes(); }
  // References to `page` (sessions holding it).
  int refs(int32_t page) const { return refs_[page]; }
  int64_t pages_used() const { return pages_used_; }

 private:
  friend class KvPool;
  Arena() = default;

  std::unique_ptr<kernels::PageStore> store_;
  int32_t next_unused_ = 0;  // pages below it have been handed out at least once
  // Freed pages, reused before unused ones, lowest first (min-heaps): the pages in use stay
  // packed at the low end of the store, so a store that maps memory by the granule (CUDA's)
  // keeps few mapped. `kept_` still hold their memory and go first; `free_` were discarded.
  std::vector<int32_t> kept_;
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;  // per page below next_unused_
  int64_t pages_used_ = 0;     // pages with refs > 0
  int64_t users_ = 0;          // sessions of this layout (Acquire - Release)
};

class KvPool {
 public:
  // Makes the memory of an arena (Backend::NewPageStore, or kernels::NewHostPageStore).
  using StoreFactory = std::function<absl::StatusOr<std::unique_ptr<kernels::PageStore>>(
      const kernels::PageStoreShape&)>;

  // INVALID_ARGUMENT naming the value when pool_bytes < 1, page_tokens outside 1..4096 or
  // max_layouts < 1. `new_store` null: host memory.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(int64_t pool_bytes, int page_tokens,
                                                        int max_layouts,
                                                        StoreFactory new_store = nullptr);

  int page_tokens() const { return page_tokens_; }
  int64_t bytes_total() const { return pool_bytes_; }
  int64_t bytes_used() const { return bytes_used_; }
  // Pages held, over every layout.
  int64_t pages_used() const;
  // Pages the pool holds at most: pool_bytes over the page bytes of the largest layout in use
  // (of a float32 page of 8 heads of 128 when none is).
  int64_t pages_total() const;

  // The arena of `layout`, made on first use, counted as used by one more session.
  // RESOURCE_EXHAUSTED when max_layouts other layouts are in use, or a page of this layout is
  // larger than the pool; the store factory's error when it fails (INTERNAL when the address
  // range cannot be reserved, RESOURCE_EXHAUSTED when a device lacks the memory).
  absl::StatusOr<Arena*> Acquire(const PageLayout& layout);
  // One more session uses `arena` (a fork, sharing its parent's pages).
  void AddUser(Arena* arena) { ++arena->users_; }
  // One session fewer uses `arena`. An arena without sessions and pages stays, idle, until
  // ReleaseFreeMemory or until its place is needed for another layout (max_layouts).
  void Release(Arena* arena);
  // Whether the store of an arena lost its pages (PageStore::lost): its sessions must go.
  bool AnyLost() const;

  // Appends `n` fresh pages (one reference each) to `pages`; false (and nothing allocated) when
  // the budget lacks room for them.
  bool Allocate(Arena* arena, int64_t n, std::vector<int32_t>* pages);
  void Ref(Arena* arena, int32_t page);
  // Drops a reference; the page is free when none is left (its memory kept, see above).
  void Unref(Arena* arena, int32_t page);

  // Hands back the memory the pool keeps and no session uses: freed pages are discarded
  // (PageStore::Discard) and idle arenas unmapped. Returns the bytes of the pages discarded
  // (idle arenas' included).
  int64_t ReleaseFreeMemory();
  // Bytes of freed pages still holding their memory (idle arenas' included).
  int64_t bytes_kept() const { return bytes_kept_; }

 private:
  KvPool(int64_t pool_bytes, int page_tokens, int max_layouts, StoreFactory new_store)
      : pool_bytes_(pool_bytes),
        page_tokens_(page_tokens),
        max_layouts_(max_layouts),
        new_store_(std::move(new_store)) {}

  const int64_t pool_bytes_;
  const int page_tokens_;
  const int max_layouts_;
  const StoreFactory new_store_;
  // `arena`'s place in retired_, or retired_.end() when it is live.
  std::vector<std::unique_ptr<Arena>>::const_iterator FindRetired(const Arena* arena) const;
  bool IsRetired(const Arena* arena) const;
  // Frees `arena` when it was retired (its store lost) and no session uses it or its pages.
  void MaybeFree(Arena* arena);
  // Unmaps the live arenas no session uses and no page is held of, but `keep`.
  void FreeIdleArenas(const Arena* keep = nullptr);
  // Discards the kept pages of every arena but `keep` (ReleaseFreeMemory: of all of them).
  int64_t DiscardKept(const Arena* keep);

  int64_t bytes_used_ = 0;
  int64_t bytes_kept_ = 0;  // of kept pages, over the live arenas
  absl::flat_hash_map<PageLayout, std::unique_ptr<Arena>> arenas_;
  // Arenas whose store was lost, replaced in arenas_ by a new one, until their last page goes.
  std::vector<std::unique_ptr<Arena>> retired_;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_KV_POOL_H_
