// The paged attention kernels (kernels/cuda/paged_attention_kernel.h), compiled as host C++ and
// executed by the emulator (emu.h), against the float64 reference ReferencePagedAttention64
// (kernels/reference.h) on the same pool, page table and queries: float16, bfloat16 and float32
// caches; page sizes 1, 16 and 64; key counts around the split size (1, 255, 256, 257, 1000);
// decode steps and prefill chunks (q_len > 1, causal bottom-right); GQA 8/2, 4/1 and 1/1;
// D 64 and 128 and D != Dv (up to 200: the 8-columns-per-lane instantiation); the NaN rule; and
// bitwise batch invariance. And the scatter of new rows into a device store's pages
// (paged_scatter_kernel.h).
//
// Every buffer has its exact size (ASan sees an overrun); the pool's pages are scattered (a
// random permutation), and every pool element no sequence owns (unused pages, slots past a
// sequence's last key) is NaN, so a read through a wrong page or past kv_len shows as NaN in the
// output. Page table entries past a sequence's pages are -1. The workspace starts NaN.
//
// The launches are paged_emu_kernels.cc's, which mirror paged_attention.cu (which uses <<<>>> and
// is not compiled here); this file includes no kernel body, so that each mutant links it as it is.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/paged_attention_shape.h"
#include "kernels/dtype.h"
#include "kernels/page_store.h"
#include "kernels/paged_attention_params.h"
#include "kernels/reference.h"
#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/paged_emu_kernels.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kUnwritten = -12345.0f;  // a value no output can take

struct PagedSeq {
  int q_len;
  int kv_len;
  uint32_t seed;  // the sequence's q, k, v depend only on this (batch invariance)
};

struct PagedCase {
  std::string name;
  std::vector<PagedSeq> seqs;
  int num_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int v_head_dim = 64;
  int page_size = 16;
  uint32_t layout_seed = 7;  // the page permutation
  int extra_pages = 3;       // unused pages of the pool (NaN)
  // Non-finite inputs (the NaN rule), in sequence 0, kv head 0 / query head 0.
  float q_poison = 0.0f;  // 0: none; at q[token q_poison_token, head 0, column 0]
  int q_poison_token = 0;
  float k_poison = 0.0f;  // at key k_poison_key, column 0
  int k_poison_key = 0;
  float v_poison = 0.0f;  // at key 0, column 3
  // Column 0 of every key of sequence 0, kv head 0, made positive: with q_poison = -Inf every
  // allowed score of the poisoned row is -Inf (rule 2).
  bool k_col0_positive = false;
  // Queries in float32 (q_dtype FLOAT32) instead of in the cache's dtype.
  bool float32_queries = false;
  // Score modifications (PagedAttentionParams): a sliding window (its session's dropped pages,
  // those wholly before the split of its first row's window start, then point at an unused
  // NaN page), a soft-cap, ALiBi slopes (one per query head).
  int window_left = -1;
  float softcap = 0.0f;
  std::vector<float> alibi_slopes;
};

// Exact-size storage of `n` elements of `dtype`.
struct Buffer {
  DType dtype;
  size_t n;
  std::unique_ptr<uint8_t[]> bytes;
  Buffer(DType t, size_t count) : dtype(t), n(count), bytes(new uint8_t[count * DTypeSize(t)]) {}
  void Set(size_t i, float x) {
    if (i >= n) std::abort();
    FromFloat32(dtype, &x, 1, bytes.get() + i * DTypeSize(dtype));
  }
};

struct Result {
  std::vector<float> out;  // [total_q, H, Dv]
  std::vector<float> lse;  // [total_q, H]
  std::vector<int> q_offsets;
  Reference64 ref;  // out [total_q, H, Dv], weights = lse [total_q, H]
};

