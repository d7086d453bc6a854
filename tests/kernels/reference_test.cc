// The reference path against the PyTorch seed vectors and against cases small enough to work
// out by hand.
#include "kernels/reference.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/mask.h"
#include "kernels/multi_head.h"
#include "tests/testing/seed_vectors.h"

namespace attnserve::kernels {
namespace {

using testing::LoadSeedCase;
using testing::MaxAbsDiff;

class SeedVectorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SeedVectorTest, ReferenceMultiHeadReproducesPyTorch) {
  auto c = LoadSeedCase(GetParam());
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> out(c->expected_output.size()), weights(c->expected_weights.size());
  ReferenceMultiHead(testing::SeedParams(*c, out.data(), weights.data()));
  EXPECT_LE(MaxAbsDiff(out, c->expected_output), 1e-5);
  EXPECT_LE(MaxAbsDiff(weights, c->expected_weights), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllCases, SeedVectorTest, ::testing::ValuesIn(testing::SeedCaseNames()));

TEST(SeedVectorTest, BlockedRowsCaseHasAFullyBlockedRowThatAttendsUniformly) {
  auto c = LoadSeedCase("blocked_rows");
  ASSERT_TRUE(c.ok());
  std::vector<float> out(c->expected_output.size()), weights(c->expected_weights.size());
  ReferenceMultiHead(testing::SeedParams(*c, out.data(), weights.data()));
  for (int j = 0; j < c->kv_len; ++j) {
    EXPECT_NEAR(weights[j], 1.0 / c->kv_len, 1e-7);  // batch 0, head 0, query row 0
  }
}

// A dense problem over owned buffers, q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D].
struct Problem {
  std::vector<float> q, k, v, out, weights;
  AttentionParams p;
  Problem(int b, int hq, int hkv, int lq, int lk, int d) {
    auto fill = [](std::vector<float>* x, size_t n, float seed) {
      x->resize(n);
      for (size_t i = 0; i < n; ++i) (*x)[i] = std::sin(seed + 0.7f * static_cast<float>(i));
    };
    fill(&q, size_t(b) * hq * lq * d, 0.1f);
    fill(&k, size_t(b) * hkv * lk * d, 1.3f);
    fill(&v, size_t(b) * hkv * lk * d, 2.9f);
    out.resize(size_t(b) * hq * lq * d);
    weights.resize(size_t(b) * hq * lq * lk);
    p.batch = b;
    p.num_heads = hq;
    p.num_kv_heads = hkv;
    p.q_len = lq;
    p.kv_len = lk;
    p.head_dim = p.v_head_dim = d;
    p.q = {q.data(), int64_t(hq) * lq * d, int64_t(lq) * d, d};
    p.k = {k.data(), int64_t(hkv) * lk * d, int64_t(lk) * d, d};
    p.v = {v.data(), int64_t(hkv) * lk * d, int64_t(lk) * d, d};
    p.out = {out.data(), int64_t(hq) * lq * d, int64_t(lq) * d, d};
    p.weights = weights.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  }
  const float* v_row(int b, int h, int j) const { return p.v.row<float>(b, h, j); }
};

TEST(ReferenceAttentionTest, SingleKeyReturnsItsValue) {
  Problem pr(1, 1, 1, 3, 1, 4);
  ReferenceAttention(pr.p);
  for (int i = 0; i < 3; ++i) {
    for (int d = 0; d < 4; ++d) EXPECT_FLOAT_EQ(pr.out[i * 4 + d], pr.v[d]);
    EXPECT_EQ(pr.weights[i], 1.0f);
  }
}

TEST(ReferenceAttentionTest, SoftmaxMatchesHandComputation) {
  Problem pr(1, 1, 1, 1, 2, 1);
  pr.q = {2.0f};
  pr.k = {1.0f, -1.0f};
  pr.v = {10.0f, 20.0f};
  pr.p.scale = 0.5f;
  ReferenceAttention(pr.p);
  // scores 1 and -1: weights e/(e + 1/e) and 1/e/(e + 1/e).
  const double w0 = std::exp(1.0) / (std::exp(1.0) + std::exp(-1.0));
  EXPECT_NEAR(pr.weights[0], w0, 1e-7);
  EXPECT_NEAR(pr.weights[1], 1 - w0, 1e-7);
  EXPECT_NEAR(pr.out[0], 10 * w0 + 20 * (1 - w0), 1e-5);
}

TEST(ReferenceAttentionTest, FullyBlockedRowAttendsUniformlyToAllKeys) {
  Problem pr(1, 1, 1, 2, 3, 2);
  std::vector<uint8_t> mask = {0, 0, 0, 1, 0, 1};  // row 0 fully blocked
  pr.p.mask = BroadcastMask(mask.data(), {2, 3}, 1, 1, 2, 3).value();
  ReferenceAttention(pr.p);
  for (int d = 0; d < 2; ++d) {
    const double mean = (pr.v[d] + pr.v[2 + d] + pr.v[4 + d]) / 3.0;
    EXPECT_NEAR(pr.out[d], mean, 1e-6);
  }
  EXPECT_EQ(pr.weights[3 + 1], 0.0f);  // row 1, blocked key 1: exactly 0
  EXPECT_NEAR(pr.weights[3 + 0] + pr.weights[3 + 2], 1.0, 1e-7);
}

TEST(ReferenceAttentionTest, CausalIsBottomRightAligned) {
  // Lq 2, Lk 4: query 0 may see keys 0..2, query 1 keys 0..3.
  Problem pr(1, 1, 1, 2, 4, 3);
  pr.p.causal = true;
  ReferenceAttention(pr.p);
  EXPECT_EQ(pr.weights[3], 0.0f);
  EXPECT_GT(pr.weights[2], 0.0f);
  EXPECT_GT(pr.weights[4 + 3], 0.0f);
  // Lq 3 > Lk 2: query 0 sees no key (j <= 0 + 2 - 3 = -1) and attends uniformly.
  Problem wide(1, 1, 1, 3, 2, 3);
  wide.p.causal = true;
  ReferenceAttention(wide.p);
  EXPECT_FLOAT_EQ(wide.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(wide.weights[1], 0.5f);
  EXPECT_EQ(wide.weights[2 + 1], 0.0f);  // query 1 sees key 0 only
  EXPECT_FLOAT_EQ(wide.weights[2 + 0], 1.0f);
}

TEST(ReferenceAttentionTest, KeyLengthsBlockTrailingKeysAndZeroLengthIsUniform) {
  Problem pr(2, 1, 1, 1, 3, 2);
  std::vector<int32_t> lengths = {2, 0};
  pr.p.key_lengths = lengths.data();
  ReferenceAttention(pr.p);
  EXPECT_EQ(pr.weights[2], 0.0f);
  EXPECT_NEAR(pr.weights[0] + pr.weights[1], 1.0, 1e-7);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(pr.weights[3 + j], 1.0f / 3);
}

TEST(ReferenceAttentionTest, GroupedQueryHeadsShareKeyValueHeads) {
  // 4 query heads over 2 kv heads equals 4 heads over the kv heads repeated [0, 0, 1, 1].
  Problem gqa(1, 4, 2, 3, 5, 4);
  ReferenceAttention(gqa.p);
  Problem mha(1, 4, 4, 3, 5, 4);
  mha.q = gqa.q;
  for (int h = 0; h < 4; ++h) {
    for (int n = 0; n < 5 * 4; ++n) {
      mha.k[h * 20 + n] = gqa.k[(h / 2) * 20 + n];
      mha.v[h * 20 + n] = gqa.v[(h / 2) * 20 + n];
    }
  }
  ReferenceAttention(mha.p);
  EXPECT_EQ(gqa.out, mha.out);
  EXPECT_EQ(gqa.weights, mha.weights);
}

TEST(ReferenceAttentionTest, OptionsCombineWithAnd) {
  Problem pr(1, 1, 1, 2, 4, 2);
  std::vector<uint8_t> mask = {1, 0, 1, 1};  // key 1 blocked for every query
  pr.p.mask = BroadcastMask(mask.data(), {4}, 1, 1, 2, 4).value();
  pr.p.causal = true;  // query 0 sees keys 0..2, query 1 keys 0..3
  std::vector<int32_t> lengths = {3};
  pr.p.key_lengths = lengths.data();  // key 3 blocked
  ReferenceAttention(pr.p);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(pr.weights[i * 4 + 1], 0.0f);
    EXPECT_EQ(pr.weights[i * 4 + 3], 0.0f);
    EXPECT_NEAR(pr.weights[i * 4 + 0] + pr.weights[i * 4 + 2], 1.0, 1e-7);
  }
}

// FLOAT16 / BFLOAT16 inputs arrive as views of their encodings (strided: here a row stride
// wider than the row) and are widened exactly, so they give the bits of their float32 values.
TEST(ReferenceAttentionTest, SixteenBitInputsGiveTheBitsOfTheirFloat32Values) {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    Problem wide(2, 2, 1, 5, 7, 6);
    wide.p.causal = true;
    // Round the float32 inputs through t, and encode them with a row stride of 8 (> D = 6).
    std::vector<uint16_t> enc[3];
    std::vector<float>* src[3] = {&wide.q, &wide.k, &wide.v};
    InputView* views[3] = {&wide.p.q, &wide.p.k, &wide.p.v};
    Problem narrow(2, 2, 1, 5, 7, 6);
    narrow.p.causal = true;
    narrow.p.input_dtype = t;
    InputView* narrow_views[3] = {&narrow.p.q, &narrow.p.k, &narrow.p.v};
    for (int n = 0; n < 3; ++n) {
      std::vector<float>& x = *src[n];
      std::vector<uint16_t> packed(x.size());
      FromFloat32(t, x.data(), x.size(), packed.data());
      ToFloat32(t, packed.data(), x.size(), x.data());
      const int64_t rows = static_cast<int64_t>(x.size()) / 6;
      enc[n].assign(rows * 8, 0xffff);  // NaN padding that must never be read
      for (int64_t r = 0; r < rows; ++r) {
        for (int c = 0; c < 6; ++c) enc[n][r * 8 + c] = packed[r * 6 + c];
      }
      const InputView& v = *views[n];
      *narrow_views[n] = InputView{enc[n].data(), v.batch_stride / 6 * 8, v.head_stride / 6 * 8, 8};
    }
    ReferenceAttention(wide.p);
    ReferenceAttention(narrow.p);
    EXPECT_EQ(wide.out, narrow.out);
    EXPECT_EQ(wide.weights, narrow.weights);
  }
}

TEST(ReferenceMultiHeadTest, SixteenBitInputsGiveTheBitsOfTheirFloat32Values) {
  auto c = LoadSeedCase("cross_padding");
  ASSERT_TRUE(c.ok()) << c.status();
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    testing::SeedCase rounded = *c;
    std::vector<uint16_t> enc[3];
    std::vector<float>* x[3] = {&rounded.query, &rounded.key, &rounded.value};
    for (int n = 0; n < 3; ++n) {
      enc[n].resize(x[n]->size());
      FromFloat32(t, x[n]->data(), x[n]->size(), enc[n].data());
      ToFloat32(t, enc[n].data(), x[n]->size(), x[n]->data());
    }
    std::vector<float> out32(c->expected_output.size()), out16(out32.size());
    ReferenceMultiHead(testing::SeedParams(rounded, out32.data(), nullptr));
    MultiHeadParams p = testing::SeedParams(rounded, out16.data(), nullptr);
    ASSERT_FALSE(p.self_attention);
    p.input_dtype = t;
    p.query = enc[0].data();
    p.key = enc[1].data();
    p.value = enc[2].data();
    ReferenceMultiHead(p);
    EXPECT_EQ(out32, out16);
  }
}

