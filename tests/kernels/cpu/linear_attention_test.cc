// Linear attention (kernels/attention_params.h, AttentionKind::kLinear) in the float64
// reference, the CPU backend's Attend and its MultiHead, against the paper's form written here
// independently: out_i = φ(q_i)ᵀ S_i / (φ(q_i) · z_i) with S_i and z_i summed over the allowed
// keys (the reference computes per-key weights instead).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/multi_head.h"
#include "kernels/reference.h"
#include "tests/kernels/cpu/attention_test_util.h"

namespace attnserve::kernels::cpu {
namespace {

using ::attnserve::kernels::testing::AttentionCase;
using ::attnserve::kernels::testing::AttentionSpec;
using ::attnserve::kernels::testing::MaxAbsError;

double Phi(FeatureMap map, double x) {
  if (map == FeatureMap::kRelu) return std::max(x, 0.0);
  if (map == FeatureMap::kIdentity) return x;
  return x > 0 ? x + 1 : std::exp(x);
}

// out [B, H, Lq, Dv] of p (float32 inputs) in the paper's form.
std::vector<double> PaperForm(const AttentionParams& p) {
  std::vector<double> out(int64_t{p.batch} * p.num_heads * p.q_len * p.v_head_dim, 0.0);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      const int kvh = h / p.group_size();
      for (int i = 0; i < p.q_len; ++i) {
        int last = p.kv_len;  // keys [0, last) allowed
        if (p.causal)
          last = std::min<int64_t>(last, std::max<int64_t>(0, i + p.kv_len - p.q_len + 1));
        if (p.key_lengths != nullptr) last = std::min(last, p.key_lengths[b]);
        std::vector<double> s(int64_t{p.head_dim} * p.v_head_dim, 0.0), z(p.head_dim, 0.0);
        for (int j = 0; j < last; ++j) {
          const float* k = p.k.row<float>(b, kvh, j);
          const float* v = p.v.row<float>(b, kvh, j);
          for (int d = 0; d < p.head_dim; ++d) {
            z[d] += Phi(p.feature_map, k[d]);
            for (int c = 0; c < p.v_head_dim; ++c) {
              s[int64_t{d} * p.v_head_dim + c] += Phi(p.feature_map, k[d]) * v[c];
            }
          }
        }
        const float* q = p.q.row<float>(b, h, i);
        double norm = 0;
        for (int d = 0; d < p.head_dim; ++d) norm += Phi(p.feature_map, q[d]) * z[d];
        double* o = &out[((int64_t{b} * p.num_heads + h) * p.q_len + i) * p.v_head_dim];
        for (int c = 0; c < p.v_head_dim && norm != 0; ++c) {
          for (int d = 0; d < p.head_dim; ++d) {
            o[c] += Phi(p.feature_map, q[d]) * s[int64_t{d} * p.v_head_dim + c];
          }
          o[c] /= norm;
        }
      }
    }
  }
  return out;
}

struct LinearCase {
  std::string name;
  AttentionSpec spec;
  FeatureMap map = FeatureMap::kEluPlusOne;
};

std::vector<LinearCase> Cases() {
  auto spec = [](int hq, int hkv, int lq, int lk, int d, int dv, bool causal, uint32_t seed) {
    AttentionSpec s;
    s.batch = 2;
    s.num_heads = hq;
    s.num_kv_heads = hkv;
    s.q_len = lq;
    s.kv_len = lk;
    s.head_dim = d;
    s.v_head_dim = dv;
    s.causal = causal;
    s.seed = seed;
    return s;
  };
  std::vector<LinearCase> cases;
  LinearCase gqa{"causal_gqa_lengths", spec(4, 2, 37, 90, 16, 24, true, 1)};
  gqa.spec.key_lengths = {90, 0};  // the second item's rows have no key: zeros
  cases.push_back(gqa);
  cases.push_back({"full", spec(2, 2, 50, 30, 32, 8, false, 2)});
  cases.push_back({"causal_more_queries_than_keys", spec(2, 1, 40, 25, 8, 8, true, 3)});
  cases.push_back({"relu", spec(2, 2, 33, 33, 16, 16, true, 4), FeatureMap::kRelu});
  cases.push_back({"identity", spec(2, 2, 20, 20, 8, 8, false, 5), FeatureMap::kIdentity});
  return cases;
}

