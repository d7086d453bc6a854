// Linear attention's kernel (linear_attention.cu's LinearAttentionForward) on the host emulation,
// through the file's own launch code (host_cu.sh): against the float64 reference on every option
// it takes (the three feature maps, causal with more and fewer queries than keys, GQA, key
// lengths with a sequence of none, Dv over several 32-column tiles and not a multiple of 32, head
// dims up to the largest), bit for bit against the CPU backend's recurrence (LinearRowsOnHost)
// with every feature map (elu + 1's exp is kernels/feature_map.h's on both), and batch invariance.
// The mutants of CMakeLists.txt (make_mutant.sh) break it one way each; these tests must catch
// every one.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/reference.h"
#include "tests/gpu/linear_rows.h"

namespace attnserve::kernels::cuda {
namespace {

struct Case {
  std::string name;
  int batch, hq, hkv, lq, lk, d, dv;
  bool causal;
  FeatureMap map;
  std::vector<int32_t> key_lengths;  // empty: none
};

// Packed [batch, heads, rows, dim] float32 inputs; the emulated device reads host memory.
struct Problem {
  Case c;
  std::vector<float> q, k, v, out;

  explicit Problem(const Case& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t count) {
      x.resize(count);
      for (float& e : x) e = n(rng);
    };
    fill(q, size_t(c.batch) * c.hq * c.lq * c.d);
    fill(k, size_t(c.batch) * c.hkv * c.lk * c.d);
    fill(v, size_t(c.batch) * c.hkv * c.lk * c.dv);
  }

  AttentionParams Params() {
    AttentionParams p;
    p.batch = c.batch;
    p.num_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.q_len = c.lq;
    p.kv_len = c.lk;
    p.head_dim = c.d;
    p.v_head_dim = c.dv;
    p.q = {q.data(), int64_t{c.hq} * c.lq * c.d, int64_t{c.lq} * c.d, c.d};
    p.k = {k.data(), int64_t{c.hkv} * c.lk * c.d, int64_t{c.lk} * c.d, c.d};
    p.v = {v.data(), int64_t{c.hkv} * c.lk * c.dv, int64_t{c.lk} * c.dv, c.dv};
    out.assign(size_t(c.batch) * c.hq * c.lq * c.dv, std::nanf(""));
    p.out = {out.data(), int64_t{c.hq} * c.lq * c.dv, int64_t{c.lq} * c.dv, c.dv};
    p.causal = c.causal;
    p.key_lengths = c.key_lengths.empty() ? nullptr : c.key_lengths.data();
    p.kind = AttentionKind::kLinear;
    p.feature_map = c.map;
    return p;
  }

  // LinearAttentionForward on the problem; out poisoned first.
  std::string Run() {
    const AttentionParams a = Params();
    LinearAttentionParams p = LinearShapeOf(a);
    p.q = {q.data(), a.q.batch_stride, a.q.head_stride, a.q.row_stride};
    p.k = {k.data(), a.k.batch_stride, a.k.head_stride, a.k.row_stride};
    p.v = {v.data(), a.v.batch_stride, a.v.head_stride, a.v.row_stride};
    p.o = out.data();
    p.o_batch_stride = a.out.batch_stride;
    p.o_head_stride = a.out.head_stride;
    p.o_row_stride = a.out.row_stride;
    p.key_lengths = a.key_lengths;
    return LinearAttentionForward(p, nullptr).error;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  return {
      {"elu_causal_gqa_lengths", 2, 4, 2, 9, 23, 16, 40, true, FeatureMap::kEluPlusOne, {23, 0}},
      {"elu_full", 1, 2, 2, 7, 5, 24, 8, false, FeatureMap::kEluPlusOne, {}},
      {"relu_causal_more_queries", 1, 2, 1, 12, 7, 8, 33, true, FeatureMap::kRelu, {}},
      {"identity_full", 2, 2, 2, 5, 11, 8, 8, false, FeatureMap::kIdentity, {}},
      {"identity_causal_lengths", 2, 1, 1, 6, 6, 4, 64, true, FeatureMap::kIdentity, {3, 6}},
      {"relu_widest", 1, 1, 1, 3, 4, kLinearMaxHeadDim, 72, true, FeatureMap::kRelu, {}},
  };
}

class LinearAttentionKernelEmuTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearAttentionKernelEmuTest, MatchesTheReferenceAndTheCpuBackendsBits) {
  Problem pr(GetParam(), 7);
  const Reference64 ref = ReferenceAttention64(pr.Params());
  const std::vector<float> cpu = LinearRowsOnHost(pr.Params());
  double scale = 1;  // an identity map's small normalisers make large outputs
  for (double x : ref.out) scale = std::max(scale, std::fabs(x));
  ASSERT_EQ(pr.Run(), "");
  double worst = 0;
  for (size_t n = 0; n < ref.out.size(); ++n) {
    worst = std::max(worst, std::fabs(pr.out[n] - ref.out[n]));
  }
  EXPECT_LE(worst, 2e-5 * scale);  // the CPU backend's bound (linear_attention_test.cc)
  // The same roundings in the same order, the same exp.
  EXPECT_EQ(std::memcmp(cpu.data(), pr.out.data(), cpu.size() * sizeof(float)), 0);
  // A sequence with no key (key length 0): every row exactly zero, never NaN.
  const Case& c = GetParam();
  for (int b = 0; b < c.batch; ++b) {
    if (c.key_lengths.empty() || c.key_lengths[b] != 0) continue;
    const size_t per_item = size_t(c.hq) * c.lq * c.dv;
    for (size_t n = b * per_item; n < (b + 1) * per_item; ++n) ASSERT_EQ(pr.out[n], 0.0f) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearAttentionKernelEmuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// A batch item's rows have the same bits computed alone as beside another item.
TEST(LinearAttentionKernelBatchEmuTest, RowsAreBatchInvariant) {
  for (const Case& two : Cases()) {
    if (two.batch < 2) continue;
    SCOPED_TRACE(two.name);
    Problem both(two, 11);
    ASSERT_EQ(both.Run(), "");
    Case one = two;
    one.batch = 1;
    if (!one.key_lengths.empty()) one.key_lengths.resize(1);
    Problem alone(one, 0);
    alone.q.assign(both.q.begin(), both.q.begin() + alone.q.size());
    alone.k.assign(both.k.begin(), both.k.begin() + alone.k.size());
    alone.v.assign(both.v.begin(), both.v.begin() + alone.v.size());
    ASSERT_EQ(alone.Run(), "");
    EXPECT_EQ(std::memcmp(alone.out.data(), both.out.data(), alone.out.size() * sizeof(float)), 0);
  }
}

// Shapes the kernel does not take are refused by name, nothing launched.
TEST(LinearAttentionKernelLimitsEmuTest, RefusesHeadDimsPastTheLargest) {
  Problem pr({"too_wide", 1, 1, 1, 2, 2, kLinearMaxHeadDim + 8, 8, false, FeatureMap::kRelu, {}},
             3);
  EXPECT_NE(pr.Run().find("linear attention"), std::string::npos);
}

}  // namespace
}  // namespace attnserve::kernels::cuda
