// The online-softmax tile logic of the fused attention kernels, shared by the GPU kernels and
// tested on the CPU (tests/kernels/cuda/online_softmax_test.cc). Everything here is a small
// __host__ __device__ function: under nvcc it compiles for both sides, under a plain C++
// compiler ATTNSERVE_HD expands to nothing.
//
// Scores are kept in log2 units: s2 = scale * log2(e) * q.k, so every exponential is an exp2
// (one ex2.approx instruction on the GPU). A blocked score is -infinity: the kernels compute
// "softmax over the allowed keys" and fall back to the uniform average when a row has none
// (attention_params.h explains why this equals the reference's -1e9 fill).
//
// One row's running state, step by step (FlashAttention-2, Algorithm 1):
//   1. m_new = max(m, max_j s2_j over the tile)              (running max; -inf while all blocked)
//   2. factor = exp2(m - m_new)                              (rescale what was accumulated so far)
//      l *= factor; acc *= factor
//   3. p_j = exp2(s2_j - m_new)                              (0 for blocked keys)
//      l += sum_j p_j; acc += sum_j p_j * v_j
//   4. at the end: out = acc / l, or the uniform average of all values when l == 0 (a NaN l,
//      from a NaN or +Inf score, gives a NaN row: the NaN rule of attention_params.h).
#ifndef ATTNSERVE_KERNELS_CUDA_ONLINE_SOFTMAX_H_
#define ATTNSERVE_KERNELS_CUDA_ONLINE_SOFTMAX_H_

#if defined(__CUDACC__)
#define ATTNSERVE_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define ATTNSERVE_HD inline
#endif