Result RunPaged(const PagedCase& c, DType dtype) {
  const int S = static_cast<int>(c.seqs.size());
  const int H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.v_head_dim;
  const int P = c.page_size;
  std::vector<int> pages_of(S), q_off(S + 1, 0);
  int used = 0, max_pages = 0, max_q = 0, max_kv = 0;
  for (int s = 0; s < S; ++s) {
    pages_of[s] = (c.seqs[s].kv_len + P - 1) / P;
    used += pages_of[s];
    max_pages = std::max(max_pages, pages_of[s]);
    q_off[s + 1] = q_off[s] + c.seqs[s].q_len;
    max_q = std::max(max_q, c.seqs[s].q_len);
    max_kv = std::max(max_kv, c.seqs[s].kv_len);
  }
  const int num_pages = used + c.extra_pages;
  const int max_pages_per_seq = max_pages + 1;  // a trailing -1 entry in every row
  const int total_q = q_off[S];

  // Scattered pages: a random permutation of the pool hands out each sequence's pages.
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 layout_rng(c.layout_seed);
  std::shuffle(perm.begin(), perm.end(), layout_rng);
  std::unique_ptr<int32_t[]> page_table(new int32_t[size_t(S) * max_pages_per_seq]);
  std::fill(page_table.get(), page_table.get() + size_t(S) * max_pages_per_seq, -1);
  for (int s = 0, next = 0; s < S; ++s) {
    for (int i = 0; i < pages_of[s]; ++i)
      page_table[size_t(s) * max_pages_per_seq + i] = perm[next++];
  }

  PagedAttentionParams p;
  p.num_seqs = S;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.v_head_dim = Dv;
  p.page_size = P;
  p.max_pages_per_seq = max_pages_per_seq;
  p.dtype = dtype;
  p.q_dtype = c.float32_queries ? DType::kFloat32 : dtype;
  Buffer k(dtype, size_t(num_pages) * p.k_page_stride());
  Buffer v(dtype, size_t(num_pages) * p.v_page_stride());
  Buffer q(p.q_dtype, size_t(total_q) * H * D);
  for (size_t i = 0; i < k.n; ++i) k.Set(i, kNaN);  // owned by no sequence until written
  for (size_t i = 0; i < v.n; ++i) v.Set(i, kNaN);
  for (int s = 0; s < S; ++s) {
    std::mt19937 rng(c.seqs[s].seed);
    std::uniform_real_distribution<float> qk(-1.5f, 1.5f), vd(-1.0f, 1.0f);
    for (size_t i = 0; i < size_t(c.seqs[s].q_len) * H * D; ++i) {
      q.Set(size_t(q_off[s]) * H * D + i, qk(rng));
    }
    const int32_t* row = page_table.get() + size_t(s) * max_pages_per_seq;
    for (int j = 0; j < c.seqs[s].kv_len; ++j) {
      for (int g = 0; g < Hkv; ++g) {
        for (int d = 0; d < D; ++d) {
          const float x = qk(rng);
          const bool positive = c.k_col0_positive && s == 0 && g == 0 && d == 0;
          k.Set(p.k_offset(row[j / P], g, j % P) + d, positive ? std::fabs(x) + 0.25f : x);
        }
        for (int d = 0; d < Dv; ++d) v.Set(p.v_offset(row[j / P], g, j % P) + d, vd(rng));
      }
    }
  }
  if (c.q_poison != 0.0f) q.Set(size_t(c.q_poison_token) * H * D, c.q_poison);
  if (c.k_poison != 0.0f) {
    k.Set(p.k_offset(page_table[c.k_poison_key / P], 0, c.k_poison_key % P), c.k_poison);
  }
  if (c.v_poison != 0.0f) v.Set(p.v_offset(page_table[0], 0, 0) + 3, c.v_poison);

  std::unique_ptr<int32_t[]> kv_lens(new int32_t[S]), q_lens(new int32_t[S]),
      q_offsets(new int32_t[S]);
  for (int s = 0; s < S; ++s) {
    kv_lens[s] = c.seqs[s].kv_len;
    q_lens[s] = c.seqs[s].q_len;
    q_offsets[s] = q_off[s];
  }
  const size_t out_n = size_t(total_q) * H * Dv, lse_n = size_t(total_q) * H;
  std::unique_ptr<float[]> out(new float[out_n]), lse(new float[lse_n]);
  std::fill(out.get(), out.get() + out_n, kUnwritten);
  std::fill(lse.get(), lse.get() + lse_n, kUnwritten);
  p.k_pages = k.bytes.get();
  p.v_pages = v.bytes.get();
  p.page_table = page_table.get();
  p.kv_lens = kv_lens.get();
  p.q_lens = q_lens.get();
  p.q_offsets = q_offsets.get();
  p.total_q = total_q;
  p.q = q.bytes.get();
  p.out = out.get();
  p.lse = lse.get();
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.window_left = c.window_left;
  p.softcap = c.softcap;
  p.alibi_slopes = c.alibi_slopes.empty() ? nullptr : c.alibi_slopes.data();
  Result r;
  r.ref = ReferencePagedAttention64(p);  // over every page
  if (c.window_left >= 0) {
    // As a session drops them (server/sessions/session_table.h): the pages wholly before the
    // split holding the first new token's window start, made to point at an unused page of NaN
    // (any read of them would spread into the output).
    if (c.extra_pages < 1) std::abort();
    for (int s = 0; s < S; ++s) {
      const int first = std::max(0, c.seqs[s].kv_len - c.seqs[s].q_len - c.window_left);
      const int dropped = first / kPagedSplitKeys * kPagedSplitKeys / P;
      for (int i = 0; i < dropped; ++i) page_table[size_t(s) * max_pages_per_seq + i] = perm[used];
    }
  }
  LaunchPaged(p, max_q, max_kv);
  r.out.assign(out.get(), out.get() + out_n);
  r.lse.assign(lse.get(), lse.get() + lse_n);
  r.q_offsets = q_off;
  return r;
}

