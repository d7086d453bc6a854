// CpuBackend::PagedAttention (kernels/cpu/paged_attention.cc and the per-ISA bodies) against the
// float64 reference ReferencePagedAttention64, on every ISA this CPU runs.
//
// Tolerance: the FlashAttention bound of the CPU backend's other tests, err(fast) <=
// 2 · err(naive float32) + 1e-6, both max-abs errors against float64, for out and for lse; the
// naive side is NaivePaged32 below (scores materialised per row, float accumulation, std::exp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/reference.h"
#include "tests/kernels/cpu/attention_test_util.h"

namespace attnserve::kernels::cpu {
namespace {

using ::attnserve::kernels::testing::Encode16;
using ::attnserve::kernels::testing::MaxAbsError;
using ::attnserve::kernels::testing::RandomVector;

// A kernel path: the backend's Isa, and its 16-bit path (kAvx512Bf16 with kAvx512: BFLOAT16
// scores by AVX512_BF16 dot products; kNone: float32 arithmetic throughout).
struct Path {
  Isa isa;
  Bf16Isa bf16;
};

std::unique_ptr<CpuBackend> MakeBackend(Path path, int threads) {
  auto backend = CpuBackend::Create(
      CpuBackendOptions{.num_threads = threads,
                        .min_flops_per_thread = 0,  // the tests' small steps on every thread
                        .isa = path.isa,
                        .bf16_isa = path.bf16});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

struct SeqSpec {
  int kv_len;
  int q_len;
};

struct PagedSpec {
  int num_heads = 4;
  int num_kv_heads = 1;
  int head_dim = 64;
  int v_head_dim = 64;
  int page_size = 16;
  DType dtype = DType::kFloat32;
  // Queries in float32 (q_dtype FLOAT32, values not representable in dtype) instead of in dtype.
  bool float32_queries = false;
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;

  std::string DebugString() const {
    std::string s = absl::StrCat("Hq ", num_heads, " Hkv ", num_kv_heads, " D ", head_dim, " Dv ",
                                 v_head_dim, " page ", page_size, " dtype ", DTypeName(dtype),
                                 float32_queries ? " q float32" : "", " seqs");
    for (const SeqSpec& q : seqs) absl::StrAppend(&s, " (", q.kv_len, ",", q.q_len, ")");
    return s;
  }
};

// A paged problem that owns its pool. Pages are handed out in a random order (each sequence's
// pages scattered through the pool), with a few spare pages; every slot no sequence owns holds
// NaN, so a kernel reading past a sequence's keys shows.
class PagedCase {
 public:
  explicit PagedCase(const PagedSpec& spec) : spec_(spec) {
    const int n = static_cast<int>(spec.seqs.size());
    int pages = 3;
    for (const SeqSpec& s : spec.seqs) {
      pages += (s.kv_len + spec.page_size - 1) / spec.page_size;
      max_pages_ = std::max(max_pages_, (s.kv_len + spec.page_size - 1) / spec.page_size);
    }
    std::vector<int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(spec.seed);
    std::shuffle(order.begin(), order.end(), rng);
    table_.assign(int64_t{n} * max_pages_, -1);
    int used = 0, total_q = 0;
    for (int s = 0; s < n; ++s) {
      const int seq_pages = (spec.seqs[s].kv_len + spec.page_size - 1) / spec.page_size;
      for (int i = 0; i < seq_pages; ++i) table_[int64_t{s} * max_pages_ + i] = order[used++];
      kv_lens_.push_back(spec.seqs[s].kv_len);
      q_lens_.push_back(spec.seqs[s].q_len);
      q_offsets_.push_back(total_q);
      total_q += spec.seqs[s].q_len;
    }
    spare_ = order[used];  // owned by no sequence: holds NaN
    const PagedAttentionParams shape = Shape(pages, total_q);
    k_.assign(pages * shape.k_page_stride(), std::numeric_limits<float>::quiet_NaN());
    v_.assign(pages * shape.v_page_stride(), std::numeric_limits<float>::quiet_NaN());
    // Values drawn in dtype, per sequence and kv head, then placed in the pages.
    uint32_t seed = spec.seed * 1000;
    for (int s = 0; s < n; ++s) {
      const int kv = spec.seqs[s].kv_len;
      for (int h = 0; h < spec.num_kv_heads; ++h) {
        const std::vector<float> kk = RandomVector(int64_t{kv} * spec.head_dim, ++seed, spec.dtype);
        const std::vector<float> vv =
            RandomVector(int64_t{kv} * spec.v_head_dim, ++seed, spec.dtype);
        for (int j = 0; j < kv; ++j) {
          const int32_t page = table_[int64_t{s} * max_pages_ + j / spec.page_size];
          std::copy_n(kk.begin() + int64_t{j} * spec.head_dim, spec.head_dim,
                      k_.begin() + shape.k_offset(page, h, j % spec.page_size));
          std::copy_n(vv.begin() + int64_t{j} * spec.v_head_dim, spec.v_head_dim,
                      v_.begin() + shape.v_offset(page, h, j % spec.page_size));
        }
      }
    }
    q_ = RandomVector(int64_t{total_q} * spec.num_heads * spec.head_dim, ++seed,
                      spec.float32_queries ? DType::kFloat32 : spec.dtype);
    Encode();
    out_.assign(int64_t{total_q} * spec.num_heads * spec.v_head_dim, 0.0f);
    lse_.assign(int64_t{total_q} * spec.num_heads, 0.0f);
    num_pages_ = pages;
  }
  PagedCase(const PagedCase&) = delete;
  PagedCase& operator=(const PagedCase&) = delete;

  // The parameters (inputs in spec().dtype), writing out() and lse().
  PagedAttentionParams params() {
    PagedAttentionParams p = Shape(num_pages_, static_cast<int>(lse_.size()) / spec_.num_heads);
    p.k_pages = Data(k_, k16_);
    p.v_pages = Data(v_, v16_);
    p.q = spec_.float32_queries ? q_.data() : Data(q_, q16_);
    p.page_table = table_.data();
    p.kv_lens = kv_lens_.data();
    p.q_lens = q_lens_.data();
    p.q_offsets = q_offsets_.data();
    p.out = out_.data();
    p.lse = lse_.data();
    return p;
  }
  // Re-encodes the 16-bit copies after the float values were edited.
  void Encode() {
    if (spec_.dtype == DType::kFloat32) return;
    k16_ = Encode16(spec_.dtype, k_);
    v16_ = Encode16(spec_.dtype, v_);
    q16_ = Encode16(spec_.dtype, q_);
  }
  void PoisonOutputs() {
    std::fill(out_.begin(), out_.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(lse_.begin(), lse_.end(), std::numeric_limits<float>::quiet_NaN());
  }

  const PagedSpec& spec() const { return spec_; }
  std::vector<float>& q() { return q_; }
  std::vector<float>& k() { return k_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& out() const { return out_; }
  const std::vector<float>& lse() const { return lse_; }
  int32_t page(int seq, int j) const {
    return table_[int64_t{seq} * max_pages_ + j / spec_.page_size];
  }
  // A page no sequence owns (every element NaN).
  int32_t spare_page() const { return spare_; }
  int max_pages() const { return max_pages_; }

 private:
  PagedAttentionParams Shape(int pages, int total_q) const {
    (void)pages;
    PagedAttentionParams p;
    p.num_seqs = static_cast<int>(spec_.seqs.size());
    p.num_heads = spec_.num_heads;
    p.num_kv_heads = spec_.num_kv_heads;
    p.head_dim = spec_.head_dim;
    p.v_head_dim = spec_.v_head_dim;
    p.page_size = spec_.page_size;
    p.max_pages_per_seq = max_pages_;
    p.dtype = spec_.dtype;
    p.q_dtype = spec_.float32_queries ? DType::kFloat32 : spec_.dtype;
    p.total_q = total_q;
    p.scale = 1.0f / std::sqrt(static_cast<float>(spec_.head_dim));
    return p;
  }
  const void* Data(const std::vector<float>& f, const std::vector<uint16_t>& h) const {
    return spec_.dtype == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data();
  }

  PagedSpec spec_;
  int max_pages_ = 1;
  int num_pages_ = 0;
  int32_t spare_ = 0;
  std::vector<int32_t> table_, kv_lens_, q_lens_, q_offsets_;
  std::vector<float> k_, v_, q_, out_, lse_;
  std::vector<uint16_t> k16_, v16_, q16_;
};

// Plain float32 paged attention (the float values of the case; 16-bit ones are exact in float):
// scores materialised per row, float accumulation in key order, std::exp.
void NaivePaged32(PagedCase& c, std::vector<float>* out, std::vector<float>* lse) {
  const PagedAttentionParams p = c.params();
  const int group = p.num_heads / p.num_kv_heads;
  out->assign(c.out().size(), 0.0f);
  lse->assign(c.lse().size(), 0.0f);
  std::vector<float> s;
  for (int q = 0; q < p.num_seqs; ++q) {
    for (int r = 0; r < p.q_lens[q]; ++r) {
      const int64_t t = p.q_offsets[q] + r;
      const int keys = p.kv_lens[q] - p.q_lens[q] + r + 1;
      for (int h = 0; h < p.num_heads; ++h) {
        const float* qr = c.q().data() + (t * p.num_heads + h) * p.head_dim;
        s.assign(keys, 0.0f);
        float mx = -INFINITY;
        for (int j = 0; j < keys; ++j) {
          const float* kr = c.k().data() + p.k_offset(c.page(q, j), h / group, j % p.page_size);
          float dot = 0.0f;
          for (int d = 0; d < p.head_dim; ++d) dot += qr[d] * kr[d];
          s[j] = dot * p.scale;
          mx = std::max(mx, s[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j < keys; ++j) sum += s[j] = std::exp(s[j] - mx);
        float* o = out->data() + (t * p.num_heads + h) * p.v_head_dim;
        for (int j = 0; j < keys; ++j) {
          const float* vr = c.v().data() + p.v_offset(c.page(q, j), h / group, j % p.page_size);
          for (int d = 0; d < p.v_head_dim; ++d) o[d] += s[j] / sum * vr[d];
        }
        (*lse)[t * p.num_heads + h] = mx + std::log(sum);
      }
    }
  }
}

// Rows [t0, t0 + n) of a [total_q, ...] array with `width` floats per row.
std::vector<float> Rows(const std::vector<float>& a, int64_t t0, int64_t n, int64_t width) {
  return std::vector<float>(a.begin() + t0 * width, a.begin() + (t0 + n) * width);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every kernel path the backend has; the tests below run those this CPU supports.
const Path kPaths[] = {{Isa::kGeneric, Bf16Isa::kNone},
                       {Isa::kAvx2, Bf16Isa::kNone},
                       {Isa::kAvx512, Bf16Isa::kNone},
                       {Isa::kAvx512, Bf16Isa::kAvx512Bf16}};

std::string PathName(Path path) {
  return path.bf16 == Bf16Isa::kNone ? std::string(IsaName(path.isa))
                                     : absl::StrCat(IsaName(path.isa), "_", Bf16IsaName(path.bf16));
}

// The backends of the paths this CPU supports, by name.
std::vector<std::pair<std::string, std::unique_ptr<CpuBackend>>> SupportedBackends(int threads) {
  std::vector<std::pair<std::string, std::unique_ptr<CpuBackend>>> out;
  for (const Path& path : kPaths) {
    if (CpuSupports(path.isa) && CpuSupports(path.bf16)) {
      out.emplace_back(PathName(path), MakeBackend(path, threads));
    }
  }
  return out;
}

class PagedAttentionIsaTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam().isa) || !CpuSupports(GetParam().bf16)) {
      GTEST_SKIP() << IsaName(GetParam().isa) << " / " << Bf16IsaName(GetParam().bf16)
                   << " not supported by this CPU";
    }
  }
};

// The sweep: page sizes 1, 16, 64; kv lens around the split size (kPagedSplitKeys 256) and long;
// q_len 1 (decode, split over tasks) and > 1 (row blocks folding their own splits, up to a full
// prefill); GQA 8/2, 4/1, 1/1; D 64 and 128, Dv != D; three cache dtypes.
//
// Every path in one test, each case's float64 reference computed once for all of them: the
// reference is most of the cost (three quarters here, more under the sanitizers).
TEST(PagedAttentionTest, MatchesReferenceWithinFlashBoundOnEveryPath) {
  const auto backends = SupportedBackends(2);
  struct Heads {
    int hq, hkv, d, dv;
  };
  const Heads heads[] = {{8, 2, 64, 64}, {4, 1, 128, 128}, {1, 1, 128, 64}, {8, 2, 64, 80}};
  const std::vector<SeqSpec> seqs = {{1, 1},     {255, 1},  {256, 1},   {257, 1},
                                     {1000, 1},  {4096, 1}, {255, 255}, {257, 40},
                                     {1000, 17}, {4096, 5}, {300, 2},   {1, 1}};
  uint32_t seed = 100;
  // Each head layout with each page size, the dtype rotating so that every head layout and every
  // page size meets all three dtypes (12 cases; the full product took minutes under ctest).
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const int pages[] = {1, 16, 64};
  for (int hi = 0; hi < 4; ++hi) {
    const Heads& hd = heads[hi];
    for (int pi = 0; pi < 3; ++pi) {
      const int page = pages[pi];
      const DType dtype = dtypes[(hi + pi) % 3];
      PagedSpec spec{.num_heads = hd.hq,
                     .num_kv_heads = hd.hkv,
                     .head_dim = hd.d,
                     .v_head_dim = hd.dv,
                     .page_size = page,
                     .dtype = dtype,
                     .seqs = seqs,
                     .seed = ++seed};
      PagedCase c(spec);
      // The float64 reference, and the naive float32 computation's error against it (the
      // bound), once for every path: they do not depend on it.
      std::vector<float> naive_out, naive_lse;
      NaivePaged32(c, &naive_out, &naive_lse);
      const Reference64 ref = ReferencePagedAttention64(c.params());
      const double naive_out_err = MaxAbsError(naive_out, ref.out);
      const double naive_lse_err = MaxAbsError(naive_lse, ref.weights);
      for (const auto& [name, backend] : backends) {
        c.PoisonOutputs();
        ASSERT_TRUE(backend->PagedAttention(c.params()).ok()) << name;
        EXPECT_LE(MaxAbsError(c.out(), ref.out), 2 * naive_out_err + 1e-6)
            << name << " " << spec.DebugString() << ": naive " << naive_out_err;
        EXPECT_LE(MaxAbsError(c.lse(), ref.weights), 2 * naive_lse_err + 1e-6)
            << name << " " << spec.DebugString() << ": naive " << naive_lse_err;
      }
    }
  }
}

// Only keys and values are rounded to a 16-bit cache's type: float32 queries (values no 16-bit
// type holds) are used as they are, within the same bound against the float64 reference, which
// reads them as they are too. Rounding them to the cache's type, as the server once did, misses
// it by about one rounding of q (some 1e-3 for bfloat16 against a bound near 1e-6). Beside them,
// bfloat16 queries on a bfloat16 cache (the dot-product path) at head dims that are not a
// multiple of its 32-element pairs.
TEST_P(PagedAttentionIsaTest, Float32QueriesOverSixteenBitCachesAreNotRounded) {
  std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), 2);
  const std::vector<SeqSpec> seqs = {{1, 1}, {300, 1}, {257, 40}, {70, 70}};
  struct Case {
    DType dtype;
    bool float32_queries;
    int head_dim;
  };
  for (const Case& k : {Case{DType::kFloat16, true, 64}, Case{DType::kBFloat16, true, 64},
                        Case{DType::kBFloat16, true, 40}, Case{DType::kBFloat16, false, 40},
                        Case{DType::kBFloat16, false, 72}}) {
    PagedSpec spec{.num_heads = 8,
                   .num_kv_heads = 2,
                   .head_dim = k.head_dim,
                   .v_head_dim = k.head_dim,
                   .page_size = 16,
                   .dtype = k.dtype,
                   .float32_queries = k.float32_queries,
                   .seqs = seqs,
                   .seed = 41};
    PagedCase c(spec);
    std::vector<float> naive_out, naive_lse;
    NaivePaged32(c, &naive_out, &naive_lse);
    const Reference64 ref = ReferencePagedAttention64(c.params());
    c.PoisonOutputs();
    ASSERT_TRUE(backend->PagedAttention(c.params()).ok());
    const double naive_err = MaxAbsError(naive_out, ref.out);
    EXPECT_LE(MaxAbsError(c.out(), ref.out), 2 * naive_err + 1e-6)
        << spec.DebugString() << ": naive " << naive_err;
    const double naive_lse_err = MaxAbsError(naive_lse, ref.weights);
    EXPECT_LE(MaxAbsError(c.lse(), ref.weights), 2 * naive_lse_err + 1e-6)
        << spec.DebugString() << ": naive " << naive_lse_err;
  }
}

// Without lse the outputs are the same and nothing is written through a null lse.
TEST_P(PagedAttentionIsaTest, LseIsOptional) {
  std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), 2);
  PagedCase c({.num_heads = 8,
               .num_kv_heads = 2,
               .page_size = 16,
               .dtype = DType::kFloat16,
               .seqs = {{700, 1}, {90, 30}},
               .seed = 7});
  ASSERT_TRUE(backend->PagedAttention(c.params()).ok());
  const std::vector<float> with_lse = c.out();
  c.PoisonOutputs();
  PagedAttentionParams p = c.params();
  p.lse = nullptr;
  ASSERT_TRUE(backend->PagedAttention(p).ok());
  EXPECT_TRUE(SameBits(c.out(), with_lse));
}

