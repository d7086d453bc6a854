#include "server/sessions/kv_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnserve::server::sessions {
namespace {

// Transparent huge pages: the decode kernel reads a sequence's pages scattered through the
// arena, one run of a few KiB per page, so with 4 KiB memory pages nearly every run is a TLB
// miss (a two-level walk in a VM). 2 MiB pages cover the arena with a few hundred TLB entries;
// tests/bench/DECODE.md has the kernel with and without them.
constexpr int64_t kHugePage = int64_t{2} << 20;

// The system's page size: munmap and madvise work in whole pages of it.
int64_t SystemPageBytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

// The range starts on a 2 MiB boundary (so that every whole 2 MiB of it can be a huge page) and
// is advised MADV_HUGEPAGE; the kernel gives small pages where it has no huge ones, and where
// transparent huge pages are off.
uint8_t* Reserve(int64_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t padded = static_cast<size_t>(bytes + kHugePage);
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uint8_t* const begin = static_cast<uint8_t*>(raw);
  const uintptr_t at = reinterpret_cast<uintptr_t>(begin);
  uint8_t* const p = begin + ((kHugePage - at % kHugePage) % kHugePage);
  // The tail is cut at a system page boundary (munmap takes whole pages; ~Arena unmaps `bytes`
  // from p, which the system rounds up the same way).
  const int64_t system_page = SystemPageBytes();
  uint8_t* const keep_end = p + (bytes + system_page - 1) / system_page * system_page;
  uint8_t* const end = begin + padded;
  if (p > begin) munmap(begin, static_cast<size_t>(p - begin));
  if (end > keep_end) munmap(keep_end, static_cast<size_t>(end - keep_end));
  madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return p;
}

// Hands a freed page's memory back to the system when it covers whole system pages. Inside a
// huge page this splits it (the rest stays resident in small pages until the kernel's
// khugepaged merges them again): resident memory follows the accounting first.
void Discard(uint8_t* p, int64_t bytes) {
  if (bytes > 0 && bytes % SystemPageBytes() == 0)
    madvise(p, static_cast<size_t>(bytes), MADV_DONTNEED);
}

}  // namespace

Arena::~Arena() {
  if (k_base_ != nullptr) munmap(k_base_, static_cast<size_t>(capacity_ * k_page_bytes_));
  if (v_base_ != nullptr) munmap(v_base_, static_cast<size_t>(capacity_ * v_page_bytes_));
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(int64_t pool_bytes, int page_tokens,
                                                       int max_layouts) {
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
  return std::unique_ptr<KvPool>(new KvPool(pool_bytes, page_tokens, max_layouts));
}

int64_t KvPool::pages_used() const {
  int64_t n = 0;
  for (const auto& [layout, arena] : arenas_) n += arena->pages_used_;
  return n;
}

int64_t KvPool::pages_total() const {
  int64_t largest =
      PageLayout{8, 128, 128, kernels::DType::kFloat32}.k_page_bytes(page_tokens_) * 2;
  if (!arenas_.empty()) {
    largest = 0;
    for (const auto& [layout, arena] : arenas_) largest = std::max(largest, arena->page_bytes());
  }
  return pool_bytes_ / largest;
}

absl::StatusOr<Arena*> KvPool::Acquire(const PageLayout& layout) {
  auto it = arenas_.find(layout);
  if (it != arenas_.end()) {
    ++it->second->users_;
    return it->second.get();
  }
  const int64_t k_bytes = layout.k_page_bytes(page_tokens_);
  const int64_t v_bytes = layout.v_page_bytes(page_tokens_);
  if (k_bytes + v_bytes > pool_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a page of this layout (", page_tokens_, " tokens: ", k_bytes + v_bytes,
        " bytes) is larger than the session pool (--session_pool_bytes=", pool_bytes_, ")"));
  }
  if (static_cast<int>(arenas_.size()) >= max_layouts_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session pool already holds sessions of ", arenas_.size(),
                     " different head layouts, its limit; close sessions of another layout first"));
  }
  std::unique_ptr<Arena> arena(new Arena());
  arena->layout_ = layout;
  arena->k_page_bytes_ = k_bytes;
  arena->v_page_bytes_ = v_bytes;
  arena->capacity_ =
      static_cast<int32_t>(std::min<int64_t>(pool_bytes_ / (k_bytes + v_bytes), INT32_MAX));
  arena->k_base_ = Reserve(arena->capacity_ * k_bytes);
  arena->v_base_ = Reserve(arena->capacity_ * v_bytes);
  if ((k_bytes > 0 && arena->k_base_ == nullptr) || (v_bytes > 0 && arena->v_base_ == nullptr)) {
    return absl::InternalError(absl::StrCat("cannot reserve ",
                                            arena->capacity_ * (k_bytes + v_bytes),
                                            " bytes of address space for the session pool"));
  }
  arena->users_ = 1;
  Arena* raw = arena.get();
  arenas_.emplace(layout, std::move(arena));
  return raw;
}

void KvPool::Release(Arena* arena) {
  if (--arena->users_ > 0 || arena->pages_used_ > 0) return;
  arenas_.erase(arena->layout_);
}

bool KvPool::Allocate(Arena* arena, int64_t n, std::vector<int32_t>* pages) {
  if (n <= 0) return true;
  if (bytes_used_ + n * arena->page_bytes() > pool_bytes_) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t page;
    if (!arena->free_.empty()) {
      page = arena->free_.back();
      arena->free_.pop_back();
    } else {
      page = arena->next_unused_++;
      arena->refs_.push_back(0);
    }
    arena->refs_[page] = 1;
    pages->push_back(page);
  }
  arena->pages_used_ += n;
  bytes_used_ += n * arena->page_bytes();
  return true;
}

void KvPool::Ref(Arena* arena, int32_t page) { ++arena->refs_[page]; }

void KvPool::Unref(Arena* arena, int32_t page) {
  if (--arena->refs_[page] > 0) return;
  Discard(arena->k_page(page), arena->k_page_bytes_);
  Discard(arena->v_page(page), arena->v_page_bytes_);
  arena->free_.push_back(page);
  --arena->pages_used_;
  bytes_used_ -= arena->page_bytes();
  if (arena->users_ == 0 && arena->pages_used_ == 0) arenas_.erase(arena->layout_);
}

}  // namespace attnserve::server::sessions
