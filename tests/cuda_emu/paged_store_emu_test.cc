// CudaBackend's device page store (cuda_backend.h, "Session pages") on the emulated device:
// NewPageStore, WriteRows (the copy and the scatter kernel through paged_attention.cu's launch
// code), CopyPage, ReadPage, PagedAttention reading the store's pages in place, the loss of the
// pages at a device reset, and the memory accounting: device memory mapped only under the pages
// in use (shim/cuda.h's virtual memory calls). FLOAT16, BFLOAT16 and FLOAT32 caches.
//
// Expectations are independent of the store: a host store (NewHostPageStore, plain memcpy)
// given the same writes, the float64 reference (ReferencePagedAttention64), and the same call
// on host pages (the host path stages the pages and runs the same kernel: equal bits).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/dtype.h"
#include "kernels/page_store.h"
#include "kernels/paged_attention_params.h"
#include "kernels/reference.h"

namespace attnserve::kernels::cuda {
namespace {

// The emulated device's allocation granularity (shim/cuda.h).
constexpr int64_t kGranule = int64_t{64} << 10;

// Random rows of `n` elements each in `dtype` (values in [-1.5, 1.5]).
std::vector<uint8_t> RandomRows(DType dtype, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = d(rng);
    FromFloat32(dtype, &x, 1, bytes.data() + i * DTypeSize(dtype));
  }
  return bytes;
}

// Writes the same rows to both stores.
void WriteBoth(PageStore& a, PageStore& b, const std::vector<int64_t>& rows, std::mt19937& rng) {
  const PageStoreShape& s = a.shape();
  const int64_t n = static_cast<int64_t>(rows.size());
  const std::vector<uint8_t> k = RandomRows(s.dtype, n * s.head_dim, rng);
  const std::vector<uint8_t> v = RandomRows(s.dtype, n * s.v_head_dim, rng);
  ASSERT_TRUE(a.WriteRows(k.data(), v.data(), rows).ok());
  ASSERT_TRUE(b.WriteRows(k.data(), v.data(), rows).ok());
}

// Every row of `pages` (all kv heads and slots).
std::vector<int64_t> RowsOfPages(const PageStoreShape& s, const std::vector<int32_t>& pages) {
  std::vector<int64_t> rows;
  for (const int32_t page : pages) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (int slot = 0; slot < s.page_size; ++slot) rows.push_back(s.row(page, h, slot));
    }
  }
  return rows;
}

// Page `page` of `got` holds the bytes of the same page of `want`.
void ExpectSamePage(const PageStore& got, const PageStore& want, int32_t page) {
  const PageStoreShape& s = got.shape();
  std::vector<uint8_t> gk(s.k_page_bytes()), gv(s.v_page_bytes());
  std::vector<uint8_t> wk(s.k_page_bytes()), wv(s.v_page_bytes());
  ASSERT_TRUE(got.ReadPage(page, gk.data(), gv.data()).ok()) << "page " << page;
  ASSERT_TRUE(want.ReadPage(page, wk.data(), wv.data()).ok()) << "page " << page;
  EXPECT_EQ(gk, wk) << "K of page " << page;
  EXPECT_EQ(gv, wv) << "V of page " << page;
}

// Every page of `got` holds the bytes of the same page of `want`.
void ExpectSamePages(const PageStore& got, const PageStore& want) {
  for (int32_t page = 0; page < got.shape().capacity; ++page) ExpectSamePage(got, want, page);
}

PageStoreShape Shape(DType dtype, int num_kv_heads, int head_dim, int v_head_dim, int capacity) {
  PageStoreShape s;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.v_head_dim = v_head_dim;
  s.page_size = 16;
  s.dtype = dtype;
  s.capacity = capacity;
  return s;
}

class PagedStoreEmuTest : public testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    CudaBackendOptions options;
    options.num_streams = 2;
    auto b = CudaBackend::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }

  std::unique_ptr<PageStore> DeviceStore(const PageStoreShape& shape) {
    auto store = backend_->NewPageStore(shape);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    EXPECT_TRUE((*store)->on_device());
    EXPECT_FALSE((*store)->lost());
    return *std::move(store);
  }

  std::unique_ptr<CudaBackend> backend_;
};

