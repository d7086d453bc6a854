#include "server/sessions/kv_pool.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"

namespace attnserve::server::sessions {
absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(int64_t pool_bytes, int page_tokens,
                                                       int max_layouts, StoreFactory new_store) {
  if (pool_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_pool_bytes must be positive; was ", pool_bytes));
  }
  if (page_tokens < 1 || page_tokens > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_page_tokens must be in 1..4096; was ", page_tokens));
  }
  if (max_layouts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_layouts must be positive; was ", max_layouts));
  }
  if (new_store == nullptr) new_store = kernels::NewHostPageStore;
  return std::unique_ptr<KvPool>(
      new KvPool(pool_bytes, page_tokens, max_layouts, std::move(new_store)));
}

int64_t KvPool::pages_used() const {
  int64_t n = 0;
  for (const auto& [layout, arena] : arenas_) n += arena->pages_used_;
  for (const auto& arena : retired_) n += arena->pages_used_;
  return n;
}

int64_t KvPool::pages_total() const {
  int64_t largest = 0;
  for (const auto& [layout, arena] : arenas_) {
    // An idle arena (kept until the idle release) is not a layout in use.
    if (arena->users_ > 0 || arena->pages_used_ > 0) {
      largest = std::max(largest, arena->page_bytes());
    }
  }
  if (largest == 0) {
    largest = PageLayout{8, 128, 128, page_tokens_, kernels::DType::kFloat32}.page_bytes();
  }
  return pool_bytes_ / largest;
}

absl::StatusOr<Arena*> KvPool::Acquire(const PageLayout& layout) {
  auto it = arenas_.find(layout);
  if (it != arenas_.end()) {
    if (!it->second->store_->lost()) {
      ++it->second->users_;
      return it->second.get();
    }
    // Its sessions are being dropped (SessionManager::DropLostLocked); new ones get new memory.
    Arena& lost = *it->second;
    bytes_kept_ -= static_cast<int64_t>(lost.kept_.size()) * lost.page_bytes();
    lost.kept_.clear();  // nothing to keep in a lost store
    if (lost.users_ > 0 || lost.pages_used_ > 0) retired_.push_back(std::move(it->second));
    arenas_.erase(it);
  }
  if (layout.page_size != page_tokens_) {
    return absl::InternalError(absl::StrCat("a layout of ", layout.page_size,
                                            " tokens a page asked of a pool of ", page_tokens_));
  }
  const int64_t k_bytes = layout.k_page_bytes();
  const int64_t v_bytes = layout.v_page_bytes();
  if (k_bytes + v_bytes > pool_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a page of this layout (", page_tokens_, " tokens: ", k_bytes + v_bytes,
        " bytes) is larger than the session pool (--session_pool_bytes=", pool_bytes_, ")"));
  }
  if (static_cast<int>(arenas_.size()) >= max_layouts_) FreeIdleArenas();
  if (static_cast<int>(arenas_.size()) >= max_layouts_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session pool already holds sessions of ", arenas_.size(),
                     " different head layouts, its limit; close sessions of another layout first"));
  }
  std::unique_ptr<Arena> arena(new Arena());
  kernels::PageStoreShape shape;
  static_cast<PageLayout&>(shape) = layout;
  // As many pages as the whole budget would hold, so page indices never move.
  shape.capacity =
      static_cast<int32_t>(std::min<int64_t>(pool_bytes_ / (k_bytes + v_bytes), INT32_MAX));
  auto store = new_store_(shape);
  if (!store.ok()) return store.status();
  arena->store_ = *std::move(store);
  arena->users_ = 1;
  Arena* raw = arena.get();
  arenas_.emplace(layout, std::move(arena));
  return raw;
}

void KvPool::Release(Arena* arena) {
  --arena->users_;
  MaybeFree(arena);
}

std::vector<std::unique_ptr<Arena>>::const_iterator KvPool::FindRetired(const Arena* arena) const {
  return std::find_if(retired_.begin(), retired_.end(),
                      [arena](const auto& r) { return r.get() == arena; });
}

