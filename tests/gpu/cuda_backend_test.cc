// CudaBackend (kernels/cuda/cuda_backend.h) against the float64 reference. Every check bounds
// the error of the fused path relative to a plain cuBLAS attention in the same operand type
// (the backend's weights path): max|fast - ref| <= 2 * max|naive - ref| + 1e-5 (FlashAttention's
// test rule). Every test skips cleanly when no CUDA device is present (CI), except the one that
// checks exactly that case.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "kernels/reference.h"
#include "tests/gpu/backend_problem.h"
#include "tests/gpu/linear_rows.h"

namespace attnserve::kernels::cuda {
namespace {

class CudaBackendTest : public ::testing::TestWithParam<ComputeType> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    CudaBackendOptions options;
    options.num_streams = 2;
    auto b = CudaBackend::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }

  // Runs `pr` fused and naive (weights path), checks both against float64.
  void CheckAgainstReference(Problem& pr, const char* what) {
    SCOPED_TRACE(what);
    cuda::CheckAgainstReference(*backend_, GetParam(), pr);
  }

  std::unique_ptr<CudaBackend> backend_;
};

TEST_P(CudaBackendTest, SpecialisedHeadDims) {
  std::mt19937 rng(1);
  for (int d : {64, 128}) {
    for (int l : {1, 17, 64, 200, 513}) {
      Problem pr = MakeProblem(rng, 2, 4, 4, l, l + 3, d, d);
      CheckAgainstReference(pr, "dense");
    }
  }
}

// Every tensor-core instantiation, at its width and zero-padded (D and Dv below it, D != Dv).
TEST_P(CudaBackendTest, PaddedTensorCoreHeadDims) {
  std::mt19937 rng(4);
  for (auto [d, dv] : {std::pair{32, 32},
                       {24, 32},
                       {80, 80},
                       {96, 72},
                       {152, 136},
                       {160, 160},
                       {176, 192},
                       {192, 192},
                       {200, 224},
                       {256, 256},
                       {64, 32},
                       {8, 256}}) {
    Problem pr = MakeProblem(rng, 1, 2, 2, 70, 90, d, dv);
    CheckAgainstReference(pr, "tensor-core head dims");
  }
}

TEST_P(CudaBackendTest, GenericHeadDims) {
  std::mt19937 rng(2);
  for (auto [d, dv] : {std::pair{36, 36}, {100, 100}, {64, 30}, {40, 300}}) {
    Problem pr = MakeProblem(rng, 1, 2, 2, 70, 90, d, dv);
    CheckAgainstReference(pr, "generic / naive head dims");
  }
}

TEST_P(CudaBackendTest, CausalAlignments) {
  std::mt19937 rng(3);
  for (int d : {64, 128, 48}) {
    for (auto [lq, lk] : {std::pair{128, 128}, {100, 300}, {300, 100}, {1, 77}, {65, 1}}) {
      Problem pr = MakeProblem(rng, 2, 2, 2, lq, lk, d, d);
      pr.causal = true;
      CheckAgainstReference(pr, "causal");  // lq > lk: fully blocked rows -> mean of values
    }
  }
}

TEST_P(CudaBackendTest, KeyLengthsIncludingZero) {
  std::mt19937 rng(4);
  for (int d : {64, 128, 96}) {
    Problem pr = MakeProblem(rng, 4, 2, 2, 150, 150, d, d);
    pr.key_lengths = {150, 0, 1, 77};
    pr.causal = d == 128;
    CheckAgainstReference(pr, "key lengths");
  }
}

TEST_P(CudaBackendTest, MasksWithFullyBlockedRows) {
  std::mt19937 rng(5);
  for (int d : {64, 128, 72}) {
    Problem pr = MakeProblem(rng, 2, 4, 4, 130, 140, d, d);
    pr.mask.resize(size_t(2) * 130 * 140);
    for (size_t i = 0; i < pr.mask.size(); ++i) pr.mask[i] = rng() % 3 != 0;
    for (int j = 0; j < 140; ++j) pr.mask[5 * 140 + j] = 0;  // row 5 of batch 0 fully blocked
    pr.causal = d == 64;
    CheckAgainstReference(pr, "mask");
  }
}

TEST_P(CudaBackendTest, GroupedQueryHeads) {
  std::mt19937 rng(6);
  for (int d : {64, 128, 24}) {
    Problem pr = MakeProblem(rng, 2, 8, 2, 96, 160, d, d);
    CheckAgainstReference(pr, "gqa");
  }
}

