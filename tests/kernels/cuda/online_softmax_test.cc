// CPU tests of the online-softmax tile logic the CUDA kernels share
// (kernels/cuda/online_softmax.h): the key-limit and block-skipping arithmetic against
// AttentionParams, and a tiled softmax- weighted sum built from the same helpers against a direct
// float64 computation.
#include "kernels/cuda/online_softmax.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(OnlineSoftmaxTest, KeyLimitMatchesAttentionParams) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const int q_len = 1 + rng() % 40, kv_len = 1 + rng() % 40;
    const int32_t key_length = rng() % (kv_len + 1);
    const bool causal = rng() % 2;
    const bool with_lengths = rng() % 2;
    AttentionParams p;
    p.batch = 1;
    p.q_len = q_len;
    p.kv_len = kv_len;
    p.causal = causal;
    p.key_lengths = with_lengths ? &key_length : nullptr;
    for (int i = 0; i < q_len; ++i) {
      EXPECT_EQ(KeyLimit(i, q_len, kv_len, with_lengths ? key_length : kv_len, causal),
                p.key_limit(0, i))
          << "q_len " << q_len << " kv_len " << kv_len << " causal " << causal << " i " << i;
    }
  }
}

TEST(OnlineSoftmaxTest, SkippedKeyBlocksHoldNoAllowedKey) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 2000; ++trial) {
    const int q_len = 1 + rng() % 300, kv_len = 1 + rng() % 300;
    const int key_length = rng() % 3 == 0 ? static_cast<int>(rng() % (kv_len + 1)) : kv_len;
    const bool causal = rng() % 2;
    // A sliding window on a third of the trials (either side may stay open, or be as large as
    // a caller may send: INT32_MAX must not overflow).
    KeyWindow window;
    if (rng() % 3 == 0) {
      const auto bound = [&] {
        return rng() % 8 == 0 ? std::numeric_limits<int>::max() - static_cast<int>(rng() % 2)
                              : static_cast<int>(rng() % 90) - 1;
      };
      window.left = bound();
      window.right = bound();
    }
    const int block_m = 64, block_n = rng() % 2 ? 64 : 128;
    for (int m0 = 0; m0 < q_len; m0 += block_m) {
      const int m1 = std::min(m0 + block_m, q_len);
      const int n_blocks = NumKeyBlocks(m0, m1, q_len, kv_len, key_length, causal, block_n, window);
      const int nb_first = FirstKeyBlock(m0, q_len, kv_len, block_n, window);
      ASSERT_GE(n_blocks, 0);
      for (int i = m0; i < m1; ++i) {
        const int limit = KeyLimit(i, q_len, kv_len, key_length, causal, window);
        const int start = KeyStart(i, q_len, kv_len, window);
        // AttentionParams says the same of each row.
        AttentionParams p;
        p.q_len = q_len;
        p.kv_len = kv_len;
        p.causal = causal;
        p.mods.window_left = window.left;
        p.mods.window_right = window.right;
        EXPECT_EQ(std::min(limit, key_length), std::min(p.key_limit(0, i), key_length));
        EXPECT_EQ(start, p.key_start(i));
        // Every allowed key is inside a visited block ...
        if (start < limit) {
          EXPECT_LE(limit, n_blocks * block_n);
          EXPECT_GE(start, nb_first * block_n);
        }
        // ... and a tile declared fully allowed is inside every row's range.
        for (int nb = 0; nb < n_blocks; ++nb) {
          if (TileFullyAllowed(m0, m1, nb * block_n, block_n, q_len, kv_len, key_length, causal,
                               window)) {
            EXPECT_LE(nb * block_n + block_n, limit);
            EXPECT_GE(nb * block_n, start);
          }
        }
      }
      // The last visited block holds an allowed key for the block's last row.
      if (n_blocks > 0) {
        EXPECT_GT(KeyLimit(m1 - 1, q_len, kv_len, key_length, causal, window),
                  (n_blocks - 1) * block_n);
      }
    }
  }
}

// out = sum_j softmax(s)_j * v_j over the allowed keys, computed as the kernels do: tiles of
// `tile` keys, each tile's columns spread over `lanes` threads with per-thread partial sums that
// are combined only at the end. Returns NaN-free results; `blocked` reports a row with no key.
double TiledWeightedSum(const std::vector<float>& s_log2, const std::vector<float>& v, int tile,
                        int lanes, bool* blocked) {
  const int n = static_cast<int>(s_log2.size());
  std::vector<OnlineSoftmaxRow> rows(lanes, OnlineSoftmaxInit());
  std::vector<double> acc(lanes, 0.0);
  for (int t0 = 0; t0 < n; t0 += tile) {
    const int t1 = std::min(n, t0 + tile);
    float tile_max = -kInf;
    for (int j = t0; j < t1; ++j) tile_max = Max(tile_max, s_log2[j]);
    for (int l = 0; l < lanes; ++l) {
      const float factor = OnlineSoftmaxRescale(rows[l], tile_max);
      acc[l] *= factor;
    }
    for (int j = t0; j < t1; ++j) {
      const int l = (j - t0) % lanes;
      const float prob = OnlineSoftmaxProb(rows[l], s_log2[j]);
      rows[l].sum += prob;
      acc[l] += static_cast<double>(prob) * v[j];
    }
  }
  float total = 0.0f;
  double num = 0.0;
  for (int l = 0; l < lanes; ++l) {
    EXPECT_EQ(rows[l].max_log2, rows[0].max_log2) << "lanes disagree on the running max";
    total += rows[l].sum;
    num += acc[l];
  }
  *blocked = OnlineSoftmaxFullyBlocked(total);
  return num * OnlineSoftmaxInvSum(total);
}