// The split into heads: head t of row (b, i) is columns [t·d_k, (t+1)·d_k) of row b·L + i.
TEST(HeadAttentionParamsTest, SplitsRowsIntoHeadsThroughStrides) {
  MultiHeadWeights w;
  w.d_model = 12;
  w.num_heads = 3;
  MultiHeadParams p;
  p.module = &w;
  p.batch = 2;
  p.q_len = 5;
  p.kv_len = 7;
  p.causal = true;
  p.scale = 0.5f;
  std::vector<int32_t> lengths = {7, 3};
  p.key_lengths = lengths.data();
  std::vector<uint16_t> qkv(2 * 7 * 36);
  std::vector<float> concat(2 * 5 * 20);
  const ProjectedQkv in{qkv.data(), 36, qkv.data() + 12, 36, qkv.data() + 24, 36, DType::kBFloat16};
  const AttentionParams a = HeadAttentionParams(p, in, concat.data(), 20);
  EXPECT_EQ(a.num_heads, 3);
  EXPECT_EQ(a.num_kv_heads, 3);
  EXPECT_EQ(a.head_dim, 4);
  EXPECT_EQ(a.v_head_dim, 4);
  EXPECT_EQ(a.input_dtype, DType::kBFloat16);
  EXPECT_EQ(a.q.row<uint16_t>(1, 2, 3), qkv.data() + (1 * 5 + 3) * 36 + 2 * 4);
  EXPECT_EQ(a.k.row<uint16_t>(1, 2, 6), qkv.data() + 12 + (1 * 7 + 6) * 36 + 2 * 4);
  EXPECT_EQ(a.v.row<uint16_t>(0, 1, 2), qkv.data() + 24 + 2 * 36 + 1 * 4);
  EXPECT_EQ(a.out.row(1, 2, 4), concat.data() + (1 * 5 + 4) * 20 + 2 * 4);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.key_lengths, lengths.data());
  EXPECT_EQ(a.scale, 0.5f);
}