bool KvPool::IsRetired(const Arena* arena) const { return FindRetired(arena) != retired_.end(); }

void KvPool::MaybeFree(Arena* arena) {
  if (arena->users_ > 0 || arena->pages_used_ > 0) return;
  auto it = FindRetired(arena);
  if (it != retired_.end()) retired_.erase(it);  // a live arena stays, idle
}

void KvPool::FreeIdleArenas(const Arena* keep) {
  for (auto it = arenas_.begin(); it != arenas_.end();) {
    const Arena& arena = *it->second;
    if (&arena != keep && arena.users_ == 0 && arena.pages_used_ == 0) {
      bytes_kept_ -= static_cast<int64_t>(arena.kept_.size()) * arena.page_bytes();
      arenas_.erase(it++);
    } else {
      ++it;
    }
  }
}

int64_t KvPool::DiscardKept(const Arena* keep) {
  int64_t bytes = 0;
  for (auto& [layout, arena] : arenas_) {
    if (arena.get() == keep) continue;
    for (const int32_t page : arena->kept_) {
      arena->store_->Discard(page);
      arena->free_.push_back(page);
      std::push_heap(arena->free_.begin(), arena->free_.end(), std::greater<>());
    }
    bytes += static_cast<int64_t>(arena->kept_.size()) * arena->page_bytes();
    arena->kept_.clear();
  }
  bytes_kept_ -= bytes;
  return bytes;
}

int64_t KvPool::ReleaseFreeMemory() {
  const int64_t bytes = DiscardKept(nullptr);
  FreeIdleArenas();
  return bytes;
}

bool KvPool::AnyLost() const {
  for (const auto& [layout, arena] : arenas_) {
    // An idle arena's lost store has no session to lose: its layout's next session retires it.
    if (arena->store_->lost() && (arena->users_ > 0 || arena->pages_used_ > 0)) return true;
  }
  return false;
}

bool KvPool::Allocate(Arena* arena, int64_t n, std::vector<int32_t>* pages) {
  if (n <= 0) return true;
  const int64_t page_bytes = arena->page_bytes();
  if (bytes_used_ + n * page_bytes > pool_bytes_) return false;
  // Pages beyond this arena's kept ones take memory anew: the other arenas' kept pages make
  // room for them first.
  const int64_t more = std::max<int64_t>(0, n - static_cast<int64_t>(arena->kept_.size()));
  if (bytes_used_ + bytes_kept_ + more * page_bytes > pool_bytes_) {
    DiscardKept(arena);
    FreeIdleArenas(arena);
  }
  const auto pop = [](std::vector<int32_t>& heap) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const int32_t page = heap.back();
    heap.pop_back();
    return page;
  };
  for (int64_t i = 0; i < n; ++i) {
    int32_t page;
    if (!arena->kept_.empty()) {
      page = pop(arena->kept_);
      bytes_kept_ -= page_bytes;
    } else if (!arena->free_.empty()) {
      page = pop(arena->free_);
    } else {
      page = arena->next_unused_++;
      arena->refs_.push_back(0);
    }
    arena->refs_[page] = 1;
    pages->push_back(page);
  }
  arena->pages_used_ += n;
  bytes_used_ += n * page_bytes;
  return true;
}

void KvPool::Ref(Arena* arena, int32_t page) { ++arena->refs_[page]; }

void KvPool::Unref(Arena* arena, int32_t page) {
  if (--arena->refs_[page] > 0) return;
  --arena->pages_used_;
  bytes_used_ -= arena->page_bytes();
  if (IsRetired(arena)) {  // its store is lost: nothing to keep
    arena->free_.push_back(page);
    std::push_heap(arena->free_.begin(), arena->free_.end(), std::greater<>());
    MaybeFree(arena);
    return;
  }
  arena->kept_.push_back(page);  // discarded by DiscardKept, unless handed out before
  std::push_heap(arena->kept_.begin(), arena->kept_.end(), std::greater<>());
  bytes_kept_ += arena->page_bytes();
}

}  // namespace attnserve::server::sessions