// Batch invariance, bitwise: a sequence alone on one thread, among companions (placed elsewhere in
// a larger pool, in the middle of the batch) on 1, 2 and 3 threads give the same out and lse
// bits, for a decode step (split over tasks) and a prefill chunk (row blocks). The decode tasks
// group different numbers of consecutive splits (alone: 1; the crowd on 1 thread: 3).
TEST_P(PagedAttentionIsaTest, RowsAreBatchInvariantBitwise) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (SeqSpec target : {SeqSpec{1500, 1}, SeqSpec{600, 37}}) {
      PagedSpec alone_spec{.num_heads = 8,
                           .num_kv_heads = 2,
                           .head_dim = 128,
                           .v_head_dim = 128,
                           .page_size = 16,
                           .dtype = dtype,
                           .seqs = {target},
                           .seed = 3};
      PagedCase alone(alone_spec);
      PagedSpec crowd_spec = alone_spec;
      crowd_spec.seqs = {{300, 1}, {2000, 20}, target, {5, 5}, {4096, 1}};
      crowd_spec.seed = 4;
      PagedCase crowd(crowd_spec);
      // The target's data in the crowd: the same values, in other pages.
      const PagedAttentionParams pa = alone.params(), pc = crowd.params();
      for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < target.kv_len; ++j) {
          std::copy_n(alone.k().begin() + pa.k_offset(alone.page(0, j), h, j % 16), 128,
                      crowd.k().begin() + pc.k_offset(crowd.page(2, j), h, j % 16));
          std::copy_n(alone.v().begin() + pa.v_offset(alone.page(0, j), h, j % 16), 128,
                      crowd.v().begin() + pc.v_offset(crowd.page(2, j), h, j % 16));
        }
      }
      const int64_t t0 = 21, qw = 8 * 128;  // the target's first row in the crowd
      std::copy(alone.q().begin(), alone.q().end(), crowd.q().begin() + t0 * qw);
      crowd.Encode();

      ASSERT_TRUE(MakeBackend(GetParam(), 1)->PagedAttention(alone.params()).ok());
      for (int threads : {1, 2, 3}) {
        crowd.PoisonOutputs();
        ASSERT_TRUE(MakeBackend(GetParam(), threads)->PagedAttention(crowd.params()).ok());
        EXPECT_TRUE(SameBits(Rows(crowd.out(), t0, target.q_len, 8 * 128), alone.out()))
            << DTypeName(dtype) << " q_len " << target.q_len << " threads " << threads;
        EXPECT_TRUE(SameBits(Rows(crowd.lse(), t0, target.q_len, 8), alone.lse()))
            << DTypeName(dtype) << " q_len " << target.q_len << " threads " << threads;
      }
    }
  }
}