// Absolute tolerances, outputs of magnitude <= 1: the kernel computes in float32 on the same
// (already rounded) inputs as the reference, with probabilities kept in float32.
constexpr double kOutTolerance = 2e-5;
constexpr double kLseTolerance = 5e-5;

bool Near(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

void ExpectMatches(const PagedCase& c, DType dtype, const Result& r) {
  int bad = 0;
  for (size_t e = 0; e < r.out.size(); ++e) {
    if (!Near(r.out[e], r.ref.out[e], kOutTolerance) && ++bad <= 5) {
      ADD_FAILURE() << c.name << " " << DTypeName(dtype) << ": out element " << e << " (token "
                    << e / (size_t(c.num_heads) * c.v_head_dim) << ", head "
                    << (e / c.v_head_dim) % c.num_heads << ", column " << e % c.v_head_dim
                    << ") got " << r.out[e] << " want " << r.ref.out[e];
    }
  }
  for (size_t e = 0; e < r.lse.size(); ++e) {
    if (!Near(r.lse[e], r.ref.weights[e], kLseTolerance) && ++bad <= 10) {
      ADD_FAILURE() << c.name << " " << DTypeName(dtype) << ": lse of token " << e / c.num_heads
                    << ", head " << e % c.num_heads << " got " << r.lse[e] << " want "
                    << r.ref.weights[e];
    }
  }
  EXPECT_EQ(bad, 0) << c.name << ": " << bad << " elements out of tolerance";
}

class PagedAttentionEmuTest : public testing::TestWithParam<DType> {
 protected:
  Result Check(const PagedCase& c) {
    const Result r = RunPaged(c, GetParam());
    ExpectMatches(c, GetParam(), r);
    return r;
  }
};

// Decode steps (q_len 1) with key counts around the split size, on each page size and GQA
// layout: 8/2 at page 16 and D 128; 4/1 at page 64; 1/1 at page 1.
TEST_P(PagedAttentionEmuTest, DecodeSplitBoundariesAndPageSizes) {
  PagedCase c;
  c.name = "decode_p16_gqa8_2_d128";
  c.seqs = {{1, 1, 1}, {1, 255, 2}, {1, 256, 3}, {1, 257, 4}, {1, 1000, 5}};
  c.head_dim = c.v_head_dim = 128;
  Check(c);
  c.name = "decode_p64_gqa4_1_d64";
  c.page_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = c.v_head_dim = 64;
  Check(c);
  c.name = "decode_p1_gqa1_1_d64";
  c.seqs = {{1, 1, 1}, {1, 257, 4}, {1, 1000, 5}};
  c.page_size = 1;
  c.num_heads = c.num_kv_heads = 2;
  Check(c);
}

// Prefill chunks (q_len > 1, causal bottom-right): a whole prompt (q_len = kv_len), chunks whose
// first rows see fewer splits than their last (q 17 over 257 and 300 keys), mixed with decode
// steps; GQA 1/1 (8 tokens a block), 4/1 and 8/2; D != Dv, Dv = 200 (8 columns a lane).
TEST_P(PagedAttentionEmuTest, PrefillChunks) {
  PagedCase c;
  c.name = "prefill_gqa1_1";
  c.seqs = {{5, 5, 11}, {17, 300, 12}, {1, 256, 13}, {3, 257, 14}};
  c.num_heads = c.num_kv_heads = 1;
  c.head_dim = 64;
  c.v_head_dim = 200;
  Check(c);
  c.name = "prefill_gqa4_1_p64";
  c.seqs = {{9, 9, 21}, {17, 257, 22}};
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 128;
  c.v_head_dim = 64;
  c.page_size = 64;
  Check(c);
  c.name = "prefill_gqa8_2_p1";
  c.seqs = {{3, 270, 31}, {2, 2, 32}};
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 40;
  c.v_head_dim = 72;
  c.page_size = 1;
  Check(c);
}

// Sliding windows, soft-capping and ALiBi (issue 32), as decode sessions use them: windows whose
// start falls in a later split than the sequence's first key (the pages before that split
// dropped, pointing at NaN: never read), a window of one key, windows across a prefill chunk's
// rows (the block's rows start in different splits), each modification alone and all three with
// GQA, on page sizes 1, 16 and 64.
TEST_P(PagedAttentionEmuTest, ScoreModsAndDroppedPages) {
  PagedCase c;
  c.name = "window_300";
  c.seqs = {{1, 1000, 51}, {17, 600, 52}, {5, 5, 53}, {1, 257, 54}, {3, 530, 55}};
  c.window_left = 300;
  Check(c);
  c.name = "window_of_one_key_p1";
  c.seqs = {{1, 700, 56}, {4, 300, 57}};
  c.window_left = 0;
  c.page_size = 1;
  c.num_heads = c.num_kv_heads = 2;
  Check(c);
  c.name = "softcap_p64";
  c.window_left = -1;
  c.page_size = 64;
  c.softcap = 0.75f;
  c.seqs = {{1, 300, 58}, {9, 9, 59}};
  Check(c);
  c.name = "alibi";
  c.softcap = 0.0f;
  c.page_size = 16;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.0156f, 0.0078f, 0.0039f};
  c.seqs = {{1, 1300, 60}, {17, 40, 61}};
  Check(c);
  c.name = "all_three_gqa8_2";
  c.window_left = 600;
  c.softcap = 1.5f;
  c.seqs = {{1, 1300, 62}, {40, 900, 63}, {2, 2, 64}};
  Check(c);
}