// The paged reference against the dense one: two sequences of different lengths whose pages are
// scattered through the pool, GQA, each compared with a causal dense Attend of its own.
TEST(ReferencePagedAttentionTest, EqualsACausalDenseAttendPerSequence) {
  constexpr int kHq = 4, kHkv = 2, kD = 8, kPage = 4;
  const std::vector<int32_t> kv_lens = {37, 5}, q_lens = {3, 1}, q_offsets = {0, 3};
  const int max_pages = 10, num_pages = 2 * max_pages;
  auto value = [](int64_t i, float seed) { return std::sin(seed + 0.37f * static_cast<float>(i)); };
  std::vector<float> k_pages(int64_t{num_pages} * kHkv * kPage * kD, NAN);
  std::vector<float> v_pages(k_pages.size(), NAN);  // slots no sequence owns stay NaN
  std::vector<int32_t> table(2 * max_pages, -1);
  for (int i = 0; i < 2 * max_pages; ++i) table[i] = (i * 7 + 3) % num_pages;  // scattered
  PagedAttentionParams p;
  p.num_seqs = 2;
  p.num_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = p.v_head_dim = kD;
  p.page_size = kPage;
  p.max_pages_per_seq = max_pages;
  p.k_pages = k_pages.data();
  p.v_pages = v_pages.data();
  p.page_table = table.data();
  p.kv_lens = kv_lens.data();
  p.q_lens = q_lens.data();
  p.q_offsets = q_offsets.data();
  p.total_q = 4;
  p.scale = 1.0f / std::sqrt(float{kD});
  std::vector<float> q(int64_t{p.total_q} * kHq * kD);
  for (size_t i = 0; i < q.size(); ++i) q[i] = value(i, 0.3f);
  p.q = q.data();
  // Dense copies [Hkv, Lk, D] per sequence, and the same values written into the pages.
  std::vector<std::vector<float>> dense_k(2), dense_v(2);
  for (int s = 0; s < 2; ++s) {
    dense_k[s].resize(int64_t{kHkv} * kv_lens[s] * kD);
    dense_v[s].resize(dense_k[s].size());
    for (int h = 0; h < kHkv; ++h) {
      for (int j = 0; j < kv_lens[s]; ++j) {
        for (int d = 0; d < kD; ++d) {
          const int64_t dense = (int64_t{h} * kv_lens[s] + j) * kD + d;
          dense_k[s][dense] = value(dense, 1.1f + s);
          dense_v[s][dense] = value(dense, 2.3f + s);
          const int32_t page = table[s * max_pages + j / kPage];
          k_pages[p.k_offset(page, h, j % kPage) + d] = dense_k[s][dense];
          v_pages[p.v_offset(page, h, j % kPage) + d] = dense_v[s][dense];
        }
      }
    }
  }
  const Reference64 paged = ReferencePagedAttention64(p);
  for (int s = 0; s < 2; ++s) {
    AttentionParams dense;
    dense.batch = 1;
    dense.num_heads = kHq;
    dense.num_kv_heads = kHkv;
    dense.q_len = q_lens[s];
    dense.kv_len = kv_lens[s];
    dense.head_dim = dense.v_head_dim = kD;
    dense.causal = true;
    // q rows of this sequence, [t, h, d] in the packed array: head stride D, row stride Hq * D.
    dense.q = {q.data() + int64_t{q_offsets[s]} * kHq * kD, 0, kD, kHq * kD};
    dense.k = {dense_k[s].data(), 0, int64_t{kv_lens[s]} * kD, kD};
    dense.v = {dense_v[s].data(), 0, int64_t{kv_lens[s]} * kD, kD};
    dense.scale = p.scale;
    std::vector<float> out(int64_t{kHq} * q_lens[s] * kD),
        weights(int64_t{kHq} * q_lens[s] * kv_lens[s]);
    dense.out = {out.data(), 0, int64_t{q_lens[s]} * kD, kD};
    dense.weights = weights.data();
    const Reference64 want = ReferenceAttention64(dense);
    for (int i = 0; i < q_lens[s]; ++i) {
      for (int h = 0; h < kHq; ++h) {
        const int64_t row = int64_t{q_offsets[s] + i} * kHq + h;
        for (int d = 0; d < kD; ++d) {
          EXPECT_NEAR(paged.out[row * kD + d], want.out[(int64_t{h} * q_lens[s] + i) * kD + d],
                      1e-12)
              << "seq " << s << " row " << i << " head " << h << " col " << d;
        }
        // The log-sum-exp turns the row's first score into its weight.
        double score0 = 0;
        for (int d = 0; d < kD; ++d) {
          score0 += double{q[row * kD + d]} * dense_k[s][int64_t{h / 2} * kv_lens[s] * kD + d];
        }
        score0 *= p.scale;
        EXPECT_NEAR(std::exp(score0 - paged.weights[row]),
                    want.weights[(int64_t{h} * q_lens[s] + i) * kv_lens[s]], 1e-12);
      }
    }
  }
}

}  // namespace
}  // namespace attnserve::kernels