// A decode step gives the bits its row gets inside a longer prefill chunk (same query, same keys):
// blocking and split scheduling do not touch a row's arithmetic (paged_attention_kernel.h).
TEST_P(PagedAttentionIsaTest, DecodeStepEqualsLastRowOfPrefillBitwise) {
  std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), 2);
  PagedCase c({.num_heads = 8,
               .num_kv_heads = 2,
               .head_dim = 128,
               .v_head_dim = 128,
               .page_size = 16,
               .dtype = DType::kFloat16,
               .seqs = {{1000, 40}, {1000, 1}},
               .seed = 9});
  // Sequence 1: the keys of sequence 0 and the query of its last row.
  const PagedAttentionParams p = c.params();
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 1000; ++j) {
      std::copy_n(c.k().begin() + p.k_offset(c.page(0, j), h, j % 16), 128,
                  c.k().begin() + p.k_offset(c.page(1, j), h, j % 16));
      std::copy_n(c.v().begin() + p.v_offset(c.page(0, j), h, j % 16), 128,
                  c.v().begin() + p.v_offset(c.page(1, j), h, j % 16));
    }
  }
  std::copy_n(c.q().begin() + 39 * 8 * 128, 8 * 128, c.q().begin() + 40 * 8 * 128);
  c.Encode();
  ASSERT_TRUE(backend->PagedAttention(c.params()).ok());
  EXPECT_TRUE(SameBits(Rows(c.out(), 39, 1, 8 * 128), Rows(c.out(), 40, 1, 8 * 128)));
  EXPECT_TRUE(SameBits(Rows(c.lse(), 39, 1, 8), Rows(c.lse(), 40, 1, 8)));
}