// Sliding windows, soft-capping and ALiBi (ScoreMods) at device sizes: prefills on the
// tensor-core kernel's kMods instantiation, decode steps, the plain path, against float64.
TEST_P(CudaBackendTest, WindowsSoftCapAndAlibi) {
  std::mt19937 rng(12);
  Problem prefill = MakeProblem(rng, 2, 8, 2, 300, 1500, 64, 64);
  prefill.causal = true;
  prefill.mods = {.window_left = 255, .window_right = 0, .softcap = 30.0f};
  for (int h = 0; h < 8; ++h) prefill.slopes.push_back(std::ldexp(1.0f, -(h + 1)));
  CheckAgainstReference(prefill, "causal window, soft-cap, ALiBi");
  Problem both = MakeProblem(rng, 1, 4, 4, 200, 200, 128, 128);
  both.mods = {.window_left = 16, .window_right = 16};
  CheckAgainstReference(both, "window on both sides");
  Problem decode = MakeProblem(rng, 3, 8, 1, 1, 2000, 128, 128);
  decode.mods = {.window_left = 511, .window_right = -1, .softcap = 50.0f};
  CheckAgainstReference(decode, "decode in a window");
}

// Decode steps (q_len == 1) take the decode path (flash_decode_kernel.h): GQA groups 8, 2 and
// 1, key counts around its split size, key lengths with 0 (a fully blocked row), D = 80.
TEST_P(CudaBackendTest, DecodeSteps) {
  std::mt19937 rng(11);
  struct Shape {
    int hq, hkv, lk, d;
  };
  for (const Shape& s :
       {Shape{8, 1, 700, 128}, Shape{4, 2, 257, 64}, Shape{16, 2, 300, 64}, Shape{3, 3, 256, 80}}) {
    Problem pr = MakeProblem(rng, 3, s.hq, s.hkv, 1, s.lk, s.d, s.d);
    pr.key_lengths = {s.lk, 0, s.lk / 2 + 1};
    CheckAgainstReference(pr, "decode");
  }
}

// Linear attention's kernel (linear_attention.h) at sizes a device is for: every feature map,
// causal and not, GQA, key lengths; against the float64 reference within the CPU backend's
// bound, and bit for bit the CPU backend's rows with every feature map (the kernel rounds each
// product and sum on its own, in the CPU's order: no fused multiply-add; elu + 1's exp is
// kernels/feature_map.h's on both sides, not the device's expf).
TEST(CudaLinearAttentionTest, MatchesTheReferenceAndTheCpuBackendsBits) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto backend = CudaBackend::Create(CudaBackendOptions{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::mt19937 rng(23);
  for (const FeatureMap map : {FeatureMap::kEluPlusOne, FeatureMap::kRelu, FeatureMap::kIdentity}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "map " << static_cast<int>(map) << " causal " << causal);
      Problem pr = MakeProblem(rng, 2, 8, 2, 700, 1024, 64, 128);
      pr.causal = causal;
      pr.key_lengths = {1024, 513};
      AttentionParams p = pr.Params(false);
      p.kind = AttentionKind::kLinear;
      p.feature_map = map;
      const Reference64 ref = ReferenceAttention64(p);
      double scale = 1;
      for (double x : ref.out) scale = std::max(scale, std::fabs(x));
      ASSERT_TRUE((*backend)->Attend({p}).ok());
      EXPECT_LE(MaxAbsDiff(pr.out, ref.out), 2e-5 * scale);
      const std::vector<float> cpu = LinearRowsOnHost(p);
      EXPECT_EQ(std::memcmp(cpu.data(), pr.out.data(), cpu.size() * sizeof(float)), 0);
    }
  }
}

