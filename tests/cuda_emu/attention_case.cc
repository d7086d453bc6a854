// The attention cases of the CUDA emulation tests (attention_case.h).
#include "tests/cuda_emu/attention_case.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/reference.h"

namespace attnserve::kernels::cuda {

Buffer16 MakeBuffer(size_t n, ComputeType type, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Buffer16 b;
  b.bits.reset(new uint16_t[n]);
  b.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    if (type == ComputeType::kFloat16) {
      b.bits[i] = __float2half_rn(f).x;
      b.values[i] = __half2float(__half{b.bits[i]});
    } else {
      b.bits[i] = __float2bfloat16_rn(f).x;
      b.values[i] = __bfloat162float(__nv_bfloat16{b.bits[i]});
    }
  }
  return b;
}

void Poison(Buffer16& b, size_t index, float value, ComputeType type) {
  b.bits[index] =
      type == ComputeType::kFloat16 ? __float2half_rn(value).x : __float2bfloat16_rn(value).x;
  b.values[index] = value;
}

Outcome RunCase(const Case& c, ComputeType type, uint32_t seed, const LaunchFn& launch) {
  std::mt19937 rng(seed);
  const int S = static_cast<int>(c.seqs.size());
  const int H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.v_head_dim;
  std::vector<int> cu_q(S + 1, 0), cu_k(S + 1, 0);
  int max_q = 0, max_k = 0;
  for (int s = 0; s < S; ++s) {
    cu_q[s + 1] = cu_q[s] + c.seqs[s].q_len;
    cu_k[s + 1] = cu_k[s] + c.seqs[s].kv_len;
    max_q = std::max(max_q, c.seqs[s].q_len);
    max_k = std::max(max_k, c.seqs[s].kv_len);
  }
  const int total_q = cu_q[S], total_k = cu_k[S];
  // One generator per tensor: a sequence's values depend only on its place in the pack.
  std::mt19937 rng_q(seed), rng_k(seed + 1), rng_v(seed + 2);
  Buffer16 q = MakeBuffer(size_t(total_q) * H * D, type, rng_q, -1.5f, 1.5f);
  Buffer16 k = MakeBuffer(size_t(total_k) * Hkv * D, type, rng_k, -1.5f, 1.5f);
  Buffer16 v = MakeBuffer(size_t(total_k) * Hkv * Dv, type, rng_v, -1.0f, 1.0f);
  if (c.q_poison != 0.0f) Poison(q, 0, c.q_poison, type);
  if (c.k_poison != 0.0f) Poison(k, size_t(c.poison_key) * Hkv * D, c.k_poison, type);
  if (c.v_poison != 0.0f) Poison(v, 3, c.v_poison, type);

  // The mask, in the layout's own extent (exact size) with strides broadcasting the rest.
  std::unique_ptr<uint8_t[]> mask;
  int64_t mb = 0, mh = 0, mr = 0, mc = 1;
  if (c.mask != MaskLayout::kNone) {
    const bool per_head = c.mask == MaskLayout::kPerHead || c.mask == MaskLayout::kBroadcastKeys;
    const int mask_heads = per_head ? H : 1;
    const int mask_rows = c.mask == MaskLayout::kKeyPadding ? 1 : max_q;
    const int mask_cols = c.mask == MaskLayout::kBroadcastKeys ? 1 : max_k;
    mc = mask_cols == 1 ? 0 : 1;
    mr = mask_rows == 1 ? 0 : mask_cols;
    mh = mask_heads == 1 ? 0 : int64_t{mask_rows} * mask_cols;
    mb = int64_t{mask_heads} * mask_rows * mask_cols;
    const size_t n = size_t(S) * mb;
    mask.reset(new uint8_t[n]);
    std::bernoulli_distribution allow(0.7);
    for (size_t e = 0; e < n; ++e) {
      const int64_t j = int64_t(e) % mask_cols;
      const int64_t i = mask_rows == 1 ? 0 : (int64_t(e) / mask_cols) % mask_rows;
      switch (c.mask) {
        case MaskLayout::kBlockedTiles:
          // Keys [0, 160) blocked for every row (whole 64- and 128-key tiles), and row 3.
          mask[e] = j >= 160 && i != 3;
          break;
        case MaskLayout::kAllBlocked:
          mask[e] = 0;
          break;
        default:
          mask[e] = allow(rng) ? 1 : 0;
          if (c.mask == MaskLayout::kPerHead && i % 11 == 5) mask[e] = 0;  // blocked rows
          break;
      }
    }
  }

  // v_mean in float32 from the rounded values, as the backend computes it.
  std::unique_ptr<float[]> v_mean(new float[size_t(S) * Hkv * Dv]);
  for (int s = 0; s < S; ++s) {
    for (int g = 0; g < Hkv; ++g) {
      for (int d = 0; d < Dv; ++d) {
        double sum = 0;
        for (int t = cu_k[s]; t < cu_k[s + 1]; ++t) sum += v.values[(size_t(t) * Hkv + g) * Dv + d];
        v_mean[(size_t(s) * Hkv + g) * Dv + d] =
            static_cast<float>(sum / std::max(1, c.seqs[s].kv_len));
      }
    }
  }

  std::unique_ptr<int[]> cu_q_dev(new int[S + 1]), cu_k_dev(new int[S + 1]);
  std::copy(cu_q.begin(), cu_q.end(), cu_q_dev.get());
  std::copy(cu_k.begin(), cu_k.end(), cu_k_dev.get());
  std::unique_ptr<int[]> key_lengths;
  if (!c.key_lengths.empty()) {
    key_lengths.reset(new int[S]);
    std::copy(c.key_lengths.begin(), c.key_lengths.end(), key_lengths.get());
  }
  const size_t out_n = size_t(total_q) * H * Dv;
  std::unique_ptr<float[]> o(new float[out_n]);
  std::fill(o.get(), o.get() + out_n, -12345.0f);  // a value no row can produce

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  FlashFwdParams p;
  p.q = q.bits.get();
  p.k = k.bits.get();
  p.v = v.bits.get();
  p.q_row_stride = int64_t{H} * D;
  p.q_head_stride = D;
  p.k_row_stride = int64_t{Hkv} * D;
  p.k_head_stride = D;
  p.v_row_stride = int64_t{Hkv} * Dv;
  p.v_head_stride = Dv;
  p.o = o.get();
  p.o_row_stride = int64_t{H} * Dv;
  p.o_head_stride = Dv;
  p.cu_seqlens_q = cu_q_dev.get();
  p.cu_seqlens_k = cu_k_dev.get();
  p.key_lengths = key_lengths.get();
  p.num_seqs = S;
  p.max_seqlen_q = max_q;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.v_head_dim = Dv;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.causal = c.causal;
  p.mask = mask.get();
  p.mask_batch_stride = mb;
  p.mask_head_stride = mh;
  p.mask_row_stride = mr;
  p.mask_col_stride = mc;
  p.v_mean = v_mean.get();
  p.window = {c.mods.window_left, c.mods.window_right};
  p.softcap = c.mods.softcap;
  p.alibi_slopes = c.slopes.empty() ? nullptr : c.slopes.data();
  std::vector<float> weights = launch(p);

  Outcome r;
  r.weights = std::move(weights);
  r.out.assign(o.get(), o.get() + out_n);
  r.ref.assign(out_n, kNaN);
  r.q_offset = cu_q;
  for (int s = 0; s < S; ++s) {
    const int lq = c.seqs[s].q_len, lk = c.seqs[s].kv_len;
    if (lq == 0) continue;
    AttentionParams a;
    a.batch = 1;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.q_len = lq;
    a.kv_len = lk;
    a.head_dim = D;
    a.v_head_dim = Dv;
    a.q = {q.values.data() + size_t(cu_q[s]) * H * D, 0, D, int64_t{H} * D};
    a.k = {k.values.data() + size_t(cu_k[s]) * Hkv * D, 0, D, int64_t{Hkv} * D};
    a.v = {v.values.data() + size_t(cu_k[s]) * Hkv * Dv, 0, Dv, int64_t{Hkv} * Dv};
    if (mask != nullptr) a.mask = {mask.get() + s * mb, 0, mh, mr, mc};
    a.causal = c.causal;
    const int32_t kl = c.key_lengths.empty() ? lk : c.key_lengths[s];
    if (!c.key_lengths.empty()) a.key_lengths = &kl;
    a.scale = scale;
    a.mods = c.mods;
    a.mods.alibi_slopes = p.alibi_slopes;
    const Reference64 ref = ReferenceAttention64(a);
    r.ref_weights.insert(r.ref_weights.end(), ref.weights.begin(), ref.weights.end());
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < lq; ++i) {
        for (int d = 0; d < Dv; ++d) {
          r.ref[(size_t(cu_q[s] + i) * H + h) * Dv + d] = ref.out[(size_t(h) * lq + i) * Dv + d];
        }
      }
    }
  }
  return r;
}