// The NaN rule of attention_params.h: a NaN in a row's query, or +inf among its allowed scores,
// makes that row NaN; a NaN in the key of a causally blocked key has no effect; a row whose
// allowed scores are all -inf gets the mean of all the sequence's values (lse -inf).
TEST_P(PagedAttentionIsaTest, FollowsTheNanRule) {
  std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  PagedCase c({.num_heads = 2,
               .num_kv_heads = 1,
               .head_dim = 16,
               .v_head_dim = 16,
               .page_size = 16,
               .dtype = DType::kFloat32,
               .seqs = {{600, 1}, {300, 10}, {40, 1}, {50, 1}},
               .seed = 11});
  const PagedAttentionParams p = c.params();
  // Sequence 0 (decode, split over tasks): NaN in head 1's query.
  c.q()[1 * 16 + 3] = nan;
  // Sequence 1 (prefill rows 0..9 at positions 290..299): NaN in the key at position 295,
  // allowed to rows 5..9 only, causally blocked for rows 0..4.
  c.k()[p.k_offset(c.page(1, 295), 0, 295 % 16) + 2] = nan;
  // Sequence 3: +inf in column 0 of key 10, a positive query column 0: a +inf score, NaN rows.
  c.k()[p.k_offset(c.page(3, 10), 0, 10)] = inf;
  for (int h = 0; h < 2; ++h) c.q()[(12 * 2 + h) * 16] = 1.0f;
  // Sequence 2: head 0's query +inf in column 0, every key's column 0 negative, other columns 0:
  // every score -inf.
  for (int d = 0; d < 16; ++d) c.q()[(11 * 2 + 0) * 16 + d] = d == 0 ? inf : 0.0f;
  for (int j = 0; j < 40; ++j) {
    float& k0 = c.k()[p.k_offset(c.page(2, j), 0, j % 16)];
    k0 = -std::abs(k0) - 0.5f;
  }
  c.PoisonOutputs();
  ASSERT_TRUE(backend->PagedAttention(c.params()).ok());
  auto row_nan = [&](int64_t t, int h) {
    bool all = true;
    for (int d = 0; d < 16; ++d) all &= std::isnan(c.out()[(t * 2 + h) * 16 + d]);
    return all && std::isnan(c.lse()[t * 2 + h]);
  };
  auto row_finite = [&](int64_t t, int h) {
    bool all = std::isfinite(c.lse()[t * 2 + h]);
    for (int d = 0; d < 16; ++d) all &= std::isfinite(c.out()[(t * 2 + h) * 16 + d]);
    return all;
  };
  EXPECT_TRUE(row_finite(0, 0));
  EXPECT_TRUE(row_nan(0, 1));
  // Sequence 1: row r (t = 1 + r) sees keys 0..290 + r; key 295 is allowed from r = 5.
  for (int r = 0; r < 10; ++r) {
    for (int h = 0; h < 2; ++h) {
      if (r < 5) {
        EXPECT_TRUE(row_finite(1 + r, h)) << "row " << r;
      } else {
        EXPECT_TRUE(row_nan(1 + r, h)) << "row " << r;
      }
    }
  }
  // Sequence 2: head 0 all -inf -> mean of the 40 values; head 1 finite as usual.
  for (int d = 0; d < 16; ++d) {
    double mean = 0;
    for (int j = 0; j < 40; ++j) mean += c.v()[p.v_offset(c.page(2, j), 0, j % 16) + d];
    EXPECT_NEAR(c.out()[(11 * 2 + 0) * 16 + d], mean / 40, 1e-5) << "col " << d;
  }
  EXPECT_EQ(c.lse()[11 * 2 + 0], -inf);
  EXPECT_TRUE(row_finite(11, 1));
  EXPECT_TRUE(row_nan(12, 0));
  EXPECT_TRUE(row_nan(12, 1));
}

