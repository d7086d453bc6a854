// KvPool (server/sessions/kv_pool.h): the arenas' address ranges, page reuse and exact
// accounting.
#include "server/sessions/kv_pool.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/paged_attention_params.h"
#include "tests/testing/losable_store.h"

namespace attnserve::server::sessions {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

// A page of 16 tokens of 8 kv heads of 128 float16: 32 KiB of K and 32 KiB of V.
const PageLayout kLayout{8, 128, 128, 16, kernels::DType::kFloat16};

TEST(KvPoolTest, ArenaRangesStartOnHugePageBoundaries) {
  auto pool = KvPool::Create(int64_t{256} << 20, 16, 4);
  ASSERT_TRUE(pool.ok()) << pool.status();
  // Two layouts, so that the second arena's ranges are reserved after others exist.
  for (const PageLayout& layout : {kLayout, PageLayout{2, 64, 32, 16, kernels::DType::kFloat32}}) {
    auto arena = (*pool)->Acquire(layout);
    ASSERT_TRUE(arena.ok()) << arena.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->store()->k_base()) % kHugePage, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->store()->v_base()) % kHugePage, 0u);
  }
}

// An arena's layout is the pool's page size and nothing else: a layout of another page size is
// a caller's bug, refused rather than given pages of the wrong size.
TEST(KvPoolTest, RefusesALayoutOfAnotherPageSize) {
  auto pool = KvPool::Create(int64_t{64} << 20, 16, 4);
  ASSERT_TRUE(pool.ok()) << pool.status();
  PageLayout other = kLayout;
  other.page_size = 32;
  EXPECT_EQ((*pool)->Acquire(other).status().code(), absl::StatusCode::kInternal);
  auto arena = (*pool)->Acquire(kLayout);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ((*arena)->layout(), kLayout);
  EXPECT_EQ((*arena)->page_bytes(), int64_t{2} * 8 * 16 * 128 * 2);
}

// The bytes of a page of a host store.
uint8_t* KPage(const Arena* arena, int32_t page) {
  return static_cast<uint8_t*>(arena->store()->k_base()) + page * arena->k_page_bytes();
}
uint8_t* VPage(const Arena* arena, int32_t page) {
  return static_cast<uint8_t*>(arena->store()->v_base()) + page * arena->v_page_bytes();
}

TEST(KvPoolTest, PagesAreWritableAcrossTheRangeAndKeptUntilReleased) {
  const int64_t page_bytes = kLayout.page_bytes();
  const int64_t pages = 100;
  auto pool = KvPool::Create(pages * page_bytes, 16, 1);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto arena = (*pool)->Acquire(kLayout);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<int32_t> held;
  ASSERT_TRUE((*pool)->Allocate(*arena, pages, &held));
  EXPECT_FALSE((*pool)->Allocate(*arena, 1, &held));  // the budget is exact
  EXPECT_EQ((*pool)->bytes_used(), pages * page_bytes);
  // Every byte of the last page (the end of both ranges) can be written and read back.
  const int32_t last = held.back();
  std::memset(KPage(*arena, last), 0x5a, static_cast<size_t>((*arena)->k_page_bytes()));
  std::memset(VPage(*arena, last), 0xa5, static_cast<size_t>((*arena)->v_page_bytes()));
  EXPECT_EQ(KPage(*arena, last)[(*arena)->k_page_bytes() - 1], 0x5a);
  EXPECT_EQ(VPage(*arena, last)[(*arena)->v_page_bytes() - 1], 0xa5);
  // Freed and handed out again before the pool released anything: the page kept its memory,
  // bytes and all (nothing faulted in again).
  (*pool)->Unref(*arena, last);
  EXPECT_EQ((*pool)->bytes_used(), (pages - 1) * page_bytes);
  EXPECT_EQ((*pool)->bytes_kept(), page_bytes);
  std::vector<int32_t> again;
  ASSERT_TRUE((*pool)->Allocate(*arena, 1, &again));
  EXPECT_EQ(again[0], last);
  EXPECT_EQ((*pool)->bytes_kept(), 0);
  EXPECT_EQ(KPage(*arena, last)[0], 0x5a);
  // Freed and released: the memory was given back to the system (32 KiB is a whole number of
  // system pages), so the page reads as zeros when handed out again.
  (*pool)->Unref(*arena, last);
  EXPECT_EQ((*pool)->ReleaseFreeMemory(), page_bytes);
  EXPECT_EQ((*pool)->bytes_kept(), 0);
  EXPECT_EQ((*pool)->ReleaseFreeMemory(), 0);  // nothing kept twice
  again.clear();
  ASSERT_TRUE((*pool)->Allocate(*arena, 1, &again));
  EXPECT_EQ(again[0], last);
  EXPECT_EQ(KPage(*arena, last)[0], 0);
  EXPECT_EQ(VPage(*arena, last)[(*arena)->v_page_bytes() - 1], 0);
  held.back() = again[0];  // the same page, one reference
  for (int32_t page : held) (*pool)->Unref(*arena, page);
  EXPECT_EQ((*pool)->bytes_used(), 0);
  (*pool)->Release(*arena);
}