// An item's output bits do not depend on its batch companions or their order.
TEST_P(CudaBackendTest, BatchInvarianceIsBitwise) {
  std::mt19937 rng(7);
  Problem target = MakeProblem(rng, 2, 4, 2, 300, 257, 128, 128);
  target.causal = true;
  ASSERT_TRUE(backend_->AttendAs({target.Params(false)}, GetParam()).ok());
  const std::vector<float> alone = target.out;
  Problem a = MakeProblem(rng, 3, 4, 2, 1000, 1000, 128, 128);
  a.causal = true;
  Problem b = MakeProblem(rng, 1, 4, 2, 7, 9, 128, 128);
  b.causal = true;
  std::vector<AttentionParams> batch = {a.Params(false), target.Params(false), b.Params(false)};
  ASSERT_TRUE(backend_->AttendAs(batch, GetParam()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), target.out.data(), alone.size() * sizeof(float)), 0);
  batch = {b.Params(false), a.Params(false), target.Params(false)};
  ASSERT_TRUE(backend_->AttendAs(batch, GetParam()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), target.out.data(), alone.size() * sizeof(float)), 0);
}

// Several items of different lengths in one call (packed into one variable-length launch).
TEST_P(CudaBackendTest, VariableLengthBatch) {
  std::mt19937 rng(8);
  std::vector<Problem> problems;
  for (int l : {1, 63, 64, 65, 500, 129}) {
    problems.push_back(MakeProblem(rng, 1 + l % 3, 4, 4, l, l + l % 5, 64, 64));
  }
  std::vector<AttentionParams> batch;
  for (Problem& pr : problems) batch.push_back(pr.Params(false));
  ASSERT_TRUE(backend_->AttendAs(batch, GetParam()).ok());
  for (Problem& pr : problems) {
    const std::vector<float> fast = pr.out;
    const Reference64 ref = ReferenceAttention64(pr.Params(false));
    ASSERT_TRUE(backend_->AttendAs({pr.Params(true)}, GetParam()).ok());
    EXPECT_TRUE(WithinNaiveBound(fast, pr.out, ref.out));
  }
}

TEST_P(CudaBackendTest, MultiHeadSelfAndCross) {
  std::mt19937 rng(9);
  for (bool self : {true, false}) {
    for (int heads : {4, 8}) {  // d_k = 128 and 64
      const MultiHeadWeights m = RandomModule(rng, 512, heads);
      MultiHeadProblem pr = MakeMultiHeadProblem(rng, m, 2, 100, 150, self);
      const Reference64 ref = ReferenceMultiHead64(pr.Params(false));
      ASSERT_TRUE(backend_->MultiHeadAs({pr.Params(false)}, GetParam()).ok());
      const std::vector<float> fast = pr.out;
      ASSERT_TRUE(backend_->MultiHeadAs({pr.Params(true)}, GetParam()).ok());
      EXPECT_TRUE(WithinNaiveBound(fast, pr.out, ref.out)) << "self " << self << " heads " << heads;
    }
  }
}

// Project (module sessions' projections) on the device, TF32 as MultiHead's: within TF32's
// rounding of the operands against the float64 reference (10-bit mantissas: about 2^-10
// relative per product; d_model 512 products of |x| < 1 and weights of scale 1/sqrt(512)), for
// W_qkv and W_o, float32 and bfloat16 inputs; an item's bits do not depend on its companions.
TEST_P(CudaBackendTest, ProjectMatchesTheReferenceWithinTf32) {
  ExpectProjectMatchesReference(*backend_, 512, 8, 300, 5e-3, 10);
}

TEST_P(CudaBackendTest, ReportsMemoryAndDevice) {
  const CudaMemoryFigures f = backend_->MemoryFigures();
  EXPECT_GT(f.device_total_bytes, 0);
  EXPECT_EQ(backend_->name(), "cuda");
  ASSERT_EQ(backend_->devices().size(), 1u);
  EXPECT_FALSE(backend_->PrecisionPolicy().empty());
}