// Score modifications (a window, soft-capping, ALiBi) as Attend applies them, against the
// float64 paged reference: decode steps over many splits (windows ending inside, and far past,
// the first splits, which the kernel skips), a prefill whose rows' windows start in different
// splits, and GQA with a slope per query head. Each modification changes the answer (the
// reference without it differs by far more than the bound).
TEST(PagedAttentionTest, ScoreModsMatchTheReferenceOnEveryPath) {
  const auto backends = SupportedBackends(2);
  const std::vector<float> slopes = {0.5f,     0.25f,   0.125f,  0.0625f,
                                     0.03125f, 0.0156f, 0.0078f, 0.0039f};
  struct ModCase {
    const char* name;
    int window_left;
    float softcap;
    bool alibi;
  };
  const ModCase cases[] = {{"window", 300, 0.0f, false},
                           {"window of 1", 0, 0.0f, false},
                           {"softcap", -1, 0.75f, false},
                           {"alibi", -1, 0.0f, true},
                           {"all three", 600, 1.5f, true}};
  uint32_t seed = 500;
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const ModCase& m : cases) {
      PagedSpec spec{.num_heads = 8,
                     .num_kv_heads = 2,
                     .head_dim = 64,
                     .v_head_dim = 64,
                     .page_size = 16,
                     .dtype = dtype,
                     .seqs = {{1300, 1}, {600, 1}, {530, 40}, {40, 40}, {257, 2}},
                     .seed = ++seed};
      PagedCase c(spec);
      PagedAttentionParams p = c.params();
      p.window_left = m.window_left;
      p.softcap = m.softcap;
      p.alibi_slopes = m.alibi ? slopes.data() : nullptr;
      const std::string what = absl::StrCat(m.name, " ", DTypeName(dtype));
      // The float64 reference, computed once for every path (it does not depend on it).
      const Reference64 want = ReferencePagedAttention64(p);
      const Reference64 plain = ReferencePagedAttention64(c.params());
      double effect = 0;
      for (size_t n = 0; n < plain.out.size(); ++n) {
        effect = std::max(effect, std::fabs(want.out[n] - plain.out[n]));
      }
      EXPECT_GT(effect, 1e-2) << what << ": the case must matter";
      // A session drops the pages wholly before the split holding its next token's window
      // start (server/sessions/session_table.h): here they point at a page of NaN, which any
      // read would spread into the output.
      std::vector<int32_t> table(p.page_table, p.page_table + p.num_seqs * c.max_pages());
      if (m.window_left >= 0) {
        for (int q = 0; q < p.num_seqs; ++q) {
          const int first = std::max(0, p.kv_lens[q] - p.q_lens[q] - m.window_left);
          const int dropped = first / kPagedSplitKeys * kPagedSplitKeys / p.page_size;
          for (int i = 0; i < dropped; ++i) table[q * c.max_pages() + i] = c.spare_page();
        }
        p.page_table = table.data();
      }
      for (const auto& [name, backend] : backends) {
        c.PoisonOutputs();
        ASSERT_TRUE(backend->PagedAttention(p).ok()) << name;
        EXPECT_LE(MaxAbsError(c.out(), want.out), 2e-5) << name << " " << what;
        EXPECT_LE(MaxAbsError(c.lse(), want.weights), 2e-5) << name << " " << what;
      }
    }
  }
}