namespace attnserve::kernels::cuda {

// log2(e): multiplies the softmax scale so that exp(x) = exp2(x * kLog2e).
inline constexpr float kLog2e = 1.4426950408889634f;

ATTNSERVE_HD float NegativeInfinity() { return -__builtin_huge_valf(); }

// 2^x. On the GPU the hardware approximation (ex2.approx.ftz: about 2 ulp, 2^-inf = +0); on the
// CPU std::exp2.
ATTNSERVE_HD float Exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

ATTNSERVE_HD float Max(float a, float b) { return a > b ? a : b; }

// A sliding window (ScoreMods in attention_params.h): row i may attend keys
// i' - left <= j <= i' + right, i' = i + kv_len - q_len; -1 leaves a side open.
struct KeyWindow {
  int left = -1;
  int right = -1;
};

// The number of keys row i of a sequence may attend to before the mask is consulted: keys at
// j >= KeyLimit are blocked by causality (bottom-right aligned, j <= i + kv_len - q_len), by
// the key length or by the window's right side. Mirrors AttentionParams::key_limit;
// key_length = kv_len when none is given. A window bound may be as large as INT32_MAX (a caller's
// "any"): it is compared before it is added, so nothing overflows.
ATTNSERVE_HD int KeyLimit(int i, int q_len, int kv_len, int key_length, bool causal,
                          KeyWindow window = {}) {
  int limit = kv_len < key_length ? kv_len : key_length;
  if (causal) {
    int causal_limit = i + kv_len - q_len + 1;
    if (causal_limit < 0) causal_limit = 0;
    if (causal_limit < limit) limit = causal_limit;
  }
  const int aligned = i + kv_len - q_len;
  if (window.right >= 0 && window.right < limit - aligned - 1) {
    const int window_limit = aligned + window.right + 1;  // < limit
    limit = window_limit < 0 ? 0 : window_limit;
  }
  return limit;
}

// The first key row i may attend to: keys at j < KeyStart are before its window (0 without
// one). Mirrors AttentionParams::key_start.
ATTNSERVE_HD int KeyStart(int i, int q_len, int kv_len, KeyWindow window) {
  const int aligned = i + kv_len - q_len;
  if (window.left < 0 || window.left >= aligned) return 0;  // (no overflow below)
  const int start = aligned - window.left;
  return start > kv_len ? kv_len : start;
}

// The number of key blocks of kBlockN keys a block of query rows [row_begin, row_end) visits:
// every block at or past it holds only keys blocked for every row (fully blocked tiles are
// skipped). REQUIRES row_begin < row_end.
ATTNSERVE_HD int NumKeyBlocks(int row_begin, int row_end, int q_len, int kv_len, int key_length,
                              bool causal, int block_n, KeyWindow window = {}) {
  // The last row has the largest limit (limits grow with i); row_begin documents the range.
  (void)row_begin;
  const int limit = KeyLimit(row_end - 1, q_len, kv_len, key_length, causal, window);
  return (limit + block_n - 1) / block_n;
}

// The first key block the rows [row_begin, ...) visit: every block before it lies before every
// row's window (starts grow with i, so the first row's start is the least).
ATTNSERVE_HD int FirstKeyBlock(int row_begin, int q_len, int kv_len, int block_n,
                               KeyWindow window) {
  return KeyStart(row_begin, q_len, kv_len, window) / block_n;
}

// Whether every key of [col_begin, col_begin + block_n) is below the limit of every row in
// [row_begin, row_end) and at or past every such row's window start: such a tile needs no
// per-element limit check (only the mask, if any). REQUIRES row_begin < row_end. (The
// tensor-core kernel's plain instantiation asks it without a window, and its kMods one with.)
ATTNSERVE_HD bool TileFullyAllowed(int row_begin, int row_end, int col_begin, int block_n,
                                   int q_len, int kv_len, int key_length, bool causal,
                                   KeyWindow window = {}) {
  return col_begin + block_n <= KeyLimit(row_begin, q_len, kv_len, key_length, causal, window) &&
         col_begin >= KeyStart(row_end - 1, q_len, kv_len, window);
}

// The other modifications of ScoreMods on one score s = scale·q·k (linear units): soft-capped,
// then lowered by ALiBi's slope · |j - i'| (slope 0: none), i' the row's aligned position.
ATTNSERVE_HD float ModifyScore(float s, float softcap, float slope, int j, int aligned_i) {
  if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
  const float distance = static_cast<float>(j > aligned_i ? j - aligned_i : aligned_i - j);
  return s - slope * distance;
}

// One row's online-softmax state. max_log2 is the running max of the allowed scores (log2
// units), -inf while none was seen; sum is the running sum of exp2(s2 - max_log2). On the GPU
// the sum is kept per thread (over the columns that thread owns) and reduced across the row's
// threads only at the end: the rescale factor is the same for every thread of the row.
struct OnlineSoftmaxRow {
  float max_log2;
  float sum;
};

ATTNSERVE_HD OnlineSoftmaxRow OnlineSoftmaxInit() { return {NegativeInfinity(), 0.0f}; }

// Steps 1-2: takes the tile's max (already reduced over the whole row; -inf when the tile holds
// no allowed key for this row), updates the running max and the sum, and returns the factor the
// caller multiplies its output accumulators by.
ATTNSERVE_HD float OnlineSoftmaxRescale(OnlineSoftmaxRow& row, float tile_max_log2) {
  const float new_max = Max(row.max_log2, tile_max_log2);
  // While every score so far is blocked the max stays -inf; -inf - -inf would be NaN, and
  // nothing has been accumulated yet, so any factor will do: 1.
  const float factor = new_max == NegativeInfinity() ? 1.0f : Exp2(row.max_log2 - new_max);
  row.max_log2 = new_max;
  row.sum *= factor;
  return factor;
}

// Step 3: the probability of one score, relative to the current max. Blocked (-inf) scores give
// exactly 0; so does every score while the max is still -inf (then all are blocked).
ATTNSERVE_HD float OnlineSoftmaxProb(const OnlineSoftmaxRow& row, float score_log2) {
  const float m = row.max_log2 == NegativeInfinity() ? 0.0f : row.max_log2;
  return Exp2(score_log2 - m);
}

// Step 4: 1 / sum, or 0 for a row with no allowed key (the caller then writes the uniform
// average of all values; see FullyBlocked). The NaN rule (attention_params.h): a NaN or +Inf
// score makes the sum NaN, and such a row must come out NaN, not look fully blocked; the sum of
// a row with an allowed finite score is >= 1 (its max contributes exp2(0)), so exactly 0 means
// "no allowed key" (or only -Inf scores, which count as blocked).
ATTNSERVE_HD float OnlineSoftmaxInvSum(float total_sum) {
  return total_sum == 0.0f ? 0.0f : 1.0f / total_sum;
}
ATTNSERVE_HD bool OnlineSoftmaxFullyBlocked(float total_sum) { return total_sum == 0.0f; }

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ONLINE_SOFTMAX_H_