// FLOAT16 / BFLOAT16 inputs go to the device as they are (AttentionParams::input_dtype): they
// must give the bits of the same values given as float32 and computed in that operand type, and
// so meet the same bound against float64.
TEST_P(CudaBackendTest, SixteenBitInputsGiveTheBitsOfTheirFloat32Values) {
  const DType dtype = GetParam() == ComputeType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  std::mt19937 rng(11);
  for (bool blocked : {false, true}) {
    Problem pr = MakeProblem(rng, 2, 4, 2, 70, 90, 64, 64);
    if (blocked) pr.key_lengths = {0, 50};  // needs the value mean
    std::vector<uint16_t> enc[3];
    std::vector<float>* x[3] = {&pr.q, &pr.k, &pr.v};
    for (int n = 0; n < 3; ++n) {
      enc[n].resize(x[n]->size());
      FromFloat32(dtype, x[n]->data(), x[n]->size(), enc[n].data());
      ToFloat32(dtype, enc[n].data(), x[n]->size(), x[n]->data());
    }
    CheckAgainstReference(pr, blocked ? "blocked rows" : "dense");
    ASSERT_TRUE(backend_->AttendAs({pr.Params(false)}, GetParam()).ok());
    const std::vector<float> out32 = pr.out;
    AttentionParams p = pr.Params(false);
    p.input_dtype = dtype;
    p.q.data = enc[0].data();
    p.k.data = enc[1].data();
    p.v.data = enc[2].data();
    ASSERT_TRUE(backend_->Attend({p}).ok());
    EXPECT_EQ(std::memcmp(pr.out.data(), out32.data(), out32.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(OperandTypes, CudaBackendTest,
                         ::testing::Values(ComputeType::kFloat16, ComputeType::kBFloat16),
                         [](const auto& info) { return std::string(ComputeTypeName(info.param)); });

// CudaBackend::PagedAttention (the paged kernel, paged_attention.h) against the float64
// reference on a host pool with scattered pages: float16, bfloat16 and float32 caches, decode
// steps and a prefill chunk, GQA 8/2, page size 16, key counts around the split size. The pool
// elements no sequence owns are NaN, so a read through a wrong page shows. Tolerances: the
// kernel computes in float32 on the cache's own values (ex2.approx: about 2 ulp per weight).
struct PagedPool {
  PagedAttentionParams p;
  std::vector<uint8_t> k, v, q;
  std::vector<int32_t> table, kv_lens, q_lens, q_offsets;
  std::vector<float> out, lse;
};

// Sequences (q_len, kv_len, seed); pages handed out in a shuffled order (layout_seed).
PagedPool MakePagedPool(DType dtype, const std::vector<std::array<int, 3>>& seqs,
                        uint32_t layout_seed) {
  PagedPool pool;
  PagedAttentionParams& p = pool.p;
  p.num_seqs = static_cast<int>(seqs.size());
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = p.v_head_dim = 128;
  p.page_size = 16;
  p.dtype = dtype;
  p.q_dtype = dtype;
  int pages = 0, max_pages = 0;
  for (const auto& s : seqs) {
    const int n = (s[1] + p.page_size - 1) / p.page_size;
    pages += n;
    max_pages = std::max(max_pages, n);
    pool.q_offsets.push_back(p.total_q);
    p.total_q += s[0];
    pool.q_lens.push_back(s[0]);
    pool.kv_lens.push_back(s[1]);
  }
  pages += 5;  // unused
  p.max_pages_per_seq = max_pages;
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 layout(layout_seed);
  std::shuffle(perm.begin(), perm.end(), layout);
  pool.table.assign(size_t(p.num_seqs) * max_pages, -1);
  const size_t es = DTypeSize(dtype);
  pool.k.resize(size_t(pages) * p.k_page_stride() * es);
  pool.v.resize(size_t(pages) * p.v_page_stride() * es);
  pool.q.resize(size_t(p.total_q) * p.num_heads * p.head_dim * es);
  const float nan = std::nanf("");
  for (size_t i = 0; i < pool.k.size() / es; ++i) FromFloat32(dtype, &nan, 1, &pool.k[i * es]);
  for (size_t i = 0; i < pool.v.size() / es; ++i) FromFloat32(dtype, &nan, 1, &pool.v[i * es]);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int s = 0, next = 0; s < p.num_seqs; ++s) {
    std::mt19937 rng(seqs[s][2]);
    for (int i = 0; i * p.page_size < seqs[s][1]; ++i) {
      pool.table[size_t(s) * max_pages + i] = perm[next++];
    }
    for (int i = 0; i < seqs[s][0] * p.num_heads * p.head_dim; ++i) {
      const float x = n(rng);
      FromFloat32(dtype, &x, 1,
                  &pool.q[(size_t(pool.q_offsets[s]) * p.num_heads * p.head_dim + i) * es]);
    }
    for (int j = 0; j < seqs[s][1]; ++j) {
      const int32_t page = pool.table[size_t(s) * max_pages + j / p.page_size];
      for (int g = 0; g < p.num_kv_heads; ++g) {
        for (int d = 0; d < p.head_dim; ++d) {
          const float x = n(rng), y = n(rng);
          FromFloat32(dtype, &x, 1, &pool.k[(p.k_offset(page, g, j % p.page_size) + d) * es]);
          FromFloat32(dtype, &y, 1, &pool.v[(p.v_offset(page, g, j % p.page_size) + d) * es]);
        }
      }
    }
  }
  pool.out.assign(size_t(p.total_q) * p.num_heads * p.v_head_dim, -12345.0f);
  pool.lse.assign(size_t(p.total_q) * p.num_heads, -12345.0f);
  p.k_pages = pool.k.data();
  p.v_pages = pool.v.data();
  p.q = pool.q.data();
  p.page_table = pool.table.data();
  p.kv_lens = pool.kv_lens.data();
  p.q_lens = pool.q_lens.data();
  p.q_offsets = pool.q_offsets.data();
  p.out = pool.out.data();
  p.lse = pool.lse.data();
  p.scale = 1.0f / std::sqrt(128.0f);
  return pool;
}

class CudaPagedAttentionTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto b = CudaBackend::Create(CudaBackendOptions{});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }
  std::unique_ptr<CudaBackend> backend_;
};

TEST_P(CudaPagedAttentionTest, MatchesTheReference) {
  PagedPool pool = MakePagedPool(
      GetParam(), {{1, 1, 1}, {1, 255, 2}, {1, 256, 3}, {1, 257, 4}, {1, 1000, 5}, {13, 300, 6}},
      7);
  ASSERT_TRUE(backend_->PagedAttention(pool.p).ok());
  const Reference64 ref = ReferencePagedAttention64(pool.p);
  EXPECT_LE(MaxAbsDiff(pool.out, ref.out), 1e-4);
  EXPECT_LE(MaxAbsDiff(pool.lse, ref.weights), 1e-4);
}

TEST_P(CudaPagedAttentionTest, BatchInvariantBitwise) {
  PagedPool alone = MakePagedPool(GetParam(), {{1, 700, 42}}, 7);
  PagedPool packed = MakePagedPool(GetParam(), {{4, 40, 1}, {1, 700, 42}, {1, 1300, 2}}, 99);
  ASSERT_TRUE(backend_->PagedAttention(alone.p).ok());
  ASSERT_TRUE(backend_->PagedAttention(packed.p).ok());
  const size_t row = size_t(8) * 128;
  EXPECT_EQ(std::memcmp(alone.out.data(), packed.out.data() + 4 * row, row * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(alone.lse.data(), packed.lse.data() + 4 * 8, 8 * sizeof(float)), 0);
}

// The same pool in a device page store (NewPageStore; every row written by WriteRows, the NaN
// fill included): its pages read back unchanged, and PagedAttention on them gives the bits of
// the call on host pages (the same kernel, the pages read in place instead of staged).
TEST_P(CudaPagedAttentionTest, DeviceStoreMatchesHostPages) {
  PagedPool pool = MakePagedPool(GetParam(), {{1, 1000, 5}, {13, 300, 6}, {1, 257, 4}}, 7);
  PagedAttentionParams& p = pool.p;
  PageStoreShape shape;
  static_cast<PageLayout&>(shape) = p.layout();
  shape.capacity = static_cast<int32_t>(pool.k.size() / shape.k_page_bytes());
  auto store = backend_->NewPageStore(shape);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->on_device());
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);  // addresses only, so far
  // The pool's pages are rows 0..n-1 in order (page_store.h's row numbering).
  std::vector<int64_t> rows(size_t(shape.capacity) * shape.num_kv_heads * shape.page_size);
  std::iota(rows.begin(), rows.end(), 0);
  ASSERT_TRUE((*store)->WriteRows(pool.k.data(), pool.v.data(), rows).ok());
  std::vector<uint8_t> k(shape.k_page_bytes()), v(shape.v_page_bytes());
  for (int32_t page = 0; page < shape.capacity; ++page) {
    ASSERT_TRUE((*store)->ReadPage(page, k.data(), v.data()).ok());
    EXPECT_EQ(std::memcmp(k.data(), pool.k.data() + page * k.size(), k.size()), 0) << page;
    EXPECT_EQ(std::memcmp(v.data(), pool.v.data() + page * v.size(), v.size()), 0) << page;
  }
  ASSERT_TRUE(backend_->PagedAttention(p).ok());
  const std::vector<float> host_out = pool.out, host_lse = pool.lse;
  PagedAttentionParams pd = p;
  pd.store = store->get();
  pd.k_pages = (*store)->k_base();
  pd.v_pages = (*store)->v_base();
  std::fill(pool.out.begin(), pool.out.end(), -12345.0f);
  std::fill(pool.lse.begin(), pool.lse.end(), -12345.0f);
  ASSERT_TRUE(backend_->PagedAttention(pd).ok());
  EXPECT_EQ(std::memcmp(pool.out.data(), host_out.data(), host_out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pool.lse.data(), host_lse.data(), host_lse.size() * sizeof(float)), 0);
  // Every page written: the K and V ranges mapped whole, each rounded up to the device's
  // granularity (2 MiB on current GPUs; at most 32 MiB allowed here).
  const int64_t bytes = int64_t{shape.capacity} * (shape.k_page_bytes() + shape.v_page_bytes());
  EXPECT_GE(backend_->MemoryFigures().session_pages_bytes, bytes);
  EXPECT_LE(backend_->MemoryFigures().session_pages_bytes, bytes + 2 * (int64_t{32} << 20));
  store->reset();
  EXPECT_EQ(backend_->MemoryFigures().session_pages_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(CacheTypes, CudaPagedAttentionTest,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Runs everywhere: without a device the factory must say UNAVAILABLE (the server then falls
// back to the CPU), and CudaDeviceCount must answer 0 rather than fail.
// The launch groups of AttendAs (no device needed): a large batch is chunked to the pinned
// staging limit instead of failing whole.
AttentionParams Shape(int batch, int heads, int q_len, int kv_len) {
  AttentionParams p;
  p.batch = batch;
  p.num_heads = p.num_kv_heads = heads;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.head_dim = p.v_head_dim = 64;
  return p;
}

TEST(PlanAttentionGroupsTest, ChunksToThePinnedLimit) {
  // One item: 4 bytes x (1024 x 8 x 128 + 1024 x 8 x 192) + 12 = 10485772 bytes of staging.
  const std::vector<AttentionParams> five(5, Shape(1, 8, 1024, 1024));
  using Groups = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(PlanAttentionGroups(five, int64_t{1} << 30), (Groups{{0, 5}}));
  // Room for two items (and the layout's slack) per launch.
  EXPECT_EQ(PlanAttentionGroups(five, 2 * 10485772 + 4096), (Groups{{0, 2}, {2, 4}, {4, 5}}));
  EXPECT_EQ(PlanAttentionGroups(five, 2 * 10485772 + 4095),
            (Groups{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
  // An item over the limit alone forms its own group (RunAttentionGroup then reports it).
  EXPECT_EQ(PlanAttentionGroups(five, 1000), (Groups{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
}

TEST(PlanAttentionGroupsTest, NeverPacksIncompatibleItems) {
  std::vector<AttentionParams> items = {Shape(1, 8, 16, 64), Shape(2, 8, 16, 64),
                                        Shape(1, 4, 16, 64), Shape(1, 4, 1, 64),
                                        Shape(3, 4, 1, 64),  Shape(1, 4, 2, 64)};
  using Groups = std::vector<std::pair<size_t, size_t>>;
  // Heads differ between 1 and 2; q_len == 1 (decode steps) is packed only with q_len == 1.
  EXPECT_EQ(PlanAttentionGroups(items, int64_t{1} << 30), (Groups{{0, 2}, {2, 3}, {3, 5}, {5, 6}}));
}

// The dispatch (flash_fwd_dispatch.cc) needs no device: it reads shapes, strides and the
// pointers' alignment.
FlashFwdParams DispatchParams(int d, int dv) {
  alignas(16) static char buffer[16];
  FlashFwdParams p;
  p.q = p.k = p.v = buffer;
  p.o = reinterpret_cast<float*>(buffer);
  p.num_heads = p.num_kv_heads = 4;
  p.head_dim = d;
  p.v_head_dim = dv;
  p.q_row_stride = p.k_row_stride = 4 * d;
  p.q_head_stride = p.k_head_stride = d;
  p.v_row_stride = p.o_row_stride = 4 * dv;
  p.v_head_stride = p.o_head_stride = dv;
  return p;
}

TEST(FlashDispatchTest, TensorCoresForMultiplesOfEightUpTo256) {
  const struct {
    int d, dv, width;
  } cases[] = {{8, 8, 32},      {24, 32, 32},    {32, 32, 32},   {40, 40, 64},
               {64, 64, 64},    {64, 32, 64},    {80, 80, 96},   {96, 72, 96},
               {104, 104, 128}, {128, 128, 128}, {136, 64, 160}, {176, 192, 192},
               {200, 200, 256}, {224, 224, 256}, {8, 256, 256},  {256, 256, 256}};
  for (const auto& c : cases) {
    const FlashFwdParams p = DispatchParams(c.d, c.dv);
    EXPECT_EQ(SelectFlashPath(p), FlashPath::kTensorCore) << c.d << " " << c.dv;
    EXPECT_EQ(TensorCoreHeadDim(p), c.width) << c.d << " " << c.dv;
  }
}

TEST(FlashDispatchTest, GenericOrNaiveOtherwise) {
  // Not a multiple of 8, above 256, or an unaligned layout: the generic kernel while
  // v_head_dim <= 256, else the cuBLAS path.
  for (auto [d, dv] : {std::pair{36, 36}, {100, 100}, {64, 30}, {264, 64}, {4, 4}}) {
    const FlashFwdParams p = DispatchParams(d, dv);
    EXPECT_EQ(SelectFlashPath(p), FlashPath::kGeneric) << d << " " << dv;
    EXPECT_EQ(TensorCoreHeadDim(p), 0) << d << " " << dv;
  }
  EXPECT_EQ(SelectFlashPath(DispatchParams(64, 264)), FlashPath::kUnsupported);
  FlashFwdParams odd_stride = DispatchParams(64, 64);
  odd_stride.q_head_stride = 68;
  EXPECT_EQ(SelectFlashPath(odd_stride), FlashPath::kGeneric);
  FlashFwdParams unaligned = DispatchParams(64, 64);
  unaligned.k = static_cast<const char*>(unaligned.k) + 8;
  EXPECT_EQ(SelectFlashPath(unaligned), FlashPath::kGeneric);
}

// A window, a soft-cap or ALiBi keeps a launch on the tensor-core kernel, whose kMods
// instantiation FlashForward then runs (has_score_mods); a layout the tensor-core kernel cannot
// take still goes to the generic kernel with them.
TEST(FlashDispatchTest, ScoreModsKeepTheTensorCoreKernel) {
  static const float slopes[1] = {0.5f};
  for (int which = 0; which < 4; ++which) {
    FlashFwdParams p = DispatchParams(64, 64);
    ASSERT_FALSE(p.has_score_mods());
    if (which == 0) p.window.left = 8;
    if (which == 1) p.window.right = 0;
    if (which == 2) p.softcap = 30.0f;
    if (which == 3) p.alibi_slopes = slopes;
    EXPECT_TRUE(p.has_score_mods()) << which;
    EXPECT_EQ(SelectFlashPath(p), FlashPath::kTensorCore) << which;
    p.q_row_stride = 7;
    EXPECT_EQ(SelectFlashPath(p), FlashPath::kGeneric) << which;
  }
}

TEST(FlashDispatchTest, MaskLayoutsTheTensorCoreKernelCopies) {
  // Its cp.async word copies of the mask tile take a 4-byte aligned mask whose rows are keys
  // (column stride 1) or one byte broadcast over them (0): what kernels/mask.h produces.
  alignas(4) static const uint8_t mask[8] = {};
  FlashFwdParams p = DispatchParams(64, 64);
  p.mask = mask;
  for (const int64_t col_stride : {0, 1}) {
    p.mask_col_stride = col_stride;
    EXPECT_EQ(SelectFlashPath(p), FlashPath::kTensorCore) << col_stride;
  }
  p.mask_col_stride = 2;
  EXPECT_EQ(SelectFlashPath(p), FlashPath::kGeneric);
  p.mask_col_stride = 1;
  p.mask = mask + 1;
  EXPECT_EQ(SelectFlashPath(p), FlashPath::kGeneric);
}

TEST(CudaBackendCreateTest, UnavailableWithoutDevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a device is present";
  auto b = CreateCudaBackend(CudaBackendOptions{});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
  EXPECT_TRUE(CudaDeviceNames().empty());
}

TEST(CudaBackendCreateTest, RejectsBadOptions) {
  CudaBackendOptions o;
  o.num_streams = 0;
  auto b = CudaBackend::Create(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
}

}  // namespace
}  // namespace attnserve::kernels::cuda