// Float32 queries over the cache (q_dtype FLOAT32): used as they are, not rounded to the
// cache's type (the reference reads them as they are; rounding them misses it by about one
// rounding of q, some 1e-3 for 16-bit caches, against the tolerance of 2e-5), for a decode step
// and a prefill chunk.
TEST_P(PagedAttentionEmuTest, Float32QueriesAreNotRounded) {
  PagedCase c;
  c.name = "float32_queries";
  c.seqs = {{1, 300, 41}, {9, 40, 42}};
  c.float32_queries = true;
  Check(c);
}

// The NaN rule (attention_params.h).
TEST_P(PagedAttentionEmuTest, NaNRule) {
  for (const float bad : {kNaN, kInf}) {
    // Rule 1: a NaN/+Inf in q[token 1, head 0, col 0] makes that row NaN (out and lse); the
    // other rows stay finite.
    PagedCase c;
    c.name = "q_nonfinite";
    c.seqs = {{3, 300, 1}};
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.q_poison = bad;
    c.q_poison_token = 1;
    const Result r = Check(c);
    for (size_t e = 0; e < r.out.size(); ++e) {
      const bool poisoned_row = e / c.v_head_dim == 2;  // token 1, head 0
      EXPECT_EQ(std::isnan(r.out[e]), poisoned_row) << e;
    }
    EXPECT_TRUE(std::isnan(r.lse[2]));
    // Rule 3: a NaN/Inf in the k of a key past a row's causal limit: no effect on that row.
    // Key 299 is seen by the last token only (q 3 over 300 keys: limits 298, 299, 300).
    c = PagedCase{};
    c.name = "k_blocked_nonfinite";
    c.seqs = {{3, 300, 1}};
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.k_poison = bad;
    c.k_poison_key = 299;
    const Result r3 = Check(c);
    for (size_t e = 0; e < size_t(2) * c.num_heads * c.v_head_dim; ++e) {
      EXPECT_TRUE(std::isfinite(r3.out[e])) << e;
    }
  }
  // Rule 2: -Inf in q[token 1, head 0, col 0] and every key's k[col 0] positive: all of that
  // row's allowed scores are -Inf, so it attends uniformly to all 300 keys (its causal limit is
  // 299) and its lse is -Inf; the other rows are unaffected (Check compares with the reference).
  {
    PagedCase c;
    c.name = "all_scores_minus_inf";
    c.seqs = {{3, 300, 1}};
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.q_poison = -kInf;
    c.q_poison_token = 1;
    c.k_col0_positive = true;
    const Result r = Check(c);
    EXPECT_EQ(r.lse[2], -kInf);
    for (size_t e = 0; e < r.out.size(); ++e) EXPECT_TRUE(std::isfinite(r.out[e])) << e;
  }
  // Rule 4: NaN in v[key 0, column 3]: column 3 NaN in every row, the others finite.
  PagedCase c;
  c.name = "v_nan";
  c.seqs = {{2, 300, 1}};
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.v_poison = kNaN;
  const Result r = Check(c);
  for (size_t e = 0; e < r.out.size(); ++e) {
    EXPECT_EQ(std::isnan(r.out[e]), e % c.v_head_dim == 3) << e;
  }
}