// Every row written once (the pages' whole contents defined), then rows at random places
// rewritten in one call, the first and the last row of the pages among them; then a page
// copied over another. D != Dv: a V row placed at the K row width lands elsewhere. (Small
// shapes: the emulator starts a host thread per word the scatter kernel copies.)
TEST_P(PagedStoreEmuTest, WriteCopyAndReadRows) {
  const PageStoreShape shape = Shape(GetParam(), 2, 24, 40, 5);
  std::unique_ptr<PageStore> dev = DeviceStore(shape);
  ASSERT_NE(dev, nullptr);
  auto host = NewHostPageStore(shape);
  ASSERT_TRUE(host.ok());
  // No memory before a page is written.
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
  EXPECT_EQ(emu::MappedBytes(), 0u);

  const int64_t all = int64_t{shape.capacity} * shape.num_kv_heads * shape.page_size;
  std::vector<int64_t> rows(all);
  std::iota(rows.begin(), rows.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(rows.begin(), rows.end(), rng);
  WriteBoth(*dev, **host, rows, rng);
  // Every page written: K (5 x 1536 or 3072 bytes) and V (5 x 2560 or 5120) in one granule each.
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 2 * kGranule);
  EXPECT_EQ(emu::MappedBytes(), size_t{2 * kGranule});
  EXPECT_GE(backend_->device_memory()[0].pool_bytes, 2 * kGranule);
  rows.resize(29);
  rows.push_back(shape.row(0, 0, 0));
  rows.push_back(shape.row(shape.capacity - 1, shape.num_kv_heads - 1, shape.page_size - 1));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::shuffle(rows.begin(), rows.end(), rng);
  WriteBoth(*dev, **host, rows, rng);
  ExpectSamePages(*dev, **host);

  ASSERT_TRUE(dev->CopyPage(3, 1).ok());
  ASSERT_TRUE((*host)->CopyPage(3, 1).ok());
  ExpectSamePages(*dev, **host);

  dev.reset();
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
  EXPECT_EQ(emu::MappedBytes(), 0u);
}

// Device memory follows the pages in use, by the granule (64 KiB on the emulated device), for
// any number of layouts: each store reserves addresses for the whole pool, and maps a granule
// when a page in it is first written (WriteRows, CopyPage's target), unmapping it at the
// store's next operation once every page in it was discarded. A page may straddle two
// granules. A discarded page cannot be read. Expectations: the granules each page's bytes
// cover, computed here from the shape.
TEST_P(PagedStoreEmuTest, MemoryFollowsThePagesInUse) {
  // 2 kv heads, D 24, Dv 40: K pages of 1536 (16-bit) or 3072 bytes, V of 2560 or 5120; 200
  // pages, 300-1000 KiB per store, so pages lie across granule boundaries.
  const PageStoreShape shape = Shape(GetParam(), 2, 24, 40, 200);
  const PageStoreShape other = Shape(GetParam(), 1, 64, 64, 200);
  std::unique_ptr<PageStore> a = DeviceStore(shape);
  std::unique_ptr<PageStore> b = DeviceStore(other);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(emu::MappedBytes(), 0u);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);

  // The granules holding any byte of the live pages of `s`, in bytes.
  auto expected = [](const PageStoreShape& s, const std::vector<int32_t>& live) {
    // The granules under pages of `page_bytes` each.
    auto granules = [&live](int64_t page_bytes) {
      std::set<int64_t> g;
      for (const int32_t page : live) {
        for (int64_t i = page * page_bytes / kGranule;
             i <= ((page + 1) * page_bytes - 1) / kGranule; ++i)
          g.insert(i);
      }
      return static_cast<int64_t>(g.size());
    };
    return (granules(s.k_page_bytes()) + granules(s.v_page_bytes())) * kGranule;
  };
  auto host_a = NewHostPageStore(shape);
  auto host_b = NewHostPageStore(other);
  ASSERT_TRUE(host_a.ok() && host_b.ok());
  std::mt19937 rng(11);
  auto write_pages = [&](PageStore& dev, PageStore& host, const std::vector<int32_t>& pages) {
    WriteBoth(dev, host, RowsOfPages(dev.shape(), pages), rng);
  };
  // Pages 0, 1, 42 (its K straddles the first two granules in 16 bits), 150 and the last.
  std::vector<int32_t> live_a = {0, 1, 42, 150, 199};
  write_pages(*a, **host_a, live_a);
  std::vector<int32_t> live_b = {7};
  write_pages(*b, **host_b, live_b);
  int64_t want = expected(shape, live_a) + expected(other, live_b);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, want);
  EXPECT_EQ(emu::MappedBytes(), static_cast<size_t>(want));

  // A copy maps its target; a page read back holds what was written.
  ASSERT_TRUE(a->CopyPage(150, 100).ok());
  ASSERT_TRUE((*host_a)->CopyPage(150, 100).ok());
  live_a.push_back(100);
  want = expected(shape, live_a) + expected(other, live_b);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, want);
  for (const int32_t page : live_a) ExpectSamePage(*a, **host_a, page);

  // Discarded pages keep their memory until the store's next operation.
  for (const int32_t page : {42, 150, 199}) a->Discard(page);
  live_a = {0, 1, 100};
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, want);
  std::vector<uint8_t> gk(shape.k_page_bytes()), gv(shape.v_page_bytes());
  absl::Status s = a->ReadPage(150, gk.data(), gv.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("page 150"), std::string::npos) << s;
  want = expected(shape, live_a) + expected(other, live_b);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, want);
  EXPECT_EQ(emu::MappedBytes(), static_cast<size_t>(want));
  EXPECT_LT(want, expected(shape, {0, 1, 42, 100, 150, 199}) + expected(other, live_b));

  // A discarded page written again gets memory again (its old contents are not kept).
  write_pages(*a, **host_a, {150});
  live_a.push_back(150);
  want = expected(shape, live_a) + expected(other, live_b);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, want);
  ExpectSamePage(*a, **host_a, 150);

  a.reset();
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, expected(other, live_b));
  b.reset();
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
  EXPECT_EQ(emu::MappedBytes(), 0u);
}