void PrintTo(const LinearCase& c, std::ostream* os) { *os << c.name; }

class LinearAttentionTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearAttentionTest, ReferenceAndCpuMatchThePapersForm) {
  const LinearCase& c = GetParam();
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 2, .min_flops_per_thread = 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    AttentionSpec spec = c.spec;
    spec.dtype = dtype;
    AttentionCase problem(spec);
    auto linear = [&](AttentionParams p) {
      p.kind = AttentionKind::kLinear;
      p.feature_map = c.map;
      return p;
    };
    const std::vector<double> want = PaperForm(linear(problem.float32_params()));
    // Outputs may be large where an identity map's normaliser is small: bound relative to them.
    double scale = 1;
    for (double x : want) scale = std::max(scale, std::fabs(x));
    const Reference64 r = ReferenceAttention64(linear(problem.params()));
    double worst = 0;
    for (size_t n = 0; n < want.size(); ++n) worst = std::max(worst, std::fabs(r.out[n] - want[n]));
    EXPECT_LE(worst, 1e-12 * scale) << DTypeName(dtype);
    problem.PoisonOutputs();
    ASSERT_TRUE((*backend)->Attend({linear(problem.params())}).ok());
    EXPECT_LE(MaxAbsError(problem.DenseOut(), want), 2e-5 * scale) << DTypeName(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearAttentionTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// The normaliser rule: rows with no allowed key, and rows whose features are all zero (relu of
// negative queries), are exactly zero; the kind is not softmax attention under another name.
TEST(LinearAttentionRuleTest, ZeroNormalisersGiveZerosAndTheKindMatters) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  AttentionSpec spec;
  spec.q_len = spec.kv_len = 6;
  spec.head_dim = spec.v_head_dim = 4;
  AttentionCase problem(spec);
  AttentionParams p = problem.params();
  ASSERT_TRUE((*backend)->Attend({p}).ok());
  const std::vector<float> softmax = problem.DenseOut();
  p.kind = AttentionKind::kLinear;
  ASSERT_TRUE((*backend)->Attend({p}).ok());
  EXPECT_GT(MaxAbsError(problem.DenseOut(), std::vector<double>(softmax.begin(), softmax.end())),
            1e-3);
  // relu of an all-negative query row: φ(q) = 0.
  std::vector<float> q(6 * 4, -1.0f);
  p.q.data = q.data();
  p.feature_map = FeatureMap::kRelu;
  problem.PoisonOutputs();
  ASSERT_TRUE((*backend)->Attend({p}).ok());
  for (const float x : problem.DenseOut()) EXPECT_EQ(x, 0.0f);
}

// MultiHead with linear heads (the CPU backend's projections, then its linear kernel) against
// the float64 reference module.
TEST(LinearAttentionMultiHeadTest, MatchesTheReferenceModule) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 2, .min_flops_per_thread = 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const MultiHeadWeights w = testing::RandomWeights(32, 4, 7);
  const std::vector<float> x = testing::RandomVector(2 * 9 * 32, 8);
  std::vector<float> out(x.size());
  MultiHeadParams p;
  p.module = &w;
  p.batch = 2;
  p.q_len = p.kv_len = 9;
  p.query = p.key = p.value = x.data();
  p.self_attention = true;
  p.out = out.data();
  p.causal = true;
  p.kind = AttentionKind::kLinear;
  const Reference64 r = ReferenceMultiHead64(p);
  ASSERT_TRUE((*backend)->MultiHead({p}).ok());
  EXPECT_LE(MaxAbsError(out, r.out), 2e-5);
}

}  // namespace
}  // namespace attnserve::kernels::cpu
