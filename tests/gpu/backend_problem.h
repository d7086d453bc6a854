// Dense attention problems for the CUDA backend's tests (cuda_backend_test.cc on a GPU,
// tests/cuda_emu/backend_emu_test.cc on the host emulation): random inputs, the AttentionParams
// that describe them, and the error against the float64 reference.
#ifndef ATTNSERVE_TESTS_GPU_BACKEND_PROBLEM_H_
#define ATTNSERVE_TESTS_GPU_BACKEND_PROBLEM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "kernels/reference.h"

namespace attnserve::kernels::cuda {

inline constexpr double kEps = 1e-5;

// A dense problem [B, H, L, D] with its buffers.
struct Problem {
  int batch = 1, hq = 1, hkv = 1, lq = 1, lk = 1, d = 64, dv = 64;
  bool causal = false;
  std::vector<float> q, k, v, out, weights;
  std::vector<uint8_t> mask;  // [B, 1, Lq, Lk] broadcast over heads when non-empty
  std::vector<int32_t> key_lengths;
  ScoreMods mods;             // alibi_slopes from `slopes` when that is non-empty
  std::vector<float> slopes;  // [hq]

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
    p.mods = mods;
    p.mods.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    return p;
  }
};

inline Problem MakeProblem(std::mt19937& rng, int batch, int hq, int hkv, int lq, int lk, int d,
                           int dv) {
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

// A module of random weights (normal, standard deviation 1/sqrt(d_model)).
inline MultiHeadWeights RandomModule(std::mt19937& rng, int d_model, int heads) {
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

// A multi-head problem over `module`: inputs [B, L, d_model] (self-attention: key and value
// are the query), causal when self-attention, and its buffers.
struct MultiHeadProblem {
  const MultiHeadWeights* module = nullptr;
  int batch = 1, lq = 1, lk = 1;
  bool self = true;
  std::vector<float> xq, xk, xv, out, weights;
  std::vector<uint8_t> mask;  // [B, 1, Lq, Lk] broadcast over heads when non-empty
  std::vector<int32_t> key_lengths;

  MultiHeadParams Params(bool with_weights) {
    MultiHeadParams p;
    p.module = module;
    p.batch = batch;
    p.q_len = lq;
    p.kv_len = lk;
    p.query = xq.data();
    p.key = self ? xq.data() : xk.data();
    p.value = self ? xq.data() : xv.data();
    p.self_attention = self;
    p.causal = self;
    out.assign(xq.size(), std::nanf(""));  // poison: every element written
    p.out = out.data();
    if (with_weights) {
      weights.assign(size_t(batch) * module->num_heads * lq * lk, std::nanf(""));
      p.weights = weights.data();
    }
    if (!mask.empty()) p.mask = {mask.data(), int64_t{lq} * lk, 0, lk, 1};
    p.key_lengths = key_lengths.empty() ? nullptr : key_lengths.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(module->head_dim()));
    return p;
  }
};

inline MultiHeadProblem MakeMultiHeadProblem(std::mt19937& rng, const MultiHeadWeights& m,
                                             int batch, int lq, int lk, bool self) {
  MultiHeadProblem pr;
  pr.module = &m;
  pr.batch = batch;
  pr.lq = lq;
  pr.lk = self ? lq : lk;
  pr.self = self;
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, size_t count) {
    x.resize(count);
    for (float& e : x) e = n(rng);
  };
  fill(pr.xq, size_t(batch) * lq * m.d_model);
  if (!self) {
    fill(pr.xk, size_t(batch) * lk * m.d_model);
    fill(pr.xv, size_t(batch) * lk * m.d_model);
  }
  return pr;
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& ref) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(static_cast<double>(a[i]) - ref[i]);
    if (std::isnan(e)) return INFINITY;
    m = std::max(m, e);
  }
  return m;
}

// Backend::Project (module sessions' projections) on `backend` against the float64 reference:
// W_qkv and W_o of a random module over `rows` rows of float32 and of bfloat16 inputs, within
// `bound`; and an item's bits alone and beside another item are the same.
inline void ExpectProjectMatchesReference(Backend& backend, int d_model, int heads, int64_t rows,
                                          double bound, uint32_t seed) {
  std::mt19937 rng(seed);
  const MultiHeadWeights m = RandomModule(rng, d_model, heads);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(rows * d_model);
  for (float& e : x) e = dist(rng);
  std::vector<uint16_t> x16(x.size());
  FromFloat32(DType::kBFloat16, x.data(), x.size(), x16.data());
  using Weights = ProjectionParams::Weights;
  for (const Weights which : {Weights::kQkv, Weights::kOut}) {
    for (const DType type : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message()
                   << (which == Weights::kQkv ? "W_qkv " : "W_o ") << DTypeName(type));
      auto params = [&](std::vector<float>* y, int64_t n_rows) {
        ProjectionParams p{.module = &m, .weights = which, .rows = n_rows};
        p.x = type == DType::kFloat32 ? static_cast<const void*>(x.data()) : x16.data();
        p.x_type = type;
        y->assign(n_rows * p.n(), NAN);
        p.y = y->data();
        return p;
      };
      std::vector<float> want, got, alone, other;
      ReferenceBackend reference;
      ASSERT_TRUE(reference.Project({params(&want, rows)}).ok());
      ASSERT_TRUE(backend.Project({params(&got, rows), params(&other, 5)}).ok());
      EXPECT_LE(MaxAbsDiff(got, std::vector<double>(want.begin(), want.end())), bound);
      ASSERT_TRUE(backend.Project({params(&alone, rows)}).ok());
      EXPECT_EQ(std::memcmp(alone.data(), got.data(), got.size() * sizeof(float)), 0);
    }
  }
}

// The bound the fused paths are held to: max|fast - ref| <= 2 max|naive - ref| + kEps, the naive
// path being the backend's own weights path in the same operand type.
inline ::testing::AssertionResult WithinNaiveBound(const std::vector<float>& fast,
                                                   const std::vector<float>& naive,
                                                   const std::vector<double>& ref) {
  const double err_fast = MaxAbsDiff(fast, ref);
  const double err_naive = MaxAbsDiff(naive, ref);
  if (err_fast <= 2 * err_naive + kEps) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "fast " << err_fast << " naive " << err_naive;
}

// Largest error of the weights path's weights against float64: softmax outputs in float32 of
// scores from 16-bit operands.
inline double WeightsTolerance(ComputeType type) {
  return type == ComputeType::kFloat16 ? 2e-2 : 6e-2;
}

// `pr` through the backend's fused path, then its weights path (both in `type`), against
// float64: the fused output within WithinNaiveBound, the weights within WeightsTolerance. pr.out
// and pr.weights are left as the weights path wrote them.
inline void CheckAgainstReference(CudaBackend& backend, ComputeType type, Problem& pr) {
  const Reference64 ref = ReferenceAttention64(pr.Params(false));
  ASSERT_TRUE(backend.AttendAs({pr.Params(false)}, type).ok());
  const std::vector<float> fast = pr.out;
  ASSERT_TRUE(backend.AttendAs({pr.Params(true)}, type).ok());
  EXPECT_TRUE(WithinNaiveBound(fast, pr.out, ref.out));
  EXPECT_LE(MaxAbsDiff(pr.weights, ref.weights), WeightsTolerance(type));
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_TESTS_GPU_BACKEND_PROBLEM_H_