// A batch of decode steps and a prefill chunk (GQA 4/1, D 24, Dv 40, pages scattered; a
// sequence sharing a page with another, as forks do) on the device store equals the same call
// on host pages bit for bit, and the float64 reference within the paged kernel's tolerances
// (tests/cuda_emu/paged_attention_emu_test.cc). The device call copies to the device fewer
// bytes than its pages hold: it reads them in place.
TEST_P(PagedStoreEmuTest, AttentionReadsThePagesInPlace) {
  const DType dtype = GetParam();
  const PageStoreShape shape = Shape(dtype, 1, 24, 40, 9);
  std::unique_ptr<PageStore> dev = DeviceStore(shape);
  ASSERT_NE(dev, nullptr);
  auto host = NewHostPageStore(shape);
  ASSERT_TRUE(host.ok());
  const int H = 4, P = shape.page_size;
  // (q_len, kv_len) per sequence; sequence 2's first page is sequence 0's first (a fork).
  const std::vector<std::pair<int, int>> seqs = {{1, 40}, {3, 33}, {1, 17}};
  const int S = static_cast<int>(seqs.size()), max_pages = 3;
  const std::vector<int32_t> table = {7, 2, 5, 0, 8, 3, 7, 1, -1};
  // Every row of the store written (the whole pool defined: a stray read gives a finite but
  // wrong value, caught by the reference).
  std::mt19937 rng(9);
  std::vector<int64_t> rows(int64_t{shape.capacity} * shape.num_kv_heads * P);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  WriteBoth(*dev, **host, rows, rng);

  std::vector<int32_t> kv_lens, q_lens, q_offsets;
  int total_q = 0;
  for (const auto& [q, kv] : seqs) {
    q_offsets.push_back(total_q);
    q_lens.push_back(q);
    kv_lens.push_back(kv);
    total_q += q;
  }
  const std::vector<uint8_t> q = RandomRows(dtype, int64_t{total_q} * H * shape.head_dim, rng);
  PagedAttentionParams p;
  p.num_seqs = S;
  p.num_heads = H;
  p.num_kv_heads = shape.num_kv_heads;
  p.head_dim = shape.head_dim;
  p.v_head_dim = shape.v_head_dim;
  p.page_size = P;
  p.max_pages_per_seq = max_pages;
  p.dtype = dtype;
  p.q_dtype = dtype;
  p.page_table = table.data();
  p.kv_lens = kv_lens.data();
  p.q_lens = q_lens.data();
  p.q_offsets = q_offsets.data();
  p.total_q = total_q;
  p.q = q.data();
  p.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const size_t out_n = size_t(total_q) * H * shape.v_head_dim, lse_n = size_t(total_q) * H;

  std::vector<float> dev_out(out_n, -12345.0f), dev_lse(lse_n, -12345.0f);
  PagedAttentionParams pd = p;
  pd.store = dev.get();
  pd.k_pages = dev->k_base();
  pd.v_pages = dev->v_base();
  pd.out = dev_out.data();
  pd.lse = dev_lse.data();
  const size_t before = emu::HostToDeviceBytes();
  ASSERT_TRUE(backend_->PagedAttention(pd).ok());
  const size_t copied = emu::HostToDeviceBytes() - before;
  // 7 distinct pages used.
  EXPECT_LT(copied, size_t(7) * (shape.k_page_bytes() + shape.v_page_bytes()));

  std::vector<float> host_out(out_n, -12345.0f), host_lse(lse_n, -12345.0f);
  PagedAttentionParams ph = p;
  ph.store = host->get();
  ph.k_pages = (*host)->k_base();
  ph.v_pages = (*host)->v_base();
  ph.out = host_out.data();
  ph.lse = host_lse.data();
  const size_t before_host = emu::HostToDeviceBytes();
  ASSERT_TRUE(backend_->PagedAttention(ph).ok());
  EXPECT_GE(emu::HostToDeviceBytes() - before_host,
            size_t(7) * (shape.k_page_bytes() + shape.v_page_bytes()));

  EXPECT_EQ(std::memcmp(dev_out.data(), host_out.data(), out_n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dev_lse.data(), host_lse.data(), lse_n * sizeof(float)), 0);
  const Reference64 ref = ReferencePagedAttention64(ph);
  int bad = 0;
  for (size_t e = 0; e < out_n; ++e) {
    if (!(std::fabs(dev_out[e] - ref.out[e]) <= 2e-5 * std::max(1.0, std::fabs(ref.out[e]))) &&
        ++bad <= 5) {
      ADD_FAILURE() << "out element " << e << " got " << dev_out[e] << " want " << ref.out[e];
    }
  }
  for (size_t e = 0; e < lse_n; ++e) {
    if (!(std::fabs(dev_lse[e] - ref.weights[e]) <=
          5e-5 * std::max(1.0, std::fabs(ref.weights[e]))) &&
        ++bad <= 10) {
      ADD_FAILURE() << "lse " << e << " got " << dev_lse[e] << " want " << ref.weights[e];
    }
  }
  EXPECT_EQ(bad, 0);
}

