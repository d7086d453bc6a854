// Sliding windows, soft-capping and ALiBi (kernels/attention_params.h, ScoreMods) in the float64
// reference and the CPU backend (every ISA this CPU runs), against an independent float64
// implementation written here from the proto's definition: scores scale·q·k, soft-capped, biased,
// then blocked keys filled with -1e9 before a plain softmax (the reference module's
// masked_fill), so a fully blocked row is uniform by construction rather than by rule.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/reference.h"
#include "tests/kernels/cpu/attention_test_util.h"

namespace attnserve::kernels::cpu {
namespace {

using ::attnserve::kernels::testing::AttentionCase;
using ::attnserve::kernels::testing::AttentionSpec;
using ::attnserve::kernels::testing::MaskKind;
using ::attnserve::kernels::testing::MaxAbsError;

// out [B, H, Lq, Dv] and weights [B, H, Lq, Lk] of p (float32 inputs), by the definition.
void Direct(const AttentionParams& p, std::vector<double>* out, std::vector<double>* weights) {
  out->assign(int64_t{p.batch} * p.num_heads * p.q_len * p.v_head_dim, 0.0);
  weights->assign(int64_t{p.batch} * p.num_heads * p.q_len * p.kv_len, 0.0);
  const int group = p.num_heads / p.num_kv_heads;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t row = (int64_t{b} * p.num_heads + h) * p.q_len + i;
        const int64_t aligned = int64_t{i} + p.kv_len - p.q_len;
        std::vector<double> s(p.kv_len);
        for (int j = 0; j < p.kv_len; ++j) {
          const float* q = p.q.row<float>(b, h, i);
          const float* k = p.k.row<float>(b, h / group, j);
          double dot = 0;
          for (int d = 0; d < p.head_dim; ++d) dot += double{q[d]} * k[d];
          s[j] = dot * p.scale;
          if (p.mods.softcap > 0) s[j] = p.mods.softcap * std::tanh(s[j] / p.mods.softcap);
          if (p.mods.alibi_slopes != nullptr) {
            s[j] -= double{p.mods.alibi_slopes[h]} * std::fabs(double(j - aligned));
          }
          bool allowed = !p.mask.present() || p.mask.at(b, h, i, j) != 0;
          if (p.causal && j > aligned) allowed = false;
          if (p.key_lengths != nullptr && j >= p.key_lengths[b]) allowed = false;
          if (p.mods.window_left >= 0 && j < aligned - p.mods.window_left) allowed = false;
          if (p.mods.window_right >= 0 && j > aligned + p.mods.window_right) allowed = false;
          if (!allowed) s[j] = -1e9;
        }
        double mx = -INFINITY, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int j = 0; j < p.kv_len; ++j) {
          const double w = s[j] / sum;
          (*weights)[row * p.kv_len + j] = w;
          const float* v = p.v.row<float>(b, h / group, j);
          for (int c = 0; c < p.v_head_dim; ++c) (*out)[row * p.v_head_dim + c] += w * v[c];
        }
      }
    }
  }
}

struct ModsCase {
  std::string name;
  AttentionSpec spec;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  bool alibi = false;
};

std::vector<ModsCase> Cases() {
  std::vector<ModsCase> cases;
  auto spec = [](int hq, int hkv, int lq, int lk, int d, bool causal, uint32_t seed) {
    AttentionSpec s;
    s.batch = 2;
    s.num_heads = hq;
    s.num_kv_heads = hkv;
    s.q_len = lq;
    s.kv_len = lk;
    s.head_dim = d;
    s.v_head_dim = d;
    s.causal = causal;
    s.seed = seed;
    s.input_scale = 3.0f;  // scores of a few units: the cap and the slopes matter
    return s;
  };
  cases.push_back({"causal_window", spec(4, 2, 150, 150, 32, true, 1), 17, 0});
  cases.push_back({"window_both_sides", spec(2, 2, 70, 200, 24, false, 2), 9, 40});
  cases.push_back({"window_right_only", spec(2, 1, 33, 90, 16, false, 3), -1, 5});
  cases.push_back({"window_of_one_key", spec(2, 2, 40, 40, 16, false, 4), 0, 0});
  // Lq > Lk with a window: the first rows' windows lie before key 0 (fully blocked rows).
  cases.push_back({"window_past_the_start", spec(2, 2, 60, 20, 16, true, 5), 3, -1});
  cases.push_back({"softcap", spec(4, 4, 50, 80, 32, false, 6), -1, -1, 2.5f});
  cases.push_back({"alibi_causal", spec(4, 1, 65, 130, 32, true, 7), -1, -1, 0, true});
  cases.push_back({"alibi_both_sides", spec(2, 2, 40, 40, 8, false, 8), -1, -1, 0, true});
  ModsCase all{"all_with_mask_and_lengths", spec(4, 2, 100, 300, 40, true, 9), 64, 0, 5.0f, true};
  all.spec.mask = MaskKind::kBlockedRows;
  all.spec.key_lengths = {300, 170};
  cases.push_back(all);
  return cases;
}