// Freed pages are handed out again lowest first, before unused ones, so the pages in use stay
// packed at the start of the store (a CUDA store maps device memory by the 2 MiB granule).
TEST(KvPoolTest, FreedPagesAreReusedLowestFirst) {
  const int64_t page_bytes = kLayout.page_bytes();
  auto pool = KvPool::Create(20 * page_bytes, 16, 1);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto arena = (*pool)->Acquire(kLayout);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<int32_t> held;
  ASSERT_TRUE((*pool)->Allocate(*arena, 10, &held));
  EXPECT_EQ(held, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  for (const int32_t page : {7, 2, 9, 4}) (*pool)->Unref(*arena, page);
  std::vector<int32_t> again;
  ASSERT_TRUE((*pool)->Allocate(*arena, 3, &again));
  EXPECT_EQ(again, (std::vector<int32_t>{2, 4, 7}));
  (*pool)->Unref(*arena, 3);
  ASSERT_TRUE((*pool)->Allocate(*arena, 3, &again));
  EXPECT_EQ(again, (std::vector<int32_t>{2, 4, 7, 3, 9, 10}));
  for (const int32_t page : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) (*pool)->Unref(*arena, page);
  EXPECT_EQ((*pool)->bytes_used(), 0);
  (*pool)->Release(*arena);
}

// An arena whose last session went stays, with its memory, for the layout's next session (no
// new store, no page faulted in again) until the pool releases its free memory or another
// layout needs its place.
TEST(KvPoolTest, AnIdleArenaIsKeptUntilReleasedOrItsPlaceIsNeeded) {
  int stores = 0;
  auto pool = KvPool::Create(int64_t{64} << 20, 16, 1, [&](const kernels::PageStoreShape& shape) {
    ++stores;
    return kernels::NewHostPageStore(shape);
  });
  ASSERT_TRUE(pool.ok()) << pool.status();
  Arena* arena = (*pool)->Acquire(kLayout).value();
  std::vector<int32_t> held;
  ASSERT_TRUE((*pool)->Allocate(arena, 4, &held));
  for (const int32_t page : held) (*pool)->Unref(arena, page);
  const int64_t in_use_total = (*pool)->pages_total();
  (*pool)->Release(arena);
  EXPECT_EQ((*pool)->bytes_used(), 0);
  EXPECT_EQ((*pool)->bytes_kept(), 4 * kLayout.page_bytes());
  // An idle arena's layout no longer sizes the pool's capacity: the default layout's does
  // (a float32 page of 8 heads of 128, larger than kLayout's).
  const PageLayout fallback{8, 128, 128, 16, kernels::DType::kFloat32};
  EXPECT_EQ((*pool)->pages_total(), (int64_t{64} << 20) / fallback.page_bytes());
  EXPECT_NE((*pool)->pages_total(), in_use_total);
  EXPECT_EQ((*pool)->Acquire(kLayout).value(), arena);  // the same store
  EXPECT_EQ(stores, 1);
  (*pool)->Release(arena);
  // Released: the arena is unmapped; the next session of the layout gets a new store.
  EXPECT_EQ((*pool)->ReleaseFreeMemory(), 4 * kLayout.page_bytes());
  EXPECT_EQ((*pool)->bytes_kept(), 0);
  Arena* fresh = (*pool)->Acquire(kLayout).value();
  EXPECT_EQ(stores, 2);
  (*pool)->Release(fresh);
  // max_layouts is 1: an idle arena gives its place to another layout at once.
  const PageLayout other{2, 64, 32, 16, kernels::DType::kFloat32};
  auto second = (*pool)->Acquire(other);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(stores, 3);
  // A layout in use keeps its place.
  EXPECT_EQ((*pool)->Acquire(kLayout).status().code(), absl::StatusCode::kResourceExhausted);
  (*pool)->Release(*second);
}

// Pages in use and kept pages together stay within the budget, whatever the layouts: a layout
// that needs memory anew takes it from the other layouts' kept pages, never beyond the pool.
TEST(KvPoolTest, KeptPagesMakeRoomForAnotherLayout) {
  const PageLayout small{2, 64, 64, 16, kernels::DType::kFloat32};  // 16 KiB a page
  ASSERT_EQ(kLayout.page_bytes(), 4 * small.page_bytes());
  const int64_t budget = 8 * kLayout.page_bytes();
  auto pool = KvPool::Create(budget, 16, 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  Arena* a = (*pool)->Acquire(kLayout).value();
  Arena* b = (*pool)->Acquire(small).value();
  std::vector<int32_t> pa, pb;
  ASSERT_TRUE((*pool)->Allocate(a, 8, &pa));
  for (const int32_t page : pa) (*pool)->Unref(a, page);
  EXPECT_EQ((*pool)->bytes_kept(), budget);
  // Four pages of b fit beside nothing in use but a's kept pages: a's go.
  ASSERT_TRUE((*pool)->Allocate(b, 4, &pb));
  EXPECT_EQ((*pool)->bytes_kept(), 0);
  EXPECT_LE((*pool)->bytes_used() + (*pool)->bytes_kept(), budget);
  // b's own kept pages are handed out again before any other, and so need no room.
  for (const int32_t page : pb) (*pool)->Unref(b, page);
  std::vector<int32_t> again;
  ASSERT_TRUE((*pool)->Allocate(b, 2, &again));
  EXPECT_EQ(again, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ((*pool)->bytes_kept(), 2 * small.page_bytes());
  for (const int32_t page : again) (*pool)->Unref(b, page);
  (*pool)->Release(a);
  (*pool)->Release(b);
  EXPECT_EQ((*pool)->ReleaseFreeMemory(), 4 * small.page_bytes());
}

// Rows land where kernels/paged_attention_params.h says a (page, kv head, slot) lives: the host
// store against PagedAttentionParams::k_offset / v_offset, then CopyPage and ReadPage.
TEST(KvPoolTest, HostStoreWritesRowsWhereThePagedLayoutSays) {
  kernels::PageStoreShape shape;
  shape.num_kv_heads = 3;
  shape.head_dim = 5;
  shape.v_head_dim = 2;
  shape.page_size = 4;
  shape.dtype = kernels::DType::kFloat32;
  shape.capacity = 6;
  auto store = kernels::NewHostPageStore(shape);
  ASSERT_TRUE(store.ok()) << store.status();
  kernels::PagedAttentionParams p;
  p.num_kv_heads = shape.num_kv_heads;
  p.head_dim = shape.head_dim;
  p.v_head_dim = shape.v_head_dim;
  p.page_size = shape.page_size;
  struct Place {
    int32_t page;
    int head, slot;
  };
  const std::vector<Place> places = {{0, 0, 0}, {5, 2, 3}, {2, 1, 1}, {2, 1, 2}, {4, 0, 3}};
  std::vector<float> k, v;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < places.size(); ++i) {
    for (int c = 0; c < shape.head_dim; ++c) k.push_back(static_cast<float>(100 * i + c + 1));
    for (int c = 0; c < shape.v_head_dim; ++c) v.push_back(-static_cast<float>(100 * i + c + 1));
    rows.push_back(shape.row(places[i].page, places[i].head, places[i].slot));
  }
  ASSERT_TRUE((*store)->WriteRows(k.data(), v.data(), rows).ok());
  const auto* kb = static_cast<const float*>((*store)->k_base());
  const auto* vb = static_cast<const float*>((*store)->v_base());
  for (size_t i = 0; i < places.size(); ++i) {
    const Place& at = places[i];
    for (int c = 0; c < shape.head_dim; ++c) {
      EXPECT_EQ(kb[p.k_offset(at.page, at.head, at.slot) + c], k[i * shape.head_dim + c]) << i;
    }
    for (int c = 0; c < shape.v_head_dim; ++c) {
      EXPECT_EQ(vb[p.v_offset(at.page, at.head, at.slot) + c], v[i * shape.v_head_dim + c]) << i;
    }
  }
  ASSERT_TRUE((*store)->CopyPage(2, 3).ok());
  std::vector<float> k2(shape.k_page_bytes() / 4), v2(shape.v_page_bytes() / 4);
  std::vector<float> k3(k2.size()), v3(v2.size());
  ASSERT_TRUE((*store)->ReadPage(2, k2.data(), v2.data()).ok());
  ASSERT_TRUE((*store)->ReadPage(3, k3.data(), v3.data()).ok());
  EXPECT_EQ(k2, k3);
  EXPECT_EQ(v2, v3);
  EXPECT_EQ(k3[p.k_offset(0, 1, 2)], k[3 * shape.head_dim]);  // place 3 was page 2, head 1, slot 2
}

// A store that lost its pages (a device reset) keeps its arena until its last page goes; the
// layout's next session gets a new arena with a new store.
TEST(KvPoolTest, ALostStoreIsRetiredAndItsLayoutGetsANewOne) {
  std::vector<testing::LosableStore*> stores;
  auto pool = KvPool::Create(int64_t{64} << 20, 16, 1,
                             [&](const kernels::PageStoreShape& shape)
                                 -> absl::StatusOr<std::unique_ptr<kernels::PageStore>> {
                               auto host = kernels::NewHostPageStore(shape);
                               if (!host.ok()) return host.status();
                               auto store =
                                   std::make_unique<testing::LosableStore>(*std::move(host));
                               stores.push_back(store.get());
                               return store;
                             });
  ASSERT_TRUE(pool.ok()) << pool.status();
  Arena* old = (*pool)->Acquire(kLayout).value();
  std::vector<int32_t> held;
  ASSERT_TRUE((*pool)->Allocate(old, 3, &held));
  EXPECT_FALSE((*pool)->AnyLost());
  stores.back()->Lose();
  EXPECT_TRUE((*pool)->AnyLost());
  // max_layouts is 1: the lost arena does not count against it.
  Arena* fresh = (*pool)->Acquire(kLayout).value();
  EXPECT_NE(fresh, old);
  EXPECT_EQ(stores.size(), 2u);
  EXPECT_FALSE((*pool)->AnyLost());
  EXPECT_EQ((*pool)->pages_used(), 3);  // the retired arena's pages are still held
  for (int32_t page : held) (*pool)->Unref(old, page);
  (*pool)->Release(old);
  EXPECT_EQ((*pool)->pages_used(), 0);
  EXPECT_EQ((*pool)->bytes_used(), 0);
  EXPECT_EQ((*pool)->Acquire(kLayout).value(), fresh);  // the live one is shared
  (*pool)->Release(fresh);
  (*pool)->Release(fresh);
}

}  // namespace
}  // namespace attnserve::server::sessions