// Mapping a page's memory can fail. The device out of memory (the emulated device limited to
// three granules): the write fails with RESOURCE_EXHAUSTED naming the page and the driver's
// error, maps nothing (a K granule mapped before V failed is unmapped again), and is no device
// fault: pages with memory are still written. Any other failure of the driver (a broken
// context: a sticky error injected) is a device fault, INTERNAL, and the device is reset.
TEST_P(PagedStoreEmuTest, MappingFailures) {
  const PageStoreShape shape = Shape(GetParam(), 2, 24, 40, 200);
  std::unique_ptr<PageStore> dev = DeviceStore(shape);
  ASSERT_NE(dev, nullptr);
  auto host = NewHostPageStore(shape);
  ASSERT_TRUE(host.ok());
  std::mt19937 rng(13);
  auto rows_of = [&](int32_t page) { return RowsOfPages(shape, {page}); };
  WriteBoth(*dev, **host, rows_of(0), rng);  // K and V granule 0
  ASSERT_EQ(emu::MappedBytes(), size_t{2 * kGranule});
  emu::LimitDeviceMemory(3 * kGranule);
  const std::vector<uint8_t> k = RandomRows(shape.dtype, 32 * shape.head_dim, rng);
  const std::vector<uint8_t> v = RandomRows(shape.dtype, 32 * shape.v_head_dim, rng);
  // Page 199: its K granule fits the limit, its V granule does not.
  absl::Status s = dev->WriteRows(k.data(), v.data(), rows_of(199));
  emu::LimitDeviceMemory(size_t{16} << 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("session page 199"), std::string::npos) << s;
  EXPECT_NE(s.message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << s;
  EXPECT_EQ(emu::MappedBytes(), size_t{2 * kGranule});
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 2 * kGranule);
  EXPECT_FALSE(dev->lost());
  WriteBoth(*dev, **host, rows_of(1), rng);  // in granule 0: no memory needed
  ExpectSamePage(*dev, **host, 1);

  emu::InjectStickyError(cudaErrorIllegalAddress);
  s = dev->WriteRows(k.data(), v.data(), rows_of(150));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << s;
  EXPECT_NE(s.message().find("device fault"), std::string::npos) << s;
  std::vector<uint8_t> gk(shape.k_page_bytes()), gv(shape.v_page_bytes());
  EXPECT_EQ(dev->ReadPage(0, gk.data(), gv.data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(dev->lost());
  dev.reset();
  EXPECT_EQ(emu::MappedBytes(), 0u);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
}

// A device fault (a sticky error injected into the emulated device): the failing call says so,
// the next call re-initialises the device (cudaDeviceReset frees every allocation), and the
// store made before is lost: its calls fail with FAILED_PRECONDITION, PagedAttention on it too,
// its bytes leave the accounting, and destroying it frees nothing (its pointers are stale). A
// store made after the reset works.
TEST_P(PagedStoreEmuTest, LostAfterADeviceReset) {
  const PageStoreShape shape = Shape(GetParam(), 1, 8, 8, 2);
  std::unique_ptr<PageStore> old_store = DeviceStore(shape);
  ASSERT_NE(old_store, nullptr);
  auto host = NewHostPageStore(shape);
  ASSERT_TRUE(host.ok());
  std::mt19937 rng(3);
  WriteBoth(*old_store, **host, {0, 5, 31}, rng);

  emu::InjectStickyError(cudaErrorIllegalAddress);
  const std::vector<uint8_t> row = RandomRows(shape.dtype, 8, rng);
  const int64_t one_row[] = {1};
  absl::Status s = old_store->WriteRows(row.data(), row.data(), one_row);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("device fault"), std::string::npos) << s;

  std::vector<uint8_t> k(shape.k_page_bytes()), v(shape.v_page_bytes());
  s = old_store->ReadPage(0, k.data(), v.data());  // takes a worker: the reset happens
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(old_store->lost());
  EXPECT_EQ(old_store->WriteRows(row.data(), row.data(), one_row).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old_store->CopyPage(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);

  PagedAttentionParams p;
  const int32_t table[] = {0}, kv_lens[] = {3}, q_lens[] = {1}, q_offsets[] = {0};
  const std::vector<uint8_t> q = RandomRows(shape.dtype, 8, rng);
  std::vector<float> out(8);
  p.num_seqs = 1;
  p.num_heads = p.num_kv_heads = 1;
  p.head_dim = p.v_head_dim = 8;
  p.page_size = shape.page_size;
  p.max_pages_per_seq = 1;
  p.dtype = shape.dtype;
  p.q_dtype = shape.dtype;
  p.store = old_store.get();
  p.k_pages = old_store->k_base();
  p.v_pages = old_store->v_base();
  p.page_table = table;
  p.kv_lens = kv_lens;
  p.q_lens = q_lens;
  p.q_offsets = q_offsets;
  p.total_q = 1;
  p.q = q.data();
  p.out = out.data();
  EXPECT_EQ(backend_->PagedAttention(p).code(), absl::StatusCode::kFailedPrecondition);

  std::unique_ptr<PageStore> new_store = DeviceStore(shape);
  ASSERT_NE(new_store, nullptr);
  const size_t allocations = emu::DeviceAllocations();
  const size_t invalid_frees = emu::InvalidFrees();
  old_store.reset();
  EXPECT_EQ(emu::DeviceAllocations(), allocations);
  EXPECT_EQ(emu::InvalidFrees(), invalid_frees);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
  EXPECT_EQ(emu::MappedBytes(), 0u);
  auto fresh_host = NewHostPageStore(shape);
  ASSERT_TRUE(fresh_host.ok());
  std::vector<int64_t> all(shape.capacity * shape.page_size);
  std::iota(all.begin(), all.end(), 0);
  WriteBoth(*new_store, **fresh_host, all, rng);
  ExpectSamePages(*new_store, **fresh_host);
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 2 * kGranule);
}

INSTANTIATE_TEST_SUITE_P(CacheTypes, PagedStoreEmuTest,
                         testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Layouts the paged kernels do not take (head dims above 256) keep host pages; a pool larger
// than the device fails with RESOURCE_EXHAUSTED naming the bytes and the flag (its addresses
// could be reserved, but its pages could never all have memory).
TEST(PagedStoreEmuFactoryTest, HostPagesForWideHeadsAndRefusalWhenTooLarge) {
  auto b = CudaBackend::Create(CudaBackendOptions{});
  ASSERT_TRUE(b.ok()) << b.status();
  auto wide = (*b)->NewPageStore(Shape(DType::kFloat16, 1, 264, 64, 2));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_FALSE((*wide)->on_device());
  EXPECT_EQ((*b)->MemoryFigures().session_pages_bytes, 0);

  // 300000 pages of 8 float32 heads of 128: 19.7 GB of K, past the emulated device's 16 GiB.
  const PageStoreShape big = Shape(DType::kFloat32, 8, 128, 128, 300000);
  auto refused = (*b)->NewPageStore(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string bytes = std::to_string(2 * int64_t{300000} * big.k_page_bytes());
  EXPECT_NE(refused.status().message().find(bytes), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("--session_pool_bytes"), std::string::npos);
  EXPECT_EQ((*b)->MemoryFigures().session_pages_bytes, 0);
}

}  // namespace
}  // namespace attnserve::kernels::cuda