// Batch invariance: a sequence's out and lse bits are the same alone and among companions
// (longer, shorter, a prefill chunk), with its pages elsewhere in a larger pool.
TEST_P(PagedAttentionEmuTest, BatchInvariantBitwise) {
  PagedCase alone;
  alone.name = "alone";
  alone.seqs = {{1, 700, 42}};
  alone.num_heads = 4;
  alone.num_kv_heads = 1;
  PagedCase packed = alone;
  packed.name = "packed";
  packed.seqs = {{4, 40, 1}, {1, 700, 42}, {1, 1300, 2}};
  packed.layout_seed = 99;
  packed.extra_pages = 11;
  const Result a = Check(alone);
  const Result b = Check(packed);
  const size_t row = size_t(alone.num_heads) * alone.v_head_dim;
  const size_t at = b.q_offsets[1];
  ASSERT_EQ(a.out.size(), row);
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data() + at * row, row * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data() + at * alone.num_heads,
                        alone.num_heads * sizeof(float)),
            0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedAttentionEmuTest,
                         testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// The scatter of new rows into a device store's pages (paged_scatter_kernel.h, the device
// PageStore's WriteRows): rows at random (page, kv head, slot) places, the first and the last
// row of the pages among them, D != Dv (a V row placed at the K row width lands elsewhere),
// every cache element width. Each written row must hold its source's bytes at the place
// PagedAttentionParams::k_offset / v_offset give; every other byte keeps its fill. The kernel
// runs with the grid its launch code (paged_attention.cu) gives and with fewer blocks (its
// threads then stride over the rest).
template <typename Word>
void CheckScatter(DType dtype, unsigned blocks_cap) {
  SCOPED_TRACE(DTypeName(dtype));
  ASSERT_EQ(sizeof(Word), DTypeSize(dtype));
  PageStoreShape shape;
  shape.num_kv_heads = 2;
  shape.head_dim = 40;
  shape.v_head_dim = 72;
  shape.page_size = 16;
  shape.dtype = dtype;
  shape.capacity = 5;
  PagedAttentionParams p;  // for its offsets
  p.set_layout(shape);
  const int64_t all_rows = int64_t{shape.capacity} * shape.num_kv_heads * shape.page_size;
  std::mt19937 rng(11);
  std::vector<int64_t> order(all_rows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  // 37 distinct places, among them the pages' first and last rows (page 4, head 1, slot 15).
  std::vector<std::array<int, 3>> places;
  std::vector<int64_t> rows;
  for (int64_t r : order) {
    if (static_cast<int>(places.size()) == 35) break;
    if (r == 0 || r == all_rows - 1) continue;
    places.push_back({static_cast<int>(r / (shape.num_kv_heads * shape.page_size)),
                      static_cast<int>(r / shape.page_size % shape.num_kv_heads),
                      static_cast<int>(r % shape.page_size)});
  }
  places.push_back({0, 0, 0});
  places.push_back({shape.capacity - 1, shape.num_kv_heads - 1, shape.page_size - 1});
  for (const auto& [page, head, slot] : places) rows.push_back(shape.row(page, head, slot));
  const int64_t n = static_cast<int64_t>(rows.size());
  const int D = shape.head_dim, Dv = shape.v_head_dim;
  std::vector<Word> k_src(size_t(n) * D), v_src(size_t(n) * Dv);
  for (Word& w : k_src) w = static_cast<Word>(rng());
  for (Word& w : v_src) w = static_cast<Word>(rng());
  const size_t k_words = size_t(shape.capacity) * shape.k_page_bytes() / sizeof(Word);
  const size_t v_words = size_t(shape.capacity) * shape.v_page_bytes() / sizeof(Word);
  const Word fill = static_cast<Word>(0xa5a5a5a5u);
  std::vector<Word> k_want(k_words, fill), v_want(v_words, fill);
  for (int64_t i = 0; i < n; ++i) {
    const auto& [page, head, slot] = places[i];
    std::copy_n(&k_src[size_t(i) * D], D, &k_want[p.k_offset(page, head, slot)]);
    std::copy_n(&v_src[size_t(i) * Dv], Dv, &v_want[p.v_offset(page, head, slot)]);
  }
  const int64_t words = n * (D + Dv);
  const unsigned blocks = std::min<unsigned>(
      blocks_cap,
      static_cast<unsigned>((words + PagedScatterThreads() - 1) / PagedScatterThreads()));
  // Exact-size buffers (ASan sees a write past the pages or a read past the rows).
  std::unique_ptr<Word[]> k_pages(new Word[k_words]), v_pages(new Word[v_words]);
  std::fill_n(k_pages.get(), k_words, fill);
  std::fill_n(v_pages.get(), v_words, fill);
  std::unique_ptr<int64_t[]> rows_dev(new int64_t[rows.size()]);
  std::copy(rows.begin(), rows.end(), rows_dev.get());
  LaunchPagedScatter<Word>(k_src.data(), v_src.data(), rows_dev.get(), n, D, Dv, k_pages.get(),
                           v_pages.get(), blocks);
  size_t bad = 0;
  for (size_t e = 0; e < k_words; ++e) {
    if (k_pages[e] != k_want[e] && ++bad <= 5) ADD_FAILURE() << "K element " << e;
  }
  for (size_t e = 0; e < v_words; ++e) {
    if (v_pages[e] != v_want[e] && ++bad <= 10) ADD_FAILURE() << "V element " << e;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(PagedScatterEmuTest, RowsLandInTheirPlaces) {
  CheckScatter<uint16_t>(DType::kFloat16, 1u << 20);
  CheckScatter<uint16_t>(DType::kBFloat16, 3);
  CheckScatter<uint32_t>(DType::kFloat32, 2);
}

}  // namespace
}  // namespace attnserve::kernels::cuda