// Absolute tolerance on outputs of magnitude <= 1: P is rounded to the operand type before

void ExpectMatches(const Case& c, const std::string& label, double tol, const Outcome& r) {
  int bad = 0;
  for (size_t e = 0; e < r.out.size(); ++e) {
    const double want = r.ref[e];
    const double got = r.out[e];
    const bool ok = std::isnan(want)   ? std::isnan(got)
                    : std::isinf(want) ? got == want
                                       : std::fabs(got - want) <= tol;
    if (!ok && ++bad <= 5) {
      const int row = static_cast<int>(e / (size_t(c.num_heads) * c.v_head_dim));
      ADD_FAILURE() << c.name << " " << label << ": element " << e << " (token " << row << ", head "
                    << (e / c.v_head_dim) % c.num_heads << ", column " << e % c.v_head_dim
                    << ") got " << got << " want " << want;
    }
  }
  EXPECT_EQ(bad, 0) << c.name << ": " << bad << " elements out of tolerance " << tol;
}

void ExpectWeightsMatch(const Case& c, const std::string& label, double tol, const Outcome& r) {
  ASSERT_EQ(r.weights.size(), r.ref_weights.size()) << c.name << " " << label;
  int bad = 0;
  for (size_t e = 0; e < r.weights.size(); ++e) {
    const double want = r.ref_weights[e];
    const double got = r.weights[e];
    const bool ok = std::isnan(want) ? std::isnan(got) : std::fabs(got - want) <= tol;
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << c.name << " " << label << ": weight " << e << " got " << got << " want "
                    << want;
    }
  }
  EXPECT_EQ(bad, 0) << c.name << ": " << bad << " weights out of tolerance " << tol;
}