// The paged reference's modifications are Attend's: each sequence's rows equal the dense float64
// reference's causal rows with the same window {left, 0}, soft-cap and ALiBi (an independent
// implementation: kernels/reference.cc's dense path).
TEST(PagedAttentionTest, ReferenceScoreModsAreAttendsOnTheSameKeys) {
  PagedSpec spec{.num_heads = 4,
                 .num_kv_heads = 2,
                 .head_dim = 32,
                 .v_head_dim = 16,
                 .page_size = 8,
                 .seqs = {{70, 9}, {33, 33}},
                 .seed = 77};
  PagedCase c(spec);
  const std::vector<float> slopes = {0.5f, 0.2f, 0.1f, 0.05f};
  PagedAttentionParams p = c.params();
  p.window_left = 12;
  p.softcap = 1.25f;
  p.alibi_slopes = slopes.data();
  const Reference64 paged = ReferencePagedAttention64(p);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int lk = p.kv_lens[s], lq = p.q_lens[s];
    // The sequence's keys and values, dense [Lk, Hkv, D] from its pages.
    std::vector<float> k(size_t(lk) * p.num_kv_heads * p.head_dim);
    std::vector<float> v(size_t(lk) * p.num_kv_heads * p.v_head_dim);
    for (int j = 0; j < lk; ++j) {
      for (int g = 0; g < p.num_kv_heads; ++g) {
        std::copy_n(c.k().begin() + p.k_offset(c.page(s, j), g, j % p.page_size), p.head_dim,
                    k.begin() + (size_t(j) * p.num_kv_heads + g) * p.head_dim);
        std::copy_n(c.v().begin() + p.v_offset(c.page(s, j), g, j % p.page_size), p.v_head_dim,
                    v.begin() + (size_t(j) * p.num_kv_heads + g) * p.v_head_dim);
      }
    }
    AttentionParams a;
    a.batch = 1;
    a.num_heads = p.num_heads;
    a.num_kv_heads = p.num_kv_heads;
    a.q_len = lq;
    a.kv_len = lk;
    a.head_dim = p.head_dim;
    a.v_head_dim = p.v_head_dim;
    const float* q = c.q().data() + size_t(p.q_offsets[s]) * p.num_heads * p.head_dim;
    a.q = {q, 0, p.head_dim, int64_t{p.num_heads} * p.head_dim};
    a.k = {k.data(), 0, p.head_dim, int64_t{p.num_kv_heads} * p.head_dim};
    a.v = {v.data(), 0, p.v_head_dim, int64_t{p.num_kv_heads} * p.v_head_dim};
    a.causal = true;
    a.scale = p.scale;
    a.mods = {
        .window_left = 12, .window_right = 0, .softcap = 1.25f, .alibi_slopes = slopes.data()};
    const Reference64 dense = ReferenceAttention64(a);  // out [H, Lq, Dv]
    double worst = 0;
    for (int h = 0; h < p.num_heads; ++h) {
      for (int i = 0; i < lq; ++i) {
        for (int d = 0; d < p.v_head_dim; ++d) {
          const double x =
              paged.out[((size_t(p.q_offsets[s]) + i) * p.num_heads + h) * p.v_head_dim + d];
          const double y = dense.out[(size_t(h) * lq + i) * p.v_head_dim + d];
          worst = std::max(worst, std::fabs(x - y));
        }
      }
    }
    EXPECT_LE(worst, 1e-12) << "sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, PagedAttentionIsaTest, ::testing::ValuesIn(kPaths),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return PathName(info.param);
                         });