TEST(OnlineSoftmaxTest, TiledSumMatchesDirectSoftmax) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + rng() % 500;
    const float spread = trial % 3 == 0 ? 200.0f : 8.0f;  // large scores must not overflow
    std::uniform_real_distribution<float> score(-spread, spread), value(-1.0f, 1.0f);
    std::vector<float> s(n), v(n);
    const int pattern = trial % 4;  // 0 none, 1 random, 2 leading blocked run, 3 all blocked
    int allowed = 0;
    for (int j = 0; j < n; ++j) {
      s[j] = score(rng);
      v[j] = value(rng);
      bool block = (pattern == 1 && rng() % 3 == 0) || (pattern == 2 && j < n / 2) || pattern == 3;
      if (block) s[j] = -kInf;
      allowed += !block;
    }
    double mx = -INFINITY;
    for (int j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(s[j]));
    double num = 0.0, den = 0.0;
    for (int j = 0; j < n; ++j) {
      if (s[j] == -kInf) continue;
      const double e = std::exp2(static_cast<double>(s[j]) - mx);
      num += e * v[j];
      den += e;
    }
    for (int tile : {8, 64, 128}) {
      for (int lanes : {1, 4, 32}) {
        bool blocked = false;
        const double got = TiledWeightedSum(s, v, tile, lanes, &blocked);
        ASSERT_FALSE(std::isnan(got));
        EXPECT_EQ(blocked, allowed == 0);
        if (allowed == 0) {
          EXPECT_EQ(got, 0.0);  // the kernel then writes the value mean instead
        } else {
          EXPECT_NEAR(got, num / den, 2e-5) << "n " << n << " tile " << tile << " lanes " << lanes;
        }
      }
    }
  }
}

TEST(OnlineSoftmaxTest, RescaleFromAllBlockedState) {
  OnlineSoftmaxRow row = OnlineSoftmaxInit();
  EXPECT_EQ(OnlineSoftmaxRescale(row, -kInf), 1.0f);  // no NaN from -inf - -inf
  EXPECT_EQ(OnlineSoftmaxProb(row, -kInf), 0.0f);
  EXPECT_EQ(row.sum, 0.0f);
  EXPECT_EQ(OnlineSoftmaxRescale(row, 3.0f), 0.0f);  // nothing accumulated yet: factor 2^-inf
  EXPECT_EQ(OnlineSoftmaxProb(row, 3.0f), 1.0f);
  row.sum = 1.0f;
  EXPECT_FLOAT_EQ(OnlineSoftmaxRescale(row, 4.0f), 0.5f);
  EXPECT_FLOAT_EQ(row.sum, 0.5f);
  EXPECT_EQ(OnlineSoftmaxInvSum(0.0f), 0.0f);
  EXPECT_TRUE(OnlineSoftmaxFullyBlocked(0.0f));
  EXPECT_FALSE(OnlineSoftmaxFullyBlocked(1e-30f));
}

// The NaN rule (attention_params.h): a NaN or +Inf score makes the row NaN; it must not look
// fully blocked (which would write the uniform average instead).
TEST(OnlineSoftmaxTest, NonFiniteScoresMakeTheRowNaNNotBlocked) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (const float bad : {kNaN, kInf}) {
    OnlineSoftmaxRow row = OnlineSoftmaxInit();
    const float tile_max = std::fmax(1.0f, bad);  // what fmaxf gives the kernels
    OnlineSoftmaxRescale(row, tile_max);
    row.sum += OnlineSoftmaxProb(row, 1.0f) + OnlineSoftmaxProb(row, bad);
    EXPECT_TRUE(std::isnan(row.sum)) << bad;
    EXPECT_FALSE(OnlineSoftmaxFullyBlocked(row.sum)) << bad;
    EXPECT_TRUE(std::isnan(OnlineSoftmaxInvSum(row.sum))) << bad;
  }
  // A tile of NaN scores only: the max stays -inf, and the NaN still reaches the sum.
  OnlineSoftmaxRow row = OnlineSoftmaxInit();
  OnlineSoftmaxRescale(row, std::fmax(-kInf, kNaN));
  row.sum += OnlineSoftmaxProb(row, kNaN);
  EXPECT_FALSE(OnlineSoftmaxFullyBlocked(row.sum));
  // -Inf scores count as blocked (weight 0).
  OnlineSoftmaxRow neg = OnlineSoftmaxInit();
  OnlineSoftmaxRescale(neg, -kInf);
  neg.sum += OnlineSoftmaxProb(neg, -kInf);
  EXPECT_TRUE(OnlineSoftmaxFullyBlocked(neg.sum));
}

}  // namespace
}  // namespace attnserve::kernels::cuda
