// CudaBackend (kernels/cuda/cuda_backend.h) against the float64 reference. Every check bounds
// the error of the fused path relative to a plain cuBLAS attention in the same operand type
// (the backend's weights path): max|fast - ref| <= 2 * max|naive - ref| + 1e-5 (FlashAttention's
// test rule). Every test skips cleanly when no CUDA device is present (CI), except the one that
// checks exactly that case.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/reference.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr double kEps = 1e-5;

// A dense problem [B, H, L, D] with its buffers.
struct Problem {
  int batch = 1, hq = 1, hkv = 1, lq = 1, lk = 1, d = 64, dv = 64;
  bool causal = false;
  std::vector<float> q, k, v, out, weights;
  std::vector<uint8_t> mask;  // [B, 1, Lq, Lk] broadcast over heads when non-empty
  std::vector<int32_t> key_lengths;

  AttentionParams Params(bool with_weights) {
    AttentionParams p;
    p.batch = batch;
    p.num_heads = hq;
    p.num_kv_heads = hkv;
    p.q_len = lq;
    p.kv_len = lk;
    p.head_dim = d;
    p.v_head_dim = dv;
    p.q = {q.data(), int64_t{hq} * lq * d, int64_t{lq} * d, d};
    p.k = {k.data(), int64_t{hkv} * lk * d, int64_t{lk} * d, d};
    p.v = {v.data(), int64_t{hkv} * lk * dv, int64_t{lk} * dv, dv};
    out.assign(size_t(batch) * hq * lq * dv, std::nanf(""));  // poison: every element written
    p.out = {out.data(), int64_t{hq} * lq * dv, int64_t{lq} * dv, dv};
    if (with_weights) {
      weights.assign(size_t(batch) * hq * lq * lk, std::nanf(""));
      p.weights = weights.data();
    }
    if (!mask.empty()) p.mask = {mask.data(), int64_t{lq} * lk, 0, lk, 1};
    p.causal = causal;
    p.key_lengths = key_lengths.empty() ? nullptr : key_lengths.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    return p;
  }
};

Problem MakeProblem(std::mt19937& rng, int batch, int hq, int hkv, int lq, int lk, int d, int dv) {
  Problem pr;
  pr.batch = batch;
  pr.hq = hq;
  pr.hkv = hkv;
  pr.lq = lq;
  pr.lk = lk;
  pr.d = d;
  pr.dv = dv;
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, size_t count) {
    x.resize(count);
    for (float& e : x) e = n(rng);
  };
  fill(pr.q, size_t(batch) * hq * lq * d);
  fill(pr.k, size_t(batch) * hkv * lk * d);
  fill(pr.v, size_t(batch) * hkv * lk * dv);
  return pr;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& ref) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(static_cast<double>(a[i]) - ref[i]);
    if (std::isnan(e)) return INFINITY;
    m = std::max(m, e);
  }
  return m;
}

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
    const Reference64 ref = ReferenceAttention64(pr.Params(false));
    ASSERT_TRUE(backend_->AttendAs({pr.Params(false)}, GetParam()).ok());
    const std::vector<float> fast = pr.out;
    AttentionParams naive_params = pr.Params(true);
    ASSERT_TRUE(backend_->AttendAs({naive_params}, GetParam()).ok());
    const double err_fast = MaxAbsDiff(fast, ref.out);
    const double err_naive = MaxAbsDiff(pr.out, ref.out);
    const Reference64 ref_w = ReferenceAttention64(pr.Params(false));
    const double err_weights = MaxAbsDiff(pr.weights, ref_w.weights);
    EXPECT_LE(err_fast, 2 * err_naive + kEps) << "fast " << err_fast << " naive " << err_naive;
    // The weights are softmax outputs in float32 of scores from 16-bit operands.
    EXPECT_LE(err_weights, GetParam() == ComputeType::kFloat16 ? 2e-2 : 6e-2) << err_weights;
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

TEST_P(CudaBackendTest, GenericHeadDims) {
  std::mt19937 rng(2);
  for (auto [d, dv] : {std::pair{32, 32}, {80, 80}, {64, 32}, {256, 256}, {40, 300}}) {
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
    EXPECT_LE(MaxAbsDiff(fast, ref.out), 2 * MaxAbsDiff(pr.out, ref.out) + kEps);
  }
}

MultiHeadWeights RandomModule(std::mt19937& rng, int d_model, int heads) {
  MultiHeadWeights m;
  m.d_model = d_model;
  m.num_heads = heads;
  std::normal_distribution<float> n(0.0f, 1.0f / std::sqrt(static_cast<float>(d_model)));
  auto fill = [&](std::vector<float>& x, size_t count) {
    x.resize(count);
    for (float& e : x) e = n(rng);
  };
  fill(m.w_qkv, size_t(3) * d_model * d_model);
  fill(m.b_qkv, size_t(3) * d_model);
  fill(m.w_o, size_t(d_model) * d_model);
  fill(m.b_o, size_t(d_model));
  return m;
}

TEST_P(CudaBackendTest, MultiHeadSelfAndCross) {
  std::mt19937 rng(9);
  for (bool self : {true, false}) {
    for (int heads : {4, 8}) {  // d_k = 128 and 64
      const int dm = 512, batch = 2, lq = 100, lk = self ? 100 : 150;
      const MultiHeadWeights m = RandomModule(rng, dm, heads);
      std::normal_distribution<float> n(0.0f, 1.0f);
      std::vector<float> xq(size_t(batch) * lq * dm), xk(size_t(batch) * lk * dm),
          xv(size_t(batch) * lk * dm);
      for (float& e : xq) e = n(rng);
      for (float& e : xk) e = n(rng);
      for (float& e : xv) e = n(rng);
      std::vector<float> out_fast(xq.size()), out_naive(xq.size()),
          weights(size_t(batch) * heads * lq * lk);
      MultiHeadParams p;
      p.module = &m;
      p.batch = batch;
      p.q_len = lq;
      p.kv_len = lk;
      p.query = xq.data();
      p.key = self ? xq.data() : xk.data();
      p.value = self ? xq.data() : xv.data();
      p.self_attention = self;
      p.causal = self;
      p.scale = 1.0f / std::sqrt(static_cast<float>(dm / heads));
      p.out = out_fast.data();
      const Reference64 ref = ReferenceMultiHead64(p);
      ASSERT_TRUE(backend_->MultiHeadAs({p}, GetParam()).ok());
      p.out = out_naive.data();
      p.weights = weights.data();
      ASSERT_TRUE(backend_->MultiHeadAs({p}, GetParam()).ok());
      const double err_fast = MaxAbsDiff(out_fast, ref.out);
      const double err_naive = MaxAbsDiff(out_naive, ref.out);
      EXPECT_LE(err_fast, 2 * err_naive + kEps)
          << "self " << self << " heads " << heads << ": " << err_fast << " vs " << err_naive;
    }
  }
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

// Runs everywhere: without a device the factory must say UNAVAILABLE (the server then falls
// back to the CPU), and CudaDeviceCount must answer 0 rather than fail.
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