// Which paged kernel a backend runs: the AVX512_BF16 scores only with Isa kAvx512 and a 16-bit
// path; FLOAT32 and FLOAT16 caches get the same bits either way.
TEST(PagedAttentionTest, Bf16DotChangesOnlyBFloat16Caches) {
  if (!CpuSupports(Isa::kAvx512) || !CpuSupports(Bf16Isa::kAvx512Bf16)) {
    GTEST_SKIP() << "avx512 / avx512_bf16 not supported by this CPU";
  }
  std::unique_ptr<CpuBackend> plain = MakeBackend({Isa::kAvx512, Bf16Isa::kNone}, 2);
  std::unique_ptr<CpuBackend> dot = MakeBackend({Isa::kAvx512, Bf16Isa::kAvx512Bf16}, 2);
  EXPECT_STREQ(plain->paged_kernel_name(), "avx512");
  EXPECT_STREQ(dot->paged_kernel_name(), "avx512_bf16");
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    PagedCase c({.num_heads = 8,
                 .num_kv_heads = 2,
                 .head_dim = 128,
                 .v_head_dim = 128,
                 .dtype = dtype,
                 .seqs = {{700, 1}, {90, 30}},
                 .seed = 13});
    ASSERT_TRUE(plain->PagedAttention(c.params()).ok());
    const std::vector<float> a = c.out();
    ASSERT_TRUE(dot->PagedAttention(c.params()).ok());
    EXPECT_EQ(SameBits(a, c.out()), dtype != DType::kBFloat16) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace attnserve::kernels::cpu
