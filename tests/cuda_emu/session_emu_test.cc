// Decode sessions on the CUDA backend's device page store, on the emulated device: the session
// manager (server/sessions/session_manager.h) writes new K and V through CudaPageStore::WriteRows
// (the scatter kernel), copies a fork's shared last page with CopyPage, and PagedAttention reads
// the pages where they are. The same prefills, steps and fork run on a second manager with host
// pages and the reference backend (float64): every output agrees within the paged kernels'
// tolerance. Closing every session leaves the pool empty and frees the device store.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/reference.h"
#include "server/sessions/session_manager.h"

namespace attnserve {
namespace {

using server::sessions::ExtendItem;
using server::sessions::SessionManager;

constexpr int kHq = 4, kHkv = 2, kD = 16, kDv = 8;

// Projected q, k, v of `t` tokens, token-major ([t, H, D]), float32.
struct Tokens {
  std::vector<float> q, k, v;
  Tokens(int t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.5f, 1.5f);
    q.resize(size_t(t) * kHq * kD);
    k.resize(size_t(t) * kHkv * kD);
    v.resize(size_t(t) * kHkv * kDv);
    for (float& x : q) x = d(rng);
    for (float& x : k) x = d(rng);
    for (float& x : v) x = d(rng);
  }
};

// One manager and the backend its extends compute on.
struct Side {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<SessionManager> manager;

  // Extends `id` with tokens [from, to) of `t` (all its chunks); the output [to - from, Hq, Dv].
  std::vector<float> Extend(const std::string& id, const Tokens& t, int from, int to) {
    ExtendItem item;
    const absl::Status begun = manager->BeginExtend("", id, std::nullopt, to - from, &item);
    EXPECT_TRUE(begun.ok()) << begun;
    if (!begun.ok()) return {};
    item.q = t.q.data() + int64_t{from} * kHq * kD;
    item.k = t.k.data() + int64_t{from} * kHkv * kD;
    item.v = t.v.data() + int64_t{from} * kHkv * kDv;
    ExtendItem* items[] = {&item};
    do {
      manager->Compute(items, backend.get());
    } while (item.pending());
    EXPECT_TRUE(item.status.ok()) << item.status;
    item.lease.End(item.status.ok());
    return {item.out.begin(), item.out.end()};
  }
};

// A CUDA backend on the emulated device.
absl::StatusOr<std::unique_ptr<kernels::cuda::CudaBackend>> EmulatedCudaBackend() {
  kernels::cuda::CudaBackendOptions cuda_options;
  cuda_options.num_streams = 2;
  return kernels::cuda::CudaBackend::Create(cuda_options);
}

// The sessions' settings of these tests: pages of 4 tokens, prefills in chunks of 3 (as the
// server computes them), pages on `backend` (nullptr: host pages).
server::sessions::SessionOptions Options(kernels::Backend* backend, int64_t pool_bytes) {
  server::sessions::SessionOptions options;
  options.page_tokens = 4;
  options.prefill_chunk_tokens = 3;
  options.pool_bytes = pool_bytes;
  options.backend = backend;
  return options;
}

// A raw session of the tests' head layout.
server::sessions::SessionSpec Spec(kernels::DType cache_dtype) {
  server::sessions::SessionSpec spec;
  spec.num_heads = kHq;
  spec.num_kv_heads = kHkv;
  spec.head_dim = kD;
  spec.v_head_dim = kDv;
  spec.cache_dtype = cache_dtype;
  return spec;
}

class SessionEmuTest : public testing::TestWithParam<kernels::DType> {
 protected:
  void SetUp() override {
    auto cuda = EmulatedCudaBackend();
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = cuda->get();
    device_.backend = std::move(*cuda);
    host_.backend = std::make_unique<kernels::ReferenceBackend>();
    device_.manager =
        SessionManager::Create(Options(device_.backend.get(), 64 << 10), nullptr).value();
    host_.manager = SessionManager::Create(Options(nullptr, 64 << 10), nullptr).value();
  }

  // The same session on both sides.
  std::pair<std::string, std::string> Create() {
    const server::sessions::SessionSpec spec = Spec(GetParam());
    return {device_.manager->Create(spec).value().id, host_.manager->Create(spec).value().id};
  }

  // Extends both and compares the outputs.
  void Extend(const std::pair<std::string, std::string>& ids, const Tokens& t, int from, int to) {
    const std::vector<float> got = device_.Extend(ids.first, t, from, to);
    const std::vector<float> want = host_.Extend(ids.second, t, from, to);
    ASSERT_EQ(got.size(), size_t(to - from) * kHq * kDv);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 2e-5) << "tokens [" << from << ", " << to << "), element " << i;
    }
  }

  kernels::cuda::CudaBackend* cuda_ = nullptr;
  Side device_, host_;
};