void ExpectNaNRule(const Case& base, const CaseFn& check, const CaseFn& run) {
  auto named = [&](const std::string& name) {
    Case c = base;
    c.name = base.name + name;
    return c;
  };
  for (const float bad : {kNaN, kInf}) {
    // Rule 1: a NaN/+Inf score (q[0, 0, 0] times k) makes row 0 of head 0 NaN in every column;
    // other rows stay finite. The reference computes the same (NaN compares as NaN).
    Case c = named("q_nonfinite");
    c.seqs = {{5, 20}};
    c.q_poison = bad;
    const Outcome r = check(c);
    for (int d = 0; d < c.v_head_dim; ++d) EXPECT_TRUE(std::isnan(r.out[d])) << d;
    for (size_t j = 0; j < std::min<size_t>(r.weights.size(), 20); ++j) {
      EXPECT_TRUE(std::isnan(r.weights[j])) << "weight " << j;
    }
    // Rule 3: a NaN/Inf in the k of a blocked key (beyond the key length) has no effect.
    c = named("k_blocked_nonfinite");
    c.seqs = {{5, 20}};
    c.key_lengths = {10};
    c.k_poison = bad;
    c.poison_key = 15;
    const Outcome r3 = check(c);
    for (float x : r3.out) EXPECT_TRUE(std::isfinite(x));
    for (float w : r3.weights) EXPECT_TRUE(std::isfinite(w));
  }
  // Rule 2: an allowed score of -Inf weighs 0; with key length 1 and that key's score -Inf
  // (k[0, 0, 0] = -Inf, q[0, 0, 0] = 0.5) row 0 of head 0 is fully blocked: the same output as
  // with key length 0 (the mean of the values). Compared run to run, so the check does not
  // depend on the reference's handling of -Inf.
  {
    Case neg = named("k_neg_inf");
    neg.seqs = {{1, 20}};
    neg.key_lengths = {1};
    neg.q_poison = 0.5f;
    neg.k_poison = -kInf;
    Case blocked = neg;
    blocked.key_lengths = {0};
    const Outcome a = run(neg);
    const Outcome b = run(blocked);
    for (int d = 0; d < neg.v_head_dim; ++d) {
      EXPECT_EQ(a.out[d], b.out[d]) << "column " << d;
      EXPECT_TRUE(std::isfinite(a.out[d])) << "column " << d;
    }
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t j = 0; j < std::min<size_t>(a.weights.size(), 20); ++j) {  // row 0 of head 0
      EXPECT_EQ(a.weights[j], b.weights[j]) << "weight " << j;
    }
  }
  // Rule 4: a NaN in v[key 0, column 3] with every key allowed: column 3 NaN in every row of the
  // heads reading it, the other columns finite.
  Case c = named("v_nan");
  c.seqs = {{5, 20}};
  c.num_kv_heads = 1;
  c.v_poison = kNaN;
  const Outcome r = check(c);
  for (size_t e = 0; e < r.out.size(); ++e) {
    EXPECT_EQ(std::isnan(r.out[e]), e % c.v_head_dim == 3) << e;
  }
}

}  // namespace attnserve::kernels::cuda