void PrintTo(const ModsCase& c, std::ostream* os) { *os << c.name; }

class ScoreModsTest : public ::testing::TestWithParam<ModsCase> {};

// The reference meets the definition to float64 rounding, on every case and dtype.
TEST_P(ScoreModsTest, ReferenceMatchesTheDefinition) {
  const ModsCase& c = GetParam();
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    AttentionSpec spec = c.spec;
    spec.dtype = dtype;
    AttentionCase problem(spec);
    const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    auto with_mods = [&](AttentionParams p) {
      p.mods = {c.window_left, c.window_right, c.softcap, c.alibi ? slopes.data() : nullptr};
      return p;
    };
    std::vector<double> out, weights;
    Direct(with_mods(problem.float32_params()), &out, &weights);
    const Reference64 r = ReferenceAttention64(with_mods(problem.params()));
    double worst = 0;
    for (size_t n = 0; n < out.size(); ++n) worst = std::max(worst, std::fabs(r.out[n] - out[n]));
    for (size_t n = 0; n < weights.size(); ++n) {
      worst = std::max(worst, std::fabs(r.weights[n] - weights[n]));
    }
    EXPECT_LE(worst, 1e-12) << DTypeName(dtype);
  }
}

// The CPU backend, every ISA here, fused and with weights, every input dtype: within float32
// arithmetic of the definition.
TEST_P(ScoreModsTest, CpuBackendMatchesTheDefinition) {
  const ModsCase& c = GetParam();
  for (const Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (!CpuSupports(isa)) continue;
    auto backend = CpuBackend::Create(
        CpuBackendOptions{.num_threads = 2, .min_flops_per_thread = 0, .isa = isa});
    ASSERT_TRUE(backend.ok()) << backend.status();
    for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const bool with_weights : {false, true}) {
        AttentionSpec spec = c.spec;
        spec.dtype = dtype;
        AttentionCase problem(spec);
        const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
        const ScoreMods mods{c.window_left, c.window_right, c.softcap,
                             c.alibi ? slopes.data() : nullptr};
        AttentionParams p = problem.params(with_weights);
        p.mods = mods;
        AttentionParams p32 = problem.float32_params();
        p32.mods = mods;
        std::vector<double> out, weights;
        Direct(p32, &out, &weights);
        problem.PoisonOutputs();
        ASSERT_TRUE((*backend)->Attend({p}).ok());
        const std::string what = std::string(IsaName(isa)) + " " + std::string(DTypeName(dtype)) +
                                 (with_weights ? " with weights" : "");
        EXPECT_LE(MaxAbsError(problem.DenseOut(), out), 2e-5) << what;
        if (with_weights) {
          EXPECT_LE(MaxAbsError(problem.weights(), weights), 2e-6) << what;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ScoreModsTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Each modification changes the result (so the cases above cannot pass by ignoring one), and a
// window edge one key off does too.
TEST(ScoreModsEffectTest, EachModificationAndEachWindowEdgeMatters) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  AttentionSpec spec;
  spec.num_heads = spec.num_kv_heads = 2;
  spec.q_len = spec.kv_len = 80;
  spec.head_dim = spec.v_head_dim = 16;
  spec.causal = true;
  spec.input_scale = 3.0f;
  AttentionCase problem(spec);
  const std::vector<float> slopes = {0.5f, 0.25f};
  auto run = [&](ScoreMods mods) {
    AttentionParams p = problem.params();
    p.mods = mods;
    EXPECT_TRUE((*backend)->Attend({p}).ok());
    return problem.DenseOut();
  };
  auto differ = [](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (size_t n = 0; n < a.size(); ++n) worst = std::max(worst, double(std::fabs(a[n] - b[n])));
    return worst;
  };
  const std::vector<float> plain = run({});
  EXPECT_GT(differ(run({.softcap = 2.0f}), plain), 1e-3);
  EXPECT_GT(differ(run({.alibi_slopes = slopes.data()}), plain), 1e-3);
  EXPECT_GT(differ(run({.window_left = 20}), plain), 1e-3);
  EXPECT_GT(differ(run({.window_left = 20}), run({.window_left = 21})), 1e-4);
  // Causal: the keys right of a row are blocked anyway, so a right bound of 0 changes nothing.
  const std::vector<float> open_right = run({.window_left = 20, .window_right = -1});
  EXPECT_EQ(differ(run({.window_left = 20, .window_right = 0}), open_right), 0);
}

}  // namespace
}  // namespace attnserve::kernels::cpu
