// KvPool (server/sessions/kv_pool.h): the arenas' address ranges, page reuse and exact
// accounting.
#include "server/sessions/kv_pool.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::server::sessions {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

// A page of 16 tokens of 8 kv heads of 128 float16: 32 KiB of K and 32 KiB of V.
const PageLayout kLayout{8, 128, 128, kernels::DType::kFloat16};

TEST(KvPoolTest, ArenaRangesStartOnHugePageBoundaries) {
  auto pool = KvPool::Create(int64_t{256} << 20, 16, 4);
  ASSERT_TRUE(pool.ok()) << pool.status();
  // Two layouts, so that the second arena's ranges are reserved after others exist.
  for (const PageLayout& layout : {kLayout, PageLayout{2, 64, 32, kernels::DType::kFloat32}}) {
    auto arena = (*pool)->Acquire(layout);
    ASSERT_TRUE(arena.ok()) << arena.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->store()->k_base()) % kHugePage, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->store()->v_base()) % kHugePage, 0u);
  }
}

// The bytes of a page of a host store.
uint8_t* KPage(const Arena* arena, int32_t page) {
  return static_cast<uint8_t*>(arena->store()->k_base()) + page * arena->k_page_bytes();
}
uint8_t* VPage(const Arena* arena, int32_t page) {
  return static_cast<uint8_t*>(arena->store()->v_base()) + page * arena->v_page_bytes();
}

TEST(KvPoolTest, PagesAreWritableAcrossTheRangeAndComeBackZeroedWhenReused) {
  const int64_t page_bytes = kLayout.k_page_bytes(16) + kLayout.v_page_bytes(16);
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
  // Freed and handed out again: the memory was given back to the system (32 KiB is a whole
  // number of system pages), so it reads as zeros.
  (*pool)->Unref(*arena, last);
  EXPECT_EQ((*pool)->bytes_used(), (pages - 1) * page_bytes);
  std::vector<int32_t> again;
  ASSERT_TRUE((*pool)->Allocate(*arena, 1, &again));
  EXPECT_EQ(again[0], last);
  EXPECT_EQ(KPage(*arena, last)[0], 0);
  EXPECT_EQ(VPage(*arena, last)[(*arena)->v_page_bytes() - 1], 0);
  held.back() = again[0];  // the same page, one reference
  for (int32_t page : held) (*pool)->Unref(*arena, page);
  EXPECT_EQ((*pool)->bytes_used(), 0);
  (*pool)->Release(*arena);
}

}  // namespace
}  // namespace attnserve::server::sessions