TEST_P(SessionEmuTest, PrefillsStepsAndAForkMatchHostPages) {
  const auto a = Create();
  // The layout's device store has addresses, and memory only once a page is written.
  EXPECT_EQ(cuda_->MemoryFigures().session_pages_bytes, 0);
  const Tokens ta(12, 1), tb(12, 2);
  Extend(a, ta, 0, 5);  // a prefill in two chunks, across a page boundary
  EXPECT_GT(cuda_->MemoryFigures().session_pages_bytes, 0);
  Extend(a, ta, 5, 6);
  Extend(a, ta, 6, 7);  // 7 tokens: the last page holds 3 of 4
  // The fork shares a's pages; its first extend copies the shared last page (CopyPage) before
  // writing its own token there, and a's page keeps a's.
  const std::pair<std::string, std::string> b = {
      device_.manager->Fork("", a.first, false, absl::ZeroDuration()).value().id,
      host_.manager->Fork("", a.second, false, absl::ZeroDuration()).value().id};
  Extend(b, tb, 7, 9);
  Extend(a, ta, 7, 8);
  Extend(a, ta, 8, 12);
  Extend(b, tb, 9, 10);

  EXPECT_GT(device_.manager->Usage().pages_used, 0);
  for (const auto& ids : {a, b}) {
    ASSERT_TRUE(device_.manager->Close("", ids.first).ok());
    ASSERT_TRUE(host_.manager->Close("", ids.second).ok());
  }
  EXPECT_EQ(device_.manager->Usage().pages_used, 0);
  EXPECT_EQ(device_.manager->Usage().bytes_used, 0);
  // The layout's arena stays with its memory for the next session until the server is idle
  // (kv_pool.h); then it goes, and its device memory with it.
  EXPECT_GT(cuda_->MemoryFigures().session_pages_bytes, 0);
  EXPECT_GT(device_.manager->ReleaseIdleMemory(), 0);
  EXPECT_EQ(cuda_->MemoryFigures().session_pages_bytes, 0);
}

// A session with a sliding window, soft-capping and ALiBi (issue 32) on the device store: the
// paged kernel applies them, and the pages the window left behind (dropped by the session once
// its next token's window starts a split past them) are neither read nor kept: the device side
// agrees with host pages and the reference backend, and its pool use stops growing with the
// length.
TEST_P(SessionEmuTest, ScoreModsAndAWindowMatchHostPages) {
  // Pools of 1 MiB: a prefill reserves the pages of all its tokens first. Chunks of 64 tokens
  // (the other tests take 3): 1100 tokens in 3-token chunks cost seconds under ASan.
  server::sessions::SessionOptions device = Options(device_.backend.get(), 1 << 20);
  server::sessions::SessionOptions host = Options(nullptr, 1 << 20);
  device.prefill_chunk_tokens = host.prefill_chunk_tokens = 64;
  device_.manager = SessionManager::Create(device, nullptr).value();
  host_.manager = SessionManager::Create(host, nullptr).value();
  server::sessions::SessionSpec spec = Spec(GetParam());
  spec.mods.window_left = 40;
  spec.mods.softcap = 1.5f;
  spec.mods.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  const std::pair<std::string, std::string> a = {device_.manager->Create(spec).value().id,
                                                 host_.manager->Create(spec).value().id};
  const Tokens t(1100, 3);
  Extend(a, t, 0, 700);  // a prefill in chunks: past two splits of 256 keys
  const int64_t pages = device_.manager->Usage().pages_used;
  Extend(a, t, 700, 701);
  Extend(a, t, 701, 1100);  // the window moved past another split: its pages went
  EXPECT_LE(device_.manager->Usage().pages_used, pages);
  EXPECT_EQ(device_.manager->Usage().pages_used, host_.manager->Usage().pages_used);
}

// Two head layouts (here two cache types) share the one pool on the device too: each layout's
// store maps device memory only under its pages in use. With a 4 MiB pool and a few pages per
// layout the device holds one granule (64 KiB on the emulated device) of K and one of V per
// layout, not the pool per layout (as when every store was allocated whole: 8 MiB here).
TEST(SessionEmuLayoutsTest, LayoutsShareThePoolOnTheDevice) {
  auto cuda = EmulatedCudaBackend();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  kernels::cuda::CudaBackend* backend = cuda->get();
  Side side;
  side.backend = std::move(*cuda);
  side.manager = SessionManager::Create(Options(side.backend.get(), 4 << 20), nullptr).value();

  std::vector<std::string> ids;
  for (const kernels::DType dtype : {kernels::DType::kFloat16, kernels::DType::kFloat32}) {
    ids.push_back(side.manager->Create(Spec(dtype)).value().id);
  }
  const Tokens t(6, 3);
  for (const std::string& id : ids) side.Extend(id, t, 0, 6);  // two pages each
  constexpr int64_t kGranule = int64_t{64} << 10;
  EXPECT_EQ(backend->MemoryFigures().session_pages_bytes, 4 * kGranule);
  for (const std::string& id : ids) ASSERT_TRUE(side.manager->Close("", id).ok());
  EXPECT_EQ(backend->MemoryFigures().session_pages_bytes, 4 * kGranule);  // kept until idle
  side.manager->ReleaseIdleMemory();
  EXPECT_EQ(backend->MemoryFigures().session_pages_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(CacheTypes, SessionEmuTest,
                         testing::Values(kernels::DType::kFloat16, kernels::DType::kBFloat16,
                                         kernels::DType::kFloat32),
                         [](const testing::TestParamInfo<kernels::DType>& info) {
                           return std::string(kernels::DTypeName(info.param));
                         });

}  // namespace
}  // namespace attnserve
