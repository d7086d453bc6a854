#include "kernels/cpu/cpu_backend.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "base/cgroup.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/available_cores.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/reference.h"
#include "model/module_weights.h"
#include "model/safetensors.h"
#include "tests/kernels/cpu/attention_test_util.h"
#if defined(ATTNSERVE_HAVE_AMX_EMULATION)
#include "tests/kernels/cpu/amx_emu.h"
#endif

namespace attnserve::kernels::cpu {
namespace {

using ::attnserve::kernels::testing::AllFinite;
using ::attnserve::kernels::testing::AttentionCase;
using ::attnserve::kernels::testing::AttentionSpec;
using ::attnserve::kernels::testing::InputData;
using ::attnserve::kernels::testing::MaskKind;
using ::attnserve::kernels::testing::MaxAbsError;
using ::attnserve::kernels::testing::NaiveAttention32;
using ::attnserve::kernels::testing::NaiveAttentionBf16;
using ::attnserve::kernels::testing::NaiveMultiHead32;
using ::attnserve::kernels::testing::NaiveMultiHeadBf16;
using ::attnserve::kernels::testing::RandomVector;
using ::attnserve::kernels::testing::RandomWeights;
using ::attnserve::model::ParseSafetensors;
using ::attnserve::model::SafetensorsFile;
using ::attnserve::model::SafetensorsTensor;
using ::attnserve::model::WeightsFromSafetensors;

// The float32 kernels (bf16_isa kNone: every dtype computes in float32), or a 16-bit path.
std::unique_ptr<CpuBackend> MakeBackend(Isa isa, int threads = 2, Bf16Isa bf16_isa = Bf16Isa::kNone,
                                        bool float32_as_bf16 = false) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = threads,
                                                      .min_flops_per_thread = 0,
                                                      .isa = isa,
                                                      .bf16_isa = bf16_isa,
                                                      .float32_as_bf16 = float32_as_bf16});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// The FlashAttention bound: err(fast) <= 2 · err(naive float32) + 1e-6, both against float64.
void ExpectWithinBound(double fast, double naive, const std::string& what) {
  EXPECT_LE(fast, 2.0 * naive + 1e-6) << what << ": fast error " << fast << ", naive " << naive;
}

// The shapes and options every kernel is checked on.
std::vector<AttentionSpec> SweepSpecs() {
  std::vector<AttentionSpec> specs;
  uint32_t seed = 10;
  auto add = [&](AttentionSpec s) {
    s.seed = seed++;
    specs.push_back(s);
  };
  // Head dims, with several query blocks and key tiles (kQueryBlock 64, kKeyTile 128).
  for (int d : {1, 3, 24, 64, 96, 128, 256}) {
    add({.batch = 1,
         .num_heads = 2,
         .num_kv_heads = 2,
         .q_len = 70,
         .kv_len = 150,
         .head_dim = d,
         .v_head_dim = d});
  }
  // Dv != D, GQA, MQA, B > 1, interleaved ([B, L, H, D]) layout.
  add({.batch = 2,
       .num_heads = 4,
       .num_kv_heads = 2,
       .q_len = 33,
       .kv_len = 257,
       .head_dim = 64,
       .v_head_dim = 24});
  add({.batch = 3,
       .num_heads = 6,
       .num_kv_heads = 1,
       .q_len = 129,
       .kv_len = 17,
       .head_dim = 96,
       .v_head_dim = 128,
       .interleaved = true});
  add({.batch = 2,
       .num_heads = 3,
       .num_kv_heads = 3,
       .q_len = 1,
       .kv_len = 300,
       .head_dim = 128,
       .v_head_dim = 40});
  // Large scores: a peaky softmax.
  add({.batch = 1,
       .num_heads = 2,
       .num_kv_heads = 1,
       .q_len = 65,
       .kv_len = 200,
       .head_dim = 64,
       .v_head_dim = 64,
       .input_scale = 8.0f});
  // Masks.
  for (MaskKind m :
       {MaskKind::kKeyPadding, MaskKind::kFull, MaskKind::kBlockedRows, MaskKind::kRowBroadcast}) {
    add({.batch = 2,
         .num_heads = 4,
         .num_kv_heads = 2,
         .q_len = 70,
         .kv_len = 140,
         .head_dim = 24,
         .v_head_dim = 24,
         .mask = m});
    add({.batch = 2,
         .num_heads = 2,
         .num_kv_heads = 2,
         .q_len = 9,
         .kv_len = 11,
         .head_dim = 64,
         .v_head_dim = 64,
         .mask = m,
         .interleaved = true});
  }
  // Causal, bottom-right aligned: Lq < Lk, Lq > Lk (leading rows fully blocked), Lq = Lk.
  add({.batch = 1,
       .num_heads = 2,
       .num_kv_heads = 2,
       .q_len = 40,
       .kv_len = 300,
       .head_dim = 64,
       .v_head_dim = 64,
       .causal = true});
  add({.batch = 2,
       .num_heads = 2,
       .num_kv_heads = 1,
       .q_len = 200,
       .kv_len = 70,
       .head_dim = 96,
       .v_head_dim = 96,
       .causal = true});
  add({.batch = 1,
       .num_heads = 3,
       .num_kv_heads = 3,
       .q_len = 260,
       .kv_len = 260,
       .head_dim = 32,
       .v_head_dim = 32,
       .mask = MaskKind::kBlockedRows,
       .causal = true});
  // Key lengths, 0 included, alone and with causal and a mask.
  add({.batch = 4,
       .num_heads = 2,
       .num_kv_heads = 2,
       .q_len = 66,
       .kv_len = 150,
       .head_dim = 64,
       .v_head_dim = 64,
       .key_lengths = {150, 0, 1, 129}});
  add({.batch = 3,
       .num_heads = 2,
       .num_kv_heads = 1,
       .q_len = 30,
       .kv_len = 140,
       .head_dim = 24,
       .v_head_dim = 24,
       .mask = MaskKind::kKeyPadding,
       .causal = true,
       .key_lengths = {0, 100, 140}});
  // Half-precision inputs (rounded at the edge, computed in float32).
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    add({.batch = 2,
         .num_heads = 2,
         .num_kv_heads = 2,
         .q_len = 50,
         .kv_len = 190,
         .head_dim = 64,
         .v_head_dim = 64,
         .dtype = t});
    add({.batch = 1,
         .num_heads = 4,
         .num_kv_heads = 2,
         .q_len = 70,
         .kv_len = 70,
         .head_dim = 128,
         .v_head_dim = 128,
         .mask = MaskKind::kBlockedRows,
         .causal = true,
         .dtype = t});
  }
  return specs;
}

// The Attend sweep of both precision paths: SweepSpecs(), each in its own dtype or, when
// `dtypes` is not empty, in each of `dtypes`, against float64 with the bound
// err(backend) <= 2·err(naive) + eps, `naive` being the plain implementation in the path's own
// precision.
using NaiveAttentionFn = void (*)(const AttentionParams&, std::vector<float>*, std::vector<float>*);
void CheckAttendSweep(CpuBackend& backend, std::initializer_list<DType> dtypes,
                      NaiveAttentionFn naive) {
  for (AttentionSpec spec : SweepSpecs()) {
    const std::vector<DType> types =
        dtypes.size() == 0 ? std::vector<DType>{spec.dtype} : std::vector<DType>(dtypes);
    for (DType t : types) {
      spec.dtype = t;
      SCOPED_TRACE(spec.DebugString());
      AttentionCase c(spec);
      c.PoisonOutputs();
      const AttentionParams p = c.params();
      const Reference64 ref = ReferenceAttention64(p);
      std::vector<float> naive_out, naive_weights;
      naive(p, &naive_out, &naive_weights);
      ASSERT_TRUE(backend.Attend({p}).ok());
      const std::vector<float> out = c.DenseOut();
      ASSERT_TRUE(AllFinite(out));
      ExpectWithinBound(MaxAbsError(out, ref.out), MaxAbsError(naive_out, ref.out), "out");
    }
  }
}

// The multi-head sweep of both precision paths: six module/shape/mask cases, each in every dtype
// of `dtypes` (seeds counting up from `first_seed`), with and without weights, against float64
// with the bound err(backend) <= 2·err(naive) + eps, `naive` being the plain implementation in
// the path's own precision.
using NaiveMultiHeadFn = void (*)(const MultiHeadParams&, std::vector<float>*, std::vector<float>*);
void CheckMultiHeadSweep(CpuBackend& backend, uint32_t first_seed,
                         std::initializer_list<DType> dtypes, NaiveMultiHeadFn naive) {
  struct Case {
    int d_model, heads, batch, q_len, kv_len;
    bool self, same_kv, causal;
    MaskKind mask;
  };
  const Case cases[] = {
      {64, 4, 2, 70, 70, true, true, false, MaskKind::kNone},
      {96, 4, 3, 33, 33, true, true, true, MaskKind::kNone},
      {96, 1, 1, 300, 300, true, true, true, MaskKind::kNone},
      {128, 2, 2, 20, 150, false, true, false, MaskKind::kKeyPadding},
      {64, 8, 2, 129, 40, false, false, false, MaskKind::kBlockedRows},
      {48, 2, 1, 70, 300, false, false, true, MaskKind::kNone},
  };
  uint32_t seed = first_seed;
  for (const Case& t : cases) {
    for (DType dtype : dtypes) {
      SCOPED_TRACE(::testing::Message()
                   << "d_model=" << t.d_model << " h=" << t.heads << " B=" << t.batch
                   << " Lq=" << t.q_len << " Lk=" << t.kv_len << " dtype=" << DTypeName(dtype));
      const MultiHeadWeights w = RandomWeights(t.d_model, t.heads, seed++);
      const std::vector<float> query =
          RandomVector(int64_t{t.batch} * t.q_len * t.d_model, seed++, dtype);
      const std::vector<float> key =
          RandomVector(int64_t{t.batch} * t.kv_len * t.d_model, seed++, dtype);
      const std::vector<float> value =
          RandomVector(int64_t{t.batch} * t.kv_len * t.d_model, seed++, dtype);
      std::vector<uint16_t> query16, key16, value16;
      const void* q_data = InputData(dtype, query, &query16);
      const void* k_data = InputData(dtype, key, &key16);
      const void* v_data = InputData(dtype, value, &value16);
      std::vector<uint8_t> mask;
      MultiHeadParams p;
      p.module = &w;
      p.batch = t.batch;
      p.q_len = t.q_len;
      p.kv_len = t.kv_len;
      p.input_dtype = dtype;
      p.query = q_data;
      p.key = t.self ? q_data : k_data;
      p.value = t.self ? q_data : (t.same_kv ? k_data : v_data);
      p.self_attention = t.self;
      p.causal = t.causal;
      p.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim()));
      if (t.mask == MaskKind::kKeyPadding) {
        mask.resize(int64_t{t.batch} * t.kv_len);
        for (size_t n = 0; n < mask.size(); ++n) mask[n] = (n * 7 % 5) != 0;
        p.mask = MaskView{mask.data(), t.kv_len, 0, 0, 1};
      } else if (t.mask == MaskKind::kBlockedRows) {
        mask.resize(int64_t{t.batch} * t.q_len * t.kv_len);
        for (size_t n = 0; n < mask.size(); ++n) mask[n] = (n * 13 % 7) > 2;
        for (int j = 0; j < t.kv_len; ++j) mask[j] = 0;  // row 0 of batch entry 0
        p.mask = MaskView{mask.data(), int64_t{t.q_len} * t.kv_len, 0, t.kv_len, 1};
      }
      const Reference64 ref = ReferenceMultiHead64(p);
      std::vector<float> naive_out, naive_weights;
      naive(p, &naive_out, &naive_weights);
      for (bool with_weights : {false, true}) {
        std::vector<float> out(int64_t{t.batch} * t.q_len * t.d_model, NAN);
        std::vector<float> weights(int64_t{t.batch} * t.heads * t.q_len * t.kv_len, NAN);
        p.out = out.data();
        p.weights = with_weights ? weights.data() : nullptr;
        ASSERT_TRUE(backend.MultiHead({p}).ok());
        ASSERT_TRUE(AllFinite(out));
        ExpectWithinBound(MaxAbsError(out, ref.out), MaxAbsError(naive_out, ref.out), "out");
        if (with_weights) {
          ExpectWithinBound(MaxAbsError(weights, ref.weights),
                            MaxAbsError(naive_weights, ref.weights), "weights");
        }
      }
    }
  }
}

class CpuBackendIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) GTEST_SKIP() << IsaName(GetParam()) << " not supported here";
    backend_ = MakeBackend(GetParam());
    ASSERT_NE(backend_, nullptr);
  }
  std::unique_ptr<CpuBackend> backend_;
};

TEST_P(CpuBackendIsaTest, AttendMatchesReferenceWithinFlashBound) {
  CheckAttendSweep(*backend_, {}, NaiveAttention32);
}

TEST_P(CpuBackendIsaTest, AttendWithWeightsMatchesReferenceWithinFlashBound) {
  for (const AttentionSpec& spec : SweepSpecs()) {
    SCOPED_TRACE(spec.DebugString());
    AttentionCase c(spec);
    c.PoisonOutputs();
    const AttentionParams p = c.params(/*with_weights=*/true);
    const Reference64 ref = ReferenceAttention64(p);
    std::vector<float> naive_out, naive_weights;
    NaiveAttention32(p, &naive_out, &naive_weights);
    ASSERT_TRUE(backend_->Attend({p}).ok());
    const std::vector<float> out = c.DenseOut();
    ASSERT_TRUE(AllFinite(out));
    ASSERT_TRUE(AllFinite(c.weights()));
    ExpectWithinBound(MaxAbsError(out, ref.out), MaxAbsError(naive_out, ref.out), "out");
    ExpectWithinBound(MaxAbsError(c.weights(), ref.weights),
                      MaxAbsError(naive_weights, ref.weights), "weights");
  }
}

// The float32 path widens FLOAT16 / BFLOAT16 views exactly, tile by tile: the bits equal those
// of the same values given as float32, with and without weights, on every layout of the sweep.
TEST_P(CpuBackendIsaTest, SixteenBitInputsGiveTheBitsOfTheirFloat32Values) {
  for (AttentionSpec spec : SweepSpecs()) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      spec.dtype = t;
      SCOPED_TRACE(spec.DebugString());
      for (bool with_weights : {false, true}) {
        AttentionCase c(spec);
        c.PoisonOutputs();
        ASSERT_TRUE(backend_->Attend({c.float32_params(with_weights)}).ok());
        const std::vector<float> out32 = c.DenseOut();
        const std::vector<float> weights32 = c.weights();
        c.PoisonOutputs();
        ASSERT_TRUE(backend_->Attend({c.params(with_weights)}).ok());
        const std::vector<float> out16 = c.DenseOut();
        ASSERT_TRUE(AllFinite(out16));
        ASSERT_EQ(std::memcmp(out16.data(), out32.data(), out16.size() * sizeof(float)), 0);
        if (with_weights) {
          ASSERT_EQ(
              std::memcmp(c.weights().data(), weights32.data(), weights32.size() * sizeof(float)),
              0);
        }
      }
    }
  }
}

TEST_P(CpuBackendIsaTest, FullyBlockedRowsAverageAllValues) {
  // Every key blocked (key length 0, and a mask of zeros): each row is the mean of all Lk values.
  AttentionCase c({.batch = 2,
                   .num_heads = 2,
                   .num_kv_heads = 1,
                   .q_len = 70,
                   .kv_len = 130,
                   .head_dim = 24,
                   .v_head_dim = 24,
                   .key_lengths = {0, 0}});
  c.PoisonOutputs();
  const AttentionParams p = c.params();
  ASSERT_TRUE(backend_->Attend({p}).ok());
  const Reference64 ref = ReferenceAttention64(p);
  const std::vector<float> out = c.DenseOut();
  ASSERT_TRUE(AllFinite(out));
  EXPECT_LE(MaxAbsError(out, ref.out), 1e-5);
}

TEST_P(CpuBackendIsaTest, MultiHeadMatchesReferenceWithinFlashBound) {
  CheckMultiHeadSweep(*backend_, 100, {DType::kFloat32, DType::kFloat16, DType::kBFloat16},
                      NaiveMultiHead32);
}

// A seed vector (see tests/data/seed-vectors/README.md) loaded as a MultiHeadParams.
struct SeedCase {
  std::string buffer;
  SafetensorsFile file;
  MultiHeadWeights weights;
  std::vector<float> query, key, value, expected_out, expected_weights;
  std::vector<uint8_t> mask;
  MultiHeadParams params;
};

std::unique_ptr<SeedCase> LoadSeed(const std::string& name) {
  auto c = std::make_unique<SeedCase>();
  const std::string path = std::string(ATTNSERVE_SEED_VECTORS_DIR) + "/" + name + ".safetensors";
  auto buffer = ReadFileToString(path);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return nullptr;
  c->buffer = *std::move(buffer);
  auto file = ParseSafetensors(c->buffer);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  c->file = *std::move(file);
  auto weights = WeightsFromSafetensors(c->file, 0);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  c->weights = *std::move(weights);
  auto tensor = [&](const char* key, std::vector<float>* dst) -> const SafetensorsTensor* {
    auto t = c->file.Find(key);
    if (!t.ok()) return nullptr;
    auto values = (*t)->ToFloat32(key);
    EXPECT_TRUE(values.ok()) << values.status();
    if (values.ok()) *dst = *std::move(values);
    return *t;
  };
  const SafetensorsTensor* q = tensor("input.query", &c->query);
  const SafetensorsTensor* k = tensor("input.key", &c->key);
  tensor("input.value", &c->value);
  tensor("expected.output", &c->expected_out);
  tensor("expected.weights", &c->expected_weights);
  EXPECT_TRUE(q != nullptr && k != nullptr);
  if (q == nullptr || k == nullptr) return nullptr;
  MultiHeadParams& p = c->params;
  p.module = &c->weights;
  p.batch = static_cast<int>(q->shape[0]);
  p.q_len = static_cast<int>(q->shape[1]);
  p.kv_len = static_cast<int>(k->shape[1]);
  p.self_attention = c->query == c->key && c->query == c->value;
  p.query = c->query.data();
  p.key = p.self_attention ? c->query.data() : c->key.data();
  p.value = p.self_attention ? c->query.data() : c->value.data();
  p.scale = 1.0f / std::sqrt(static_cast<float>(c->weights.head_dim()));
  std::vector<float> mask;
  if (const SafetensorsTensor* m = tensor("input.mask", &mask)) {
    // Right-align the mask's shape with [B, h, Lq, Lk]; size-1 dimensions broadcast.
    std::vector<int64_t> shape(4 - m->shape.size(), 1);
    shape.insert(shape.end(), m->shape.begin(), m->shape.end());
    int64_t strides[4];
    int64_t stride = 1;
    for (int d = 3; d >= 0; --d) {
      strides[d] = shape[d] == 1 ? 0 : stride;
      stride *= shape[d];
    }
    c->mask.resize(mask.size());
    for (size_t n = 0; n < mask.size(); ++n) c->mask[n] = mask[n] != 0.0f;
    p.mask = MaskView{c->mask.data(), strides[0], strides[1], strides[2], strides[3]};
  }
  return c;
}

TEST_P(CpuBackendIsaTest, SeedVectorsMatchExpected) {
  for (const char* name : {"seed_demo", "cross_padding", "causal", "blocked_rows"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<SeedCase> c = LoadSeed(name);
    ASSERT_NE(c, nullptr);
    for (bool with_weights : {false, true}) {
      std::vector<float> out(c->expected_out.size(), NAN);
      std::vector<float> weights(c->expected_weights.size(), NAN);
      MultiHeadParams p = c->params;
      p.out = out.data();
      p.weights = with_weights ? weights.data() : nullptr;
      ASSERT_TRUE(backend_->MultiHead({p}).ok());
      ASSERT_TRUE(AllFinite(out));
      for (size_t n = 0; n < out.size(); ++n) {
        ASSERT_NEAR(out[n], c->expected_out[n], 1e-5) << "output element " << n;
      }
      if (with_weights) {
        ASSERT_TRUE(AllFinite(weights));
        for (size_t n = 0; n < weights.size(); ++n) {
          ASSERT_NEAR(weights[n], c->expected_weights[n], 1e-5) << "weight element " << n;
        }
      }
    }
  }
}

// Bitwise batch invariance: one problem alone, and among companions in different orders, on
// backends of 1, 2 and 3 threads, must give the same bits (with and without weights).
TEST_P(CpuBackendIsaTest, AttendIsBatchInvariant) {
  const AttentionSpec target = {.batch = 2,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .q_len = 130,
                                .kv_len = 200,
                                .head_dim = 64,
                                .v_head_dim = 64,
                                .mask = MaskKind::kKeyPadding,
                                .causal = true,
                                .key_lengths = {200, 150},
                                .seed = 7};
  const std::vector<AttentionSpec> companions = {
      {.batch = 1,
       .num_heads = 2,
       .num_kv_heads = 2,
       .q_len = 300,
       .kv_len = 300,
       .head_dim = 64,
       .v_head_dim = 64,
       .seed = 8},
      {.batch = 3,
       .num_heads = 1,
       .num_kv_heads = 1,
       .q_len = 5,
       .kv_len = 9,
       .head_dim = 24,
       .v_head_dim = 24,
       .seed = 9},
      {.batch = 1,
       .num_heads = 8,
       .num_kv_heads = 1,
       .q_len = 64,
       .kv_len = 1000,
       .head_dim = 128,
       .v_head_dim = 128,
       .causal = true,
       .seed = 10},
  };
  for (bool with_weights : {false, true}) {
    SCOPED_TRACE(with_weights ? "with weights" : "fused");
    AttentionCase alone(target);
    ASSERT_TRUE(MakeBackend(GetParam(), 1)->Attend({alone.params(with_weights)}).ok());
    const std::vector<float> expected_out = alone.DenseOut();
    const std::vector<float> expected_weights = alone.weights();

    for (int threads : {1, 2, 3}) {
      std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), threads);
      // Orders: target first, in the middle, last.
      for (int position = 0; position <= 3; ++position) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, position " << position);
        AttentionCase c(target);
        c.PoisonOutputs();
        std::vector<std::unique_ptr<AttentionCase>> others;
        std::vector<AttentionParams> batch;
        for (const AttentionSpec& s : companions) {
          others.push_back(std::make_unique<AttentionCase>(s));
          batch.push_back(others.back()->params(position % 2 == 0));
        }
        batch.insert(batch.begin() + position, c.params(with_weights));
        ASSERT_TRUE(backend->Attend(batch).ok());
        const std::vector<float> out = c.DenseOut();
        ASSERT_EQ(std::memcmp(out.data(), expected_out.data(), out.size() * sizeof(float)), 0);
        if (with_weights) {
          ASSERT_EQ(std::memcmp(c.weights().data(), expected_weights.data(),
                                expected_weights.size() * sizeof(float)),
                    0);
        }
      }
    }
  }
}

TEST_P(CpuBackendIsaTest, MultiHeadIsBatchInvariant) {
  // Long enough (B·L = 600 rows) that each projection spans several row chunks (of 128 rows).
  const MultiHeadWeights w = RandomWeights(128, 4, 1);
  const MultiHeadWeights w2 = RandomWeights(64, 2, 2);
  const std::vector<float> x = RandomVector(2 * 300 * 128, 3);
  const std::vector<float> y = RandomVector(3 * 50 * 64, 4);
  const std::vector<float> z = RandomVector(1 * 700 * 128, 5);
  auto self_params = [](const MultiHeadWeights& m, const std::vector<float>& in, int batch, int len,
                        std::vector<float>* out) {
    MultiHeadParams p;
    p.module = &m;
    p.batch = batch;
    p.q_len = p.kv_len = len;
    p.query = p.key = p.value = in.data();
    p.self_attention = true;
    p.causal = true;
    p.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim()));
    out->assign(int64_t{batch} * len * m.d_model, NAN);
    p.out = out->data();
    return p;
  };
  std::vector<float> expected, out, out_y, out_z;
  ASSERT_TRUE(MakeBackend(GetParam(), 1)->MultiHead({self_params(w, x, 2, 300, &expected)}).ok());
  for (int threads : {1, 2, 3}) {
    std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), threads);
    for (int position = 0; position <= 2; ++position) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, position " << position);
      std::vector<MultiHeadParams> batch = {self_params(w2, y, 3, 50, &out_y),
                                            self_params(w, z, 1, 700, &out_z)};
      batch.insert(batch.begin() + position, self_params(w, x, 2, 300, &out));
      ASSERT_TRUE(backend->MultiHead(batch).ok());
      ASSERT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0);
    }
  }
}

// Project (module sessions' projections): the float64 reference's values within float32 GEMM
// error, for W_qkv (Q, K and V side by side in each row) and W_o; and the bits of an item do
// not depend on its batch companions, its position or the thread count (600 rows: several row
// chunks).
TEST_P(CpuBackendIsaTest, ProjectMatchesReferenceAndIsBatchInvariant) {
  const MultiHeadWeights w = RandomWeights(128, 4, 1);
  const MultiHeadWeights w2 = RandomWeights(64, 2, 2);
  const std::vector<float> x = RandomVector(600 * 128, 3);
  const std::vector<float> other = RandomVector(50 * 64, 4);
  using Weights = ProjectionParams::Weights;
  auto params = [](const MultiHeadWeights& m, Weights which, const std::vector<float>& in,
                   int64_t rows, std::vector<float>* out) {
    ProjectionParams p{.module = &m, .weights = which, .x = in.data(), .rows = rows};
    out->assign(rows * p.n(), NAN);
    p.y = out->data();
    return p;
  };
  for (const Weights which : {Weights::kQkv, Weights::kOut}) {
    SCOPED_TRACE(which == Weights::kQkv ? "W_qkv" : "W_o");
    std::vector<float> want, expected, out, out_other;
    ReferenceBackend reference;
    ASSERT_TRUE(reference.Project({params(w, which, x, 600, &want)}).ok());
    ASSERT_TRUE(MakeBackend(GetParam(), 1)->Project({params(w, which, x, 600, &expected)}).ok());
    double err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::abs(double{expected[i]} - want[i]) / (1 + std::abs(want[i])));
    }
    EXPECT_LE(err, 1e-5);
    for (int threads : {1, 2, 3}) {
      std::unique_ptr<CpuBackend> backend = MakeBackend(GetParam(), threads);
      for (int position = 0; position <= 1; ++position) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, position " << position);
        std::vector<ProjectionParams> batch = {params(w2, which, other, 50, &out_other)};
        batch.insert(batch.begin() + position, params(w, which, x, 600, &out));
        ASSERT_TRUE(backend->Project(batch).ok());
        ASSERT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST_P(CpuBackendIsaTest, ConcurrentCallsAgree) {
  AttentionCase a({.batch = 2,
                   .num_heads = 4,
                   .num_kv_heads = 4,
                   .q_len = 200,
                   .kv_len = 200,
                   .head_dim = 64,
                   .v_head_dim = 64,
                   .seed = 3});
  AttentionCase b({.batch = 2,
                   .num_heads = 4,
                   .num_kv_heads = 4,
                   .q_len = 200,
                   .kv_len = 200,
                   .head_dim = 64,
                   .v_head_dim = 64,
                   .seed = 3});
  std::thread other([&] { ASSERT_TRUE(backend_->Attend({a.params()}).ok()); });
  ASSERT_TRUE(backend_->Attend({b.params()}).ok());
  other.join();
  const std::vector<float> oa = a.DenseOut(), ob = b.DenseOut();
  EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuBackendIsaTest,
                         ::testing::Values(Isa::kGeneric, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// The 16-bit paths: bfloat16 operands, float32 accumulation. Each path this CPU can run is
// tested (forced through CpuBackendOptions::bf16_isa); the others skip and say so. The AMX path
// also runs with its tile instructions emulated (amx_emu.h) wherever AVX512_BF16 is, so that it
// is checked on machines without AMX too. Bound, as the float32 paths:
// err(fast) <= 2 · err(plain bf16 implementation) + 1e-6, against float64.
// Inputs: BFLOAT16 requests, and FLOAT32 / FLOAT16 ones under float32_as_bf16.

// A 16-bit path under test: a kernel of this CPU, or the emulated AMX kernel.
struct Bf16Path {
  Bf16Isa isa;
  bool emulated = false;
};

std::string PathName(const Bf16Path& path) {
  return std::string(Bf16IsaName(path.isa)) + (path.emulated ? "_emulated" : "");
}
void PrintTo(const Bf16Path& path, std::ostream* os) { *os << PathName(path); }

// Empty when `path` runs here, else why not.
std::string WhyNotHere(const Bf16Path& path) {
#if defined(ATTNSERVE_HAVE_AMX_EMULATION)
  if (path.emulated) {
    return CpuSupports(Bf16Isa::kAvx512Bf16) ? "" : "the AMX emulation needs AVX512_BF16";
  }
#else
  if (path.emulated) return "no AMX emulation in this build (x86-64 only)";
#endif
  return CpuSupports(path.isa) ? "" : "not supported by this CPU";
}

std::unique_ptr<CpuBackend> MakeBf16Backend(const Bf16Path& path, int threads,
                                            bool float32_as_bf16) {
  if (!path.emulated) return MakeBackend(BestIsa(), threads, path.isa, float32_as_bf16);
#if defined(ATTNSERVE_HAVE_AMX_EMULATION)
  auto backend =
      CpuBackend::CreateWithBf16Kernel(CpuBackendOptions{.num_threads = threads,
                                                         .min_flops_per_thread = 0,
                                                         .isa = BestIsa(),
                                                         .float32_as_bf16 = float32_as_bf16},
                                       kAmxEmulatedAttentionKernel);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
#else
  return nullptr;
#endif
}

class CpuBackendBf16Test : public ::testing::TestWithParam<Bf16Path> {
 protected:
  void SetUp() override {
    if (const std::string why = WhyNotHere(GetParam()); !why.empty()) {
      GTEST_SKIP() << "16-bit path " << PathName(GetParam()) << ": " << why;
    }
    backend_ = MakeBf16Backend(GetParam(), 2, /*float32_as_bf16=*/true);
    ASSERT_NE(backend_, nullptr);
    ASSERT_EQ(backend_->bf16_isa(), GetParam().isa);
  }
  std::unique_ptr<CpuBackend> backend_;
};

TEST_P(CpuBackendBf16Test, AttendMatchesReferenceWithinBf16Bound) {
  CheckAttendSweep(*backend_, {DType::kBFloat16, DType::kFloat32, DType::kFloat16},
                   NaiveAttentionBf16);
}

// Requests asking for the weights take the float32 kernel: still within the bound.
TEST_P(CpuBackendBf16Test, AttendWithWeightsMatchesReference) {
  for (AttentionSpec spec : SweepSpecs()) {
    spec.dtype = DType::kBFloat16;
    SCOPED_TRACE(spec.DebugString());
    AttentionCase c(spec);
    c.PoisonOutputs();
    const AttentionParams p = c.params(/*with_weights=*/true);
    const Reference64 ref = ReferenceAttention64(p);
    std::vector<float> naive_out, naive_weights;
    NaiveAttentionBf16(p, &naive_out, &naive_weights);
    ASSERT_TRUE(backend_->Attend({p}).ok());
    ExpectWithinBound(MaxAbsError(c.DenseOut(), ref.out), MaxAbsError(naive_out, ref.out), "out");
    ExpectWithinBound(MaxAbsError(c.weights(), ref.weights),
                      MaxAbsError(naive_weights, ref.weights), "weights");
  }
}

TEST_P(CpuBackendBf16Test, MultiHeadMatchesReferenceWithinBf16Bound) {
  CheckMultiHeadSweep(*backend_, 300, {DType::kBFloat16, DType::kFloat32, DType::kFloat16},
                      NaiveMultiHeadBf16);
}

// The PyTorch seed vectors (float32 inputs) on the 16-bit path. Tolerance: every operand is
// rounded to bfloat16 (relative error 2^-9 each), through two projections and the attention;
// measured 2.1e-3 to 3.8e-3 on the four cases; the tolerance is 1e-2 (2.5 bfloat16 ulps of 1).
TEST_P(CpuBackendBf16Test, SeedVectorsMatchExpectedWithinBf16Tolerance) {
  constexpr double kTolerance = 1e-2;
  for (const char* name : {"seed_demo", "cross_padding", "causal", "blocked_rows"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<SeedCase> c = LoadSeed(name);
    ASSERT_NE(c, nullptr);
    std::vector<float> out(c->expected_out.size(), NAN);
    MultiHeadParams p = c->params;
    p.out = out.data();
    ASSERT_TRUE(backend_->MultiHead({p}).ok());
    ASSERT_TRUE(AllFinite(out));
    double err = 0;
    for (size_t n = 0; n < out.size(); ++n) {
      err = std::max(err, std::abs(static_cast<double>(out[n]) - c->expected_out[n]));
    }
    EXPECT_LE(err, kTolerance);
    // And within the bound of the plain bfloat16 implementation against float64.
    std::vector<float> naive_out, naive_weights;
    NaiveMultiHeadBf16(p, &naive_out, &naive_weights);
    const Reference64 ref = ReferenceMultiHead64(p);
    ExpectWithinBound(MaxAbsError(out, ref.out), MaxAbsError(naive_out, ref.out), "out");
  }
}

// Batch invariance on each 16-bit path: alone, among companions in every position, 1-3 threads.
TEST_P(CpuBackendBf16Test, AttendIsBatchInvariant) {
  const AttentionSpec target = {.batch = 2,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .q_len = 130,
                                .kv_len = 200,
                                .head_dim = 64,
                                .v_head_dim = 64,
                                .mask = MaskKind::kKeyPadding,
                                .causal = true,
                                .key_lengths = {200, 150},
                                .dtype = DType::kBFloat16,
                                .seed = 7};
  const std::vector<AttentionSpec> companions = {
      {.batch = 1,
       .num_heads = 2,
       .num_kv_heads = 2,
       .q_len = 300,
       .kv_len = 300,
       .head_dim = 64,
       .v_head_dim = 64,
       .dtype = DType::kBFloat16,
       .seed = 8},
      {.batch = 3,
       .num_heads = 1,
       .num_kv_heads = 1,
       .q_len = 5,
       .kv_len = 9,
       .head_dim = 24,
       .v_head_dim = 24,
       .seed = 9},
      {.batch = 1,
       .num_heads = 8,
       .num_kv_heads = 1,
       .q_len = 64,
       .kv_len = 1000,
       .head_dim = 128,
       .v_head_dim = 128,
       .causal = true,
       .dtype = DType::kBFloat16,
       .seed = 10},
  };
  AttentionCase alone(target);
  ASSERT_TRUE(MakeBf16Backend(GetParam(), 1, true)->Attend({alone.params()}).ok());
  const std::vector<float> expected = alone.DenseOut();
  for (int threads : {1, 2, 3}) {
    std::unique_ptr<CpuBackend> backend = MakeBf16Backend(GetParam(), threads, true);
    for (int position = 0; position <= 3; ++position) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, position " << position);
      AttentionCase c(target);
      c.PoisonOutputs();
      std::vector<std::unique_ptr<AttentionCase>> others;
      std::vector<AttentionParams> batch;
      for (const AttentionSpec& s : companions) {
        others.push_back(std::make_unique<AttentionCase>(s));
        batch.push_back(others.back()->params(position % 2 == 0));
      }
      batch.insert(batch.begin() + position, c.params());
      ASSERT_TRUE(backend->Attend(batch).ok());
      const std::vector<float> out = c.DenseOut();
      ASSERT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0);
    }
  }
}

TEST_P(CpuBackendBf16Test, MultiHeadIsBatchInvariant) {
  const MultiHeadWeights w = RandomWeights(128, 4, 1);
  const MultiHeadWeights w2 = RandomWeights(64, 2, 2);
  const std::vector<float> x = RandomVector(2 * 300 * 128, 3, DType::kBFloat16);
  const std::vector<float> y = RandomVector(3 * 50 * 64, 4, DType::kBFloat16);
  const std::vector<float> z = RandomVector(1 * 700 * 128, 5);
  std::vector<uint16_t> x16, y16, unused;
  const void* xd = InputData(DType::kBFloat16, x, &x16);
  const void* yd = InputData(DType::kBFloat16, y, &y16);
  auto self_params = [](const MultiHeadWeights& m, const void* in, DType dtype, int batch, int len,
                        std::vector<float>* out) {
    MultiHeadParams p;
    p.module = &m;
    p.batch = batch;
    p.q_len = p.kv_len = len;
    p.query = p.key = p.value = in;
    p.input_dtype = dtype;
    p.self_attention = true;
    p.causal = true;
    p.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim()));
    out->assign(int64_t{batch} * len * m.d_model, NAN);
    p.out = out->data();
    return p;
  };
  std::vector<float> expected, out, out_y, out_z;
  ASSERT_TRUE(MakeBf16Backend(GetParam(), 1, true)
                  ->MultiHead({self_params(w, xd, DType::kBFloat16, 2, 300, &expected)})
                  .ok());
  for (int threads : {1, 2, 3}) {
    std::unique_ptr<CpuBackend> backend = MakeBf16Backend(GetParam(), threads, true);
    for (int position = 0; position <= 2; ++position) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, position " << position);
      std::vector<MultiHeadParams> batch = {
          self_params(w2, yd, DType::kBFloat16, 3, 50, &out_y),
          self_params(w, z.data(), DType::kFloat32, 1, 700, &out_z)};
      batch.insert(batch.begin() + position, self_params(w, xd, DType::kBFloat16, 2, 300, &out));
      ASSERT_TRUE(backend->MultiHead(batch).ok());
      ASSERT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0);
    }
  }
}

// Without the opt-in, FLOAT32 and FLOAT16 requests stay exact: the bits of the float32 kernel.
TEST_P(CpuBackendBf16Test, Float32AndFloat16StayExactByDefault) {
  std::unique_ptr<CpuBackend> exact = MakeBf16Backend(GetParam(), 2, false);
  std::unique_ptr<CpuBackend> float32 = MakeBackend(BestIsa(), 2, Bf16Isa::kNone);
  EXPECT_EQ(exact->float32_precision(), "fp32: float32 arithmetic");
  EXPECT_THAT(backend_->float32_precision(), ::testing::HasSubstr(PathName(GetParam())));
  for (DType t : {DType::kFloat32, DType::kFloat16}) {
    AttentionCase a({.batch = 1,
                     .num_heads = 2,
                     .num_kv_heads = 2,
                     .q_len = 70,
                     .kv_len = 150,
                     .head_dim = 64,
                     .v_head_dim = 64,
                     .dtype = t});
    ASSERT_TRUE(exact->Attend({a.params()}).ok());
    const std::vector<float> got = a.DenseOut();
    ASSERT_TRUE(float32->Attend({a.params()}).ok());
    const std::vector<float> want = a.DenseOut();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuBackendBf16Test,
                         ::testing::Values(Bf16Path{Bf16Isa::kAmx}, Bf16Path{Bf16Isa::kAvx512Bf16},
                                           Bf16Path{Bf16Isa::kAmx, /*emulated=*/true}),
                         [](const ::testing::TestParamInfo<Bf16Path>& info) {
                           return PathName(info.param);
                         });

#if defined(ATTNSERVE_HAVE_AMX_EMULATION)
TEST(CpuBackendTest, CreateWithBf16KernelChecksTheIsa) {
  auto backend = CpuBackend::CreateWithBf16Kernel(
      CpuBackendOptions{.num_threads = 1, .bf16_isa = Bf16Isa::kAvx512Bf16},
      kAmxEmulatedAttentionKernel);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()),
              ::testing::HasSubstr("(amx_bf16 for amx_bf16_emulated); was avx512_bf16"));
  if (CpuSupports(Bf16Isa::kAvx512Bf16)) {
    backend = CpuBackend::CreateWithBf16Kernel(CpuBackendOptions{.num_threads = 1},
                                               kAmxEmulatedAttentionKernel);
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->bf16_isa(), Bf16Isa::kAmx);
    EXPECT_THAT((*backend)->devices()[0].name, ::testing::HasSubstr("bf16 amx_bf16"));
  } else {
    EXPECT_EQ(CpuBackend::CreateWithBf16Kernel(CpuBackendOptions{}, kAmxEmulatedAttentionKernel)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// The emulated AMX kernel really runs tile products, and agrees with the AVX512_BF16 kernel (same
// operands and softmax, other summation orders): max |amx - avx512_bf16| <= err(plain bf16) + 1e-6
// over the Attend sweep in BFLOAT16 (measured: at most 0.29 x err(plain bf16), Lk = 257, Dv = 24;
// below 0.06 x elsewhere). On a machine with AMX, likewise with the real AMX kernel (same
// algorithm; only the silicon's rounding may differ), and the share of bit-identical outputs is
// printed: how closely the SDM's arithmetic, which the emulation follows, matches the silicon.
TEST(CpuBackendAmxEmulationTest, RunsTilesAndAgreesWithTheOtherPaths) {
  if (!CpuSupports(Bf16Isa::kAvx512Bf16)) GTEST_SKIP() << "the AMX emulation needs AVX512_BF16";
  std::unique_ptr<CpuBackend> emulated = MakeBf16Backend({Bf16Isa::kAmx, true}, 2, false);
  ASSERT_NE(emulated, nullptr);
  std::vector<std::unique_ptr<CpuBackend>> others;
  others.push_back(MakeBackend(BestIsa(), 2, Bf16Isa::kAvx512Bf16));
  if (CpuSupports(Bf16Isa::kAmx)) {
    others.push_back(MakeBackend(BestIsa(), 2, Bf16Isa::kAmx));
  } else {
    std::printf("no AMX here: the emulated AMX kernel is compared with avx512_bf16 only\n");
  }
  int64_t same_bits_as_amx = 0, outputs = 0;
  for (AttentionSpec spec : SweepSpecs()) {
    spec.dtype = DType::kBFloat16;
    SCOPED_TRACE(spec.DebugString());
    AttentionCase c(spec);
    const AttentionParams p = c.params();
    const uint64_t tiles_before = ::attnserve::kernels::testing::amx_emu::DpBf16PsCount();
    ASSERT_TRUE(emulated->Attend({p}).ok());
    EXPECT_GT(::attnserve::kernels::testing::amx_emu::DpBf16PsCount(), tiles_before);
    const std::vector<float> out = c.DenseOut();
    std::vector<float> naive_out, naive_weights;
    NaiveAttentionBf16(p, &naive_out, &naive_weights);
    const double naive_err = MaxAbsError(naive_out, ReferenceAttention64(p).out);
    for (const std::unique_ptr<CpuBackend>& other : others) {
      ASSERT_NE(other, nullptr);
      SCOPED_TRACE(Bf16IsaName(other->bf16_isa()));
      ASSERT_TRUE(other->Attend({p}).ok());
      const std::vector<float> other_out = c.DenseOut();
      EXPECT_LE(MaxAbsError(out, std::vector<double>(other_out.begin(), other_out.end())),
                naive_err + 1e-6);
      if (other->bf16_isa() == Bf16Isa::kAmx) {
        for (size_t n = 0; n < out.size(); ++n) {
          same_bits_as_amx += std::memcmp(&out[n], &other_out[n], sizeof(float)) == 0;
        }
        outputs += static_cast<int64_t>(out.size());
      }
    }
  }
  if (outputs > 0) {
    std::printf("emulated vs real AMX: %lld of %lld outputs bit-identical\n",
                static_cast<long long>(same_bits_as_amx), static_cast<long long>(outputs));
  }
}
#endif

// With the 16-bit path off (a CPU without AVX512_BF16), BFLOAT16 requests compute in float32:
// the bits of their float32 values.
TEST(CpuBackendTest, WithoutBf16PathBFloat16ComputesInFloat32) {
  std::unique_ptr<CpuBackend> backend = MakeBackend(BestIsa(), 2, Bf16Isa::kNone, true);
  EXPECT_EQ(backend->float32_precision(), "fp32: float32 arithmetic");
  AttentionCase c({.batch = 1,
                   .num_heads = 2,
                   .num_kv_heads = 1,
                   .q_len = 70,
                   .kv_len = 150,
                   .head_dim = 64,
                   .v_head_dim = 64,
                   .dtype = DType::kBFloat16});
  ASSERT_TRUE(backend->Attend({c.float32_params()}).ok());
  const std::vector<float> want = c.DenseOut();
  ASSERT_TRUE(backend->Attend({c.params()}).ok());
  const std::vector<float> got = c.DenseOut();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

// ---------------------------------------------------------------------------------------------
// The NaN rule of attention_params.h, on the reference, every float32 kernel and every 16-bit
// path this CPU has. One causal head (Lq = Lk = 70, so key tiles and query blocks both split),
// non-finite values planted where each rule decides the outcome.

struct NanCase {
  static constexpr int kLen = 70, kDim = 16;
  std::vector<float> q = RandomVector(kLen * kDim, 1, DType::kBFloat16);
  std::vector<float> k = RandomVector(kLen * kDim, 2, DType::kBFloat16);
  std::vector<float> v = RandomVector(kLen * kDim, 3, DType::kBFloat16);
  std::vector<uint16_t> q16, k16, v16;
  std::vector<float> out = std::vector<float>(kLen * kDim, 0.0f);
  std::vector<int32_t> key_lengths;

  AttentionParams Params(DType dtype) {
    AttentionParams p;
    p.batch = p.num_heads = p.num_kv_heads = 1;
    p.q_len = p.kv_len = kLen;
    p.head_dim = p.v_head_dim = kDim;
    p.input_dtype = dtype;
    p.q = {InputData(dtype, q, &q16), kLen * kDim, kLen * kDim, kDim};
    p.k = {InputData(dtype, k, &k16), kLen * kDim, kLen * kDim, kDim};
    p.v = {InputData(dtype, v, &v16), kLen * kDim, kLen * kDim, kDim};
    p.out = {out.data(), kLen * kDim, kLen * kDim, kDim};
    p.causal = true;
    p.key_lengths = key_lengths.empty() ? nullptr : key_lengths.data();
    p.scale = 0.25f;
    return p;
  }
  bool RowAllNan(int i) const {
    for (int c = 0; c < kDim; ++c) {
      if (!std::isnan(out[i * kDim + c])) return false;
    }
    return true;
  }
  bool RowFinite(int i) const {
    for (int c = 0; c < kDim; ++c) {
      if (!std::isfinite(out[i * kDim + c])) return false;
    }
    return true;
  }
};

void CheckNanRule(Backend& backend, DType dtype) {
  constexpr int L = NanCase::kLen, D = NanCase::kDim;
  {
    SCOPED_TRACE("rule 1: NaN in q row 5 -> row 5 NaN, the others finite");
    NanCase c;
    c.q[5 * D + 3] = NAN;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    EXPECT_TRUE(c.RowAllNan(5));
    for (int i = 0; i < L; ++i) {
      if (i != 5) {
        EXPECT_TRUE(c.RowFinite(i)) << "row " << i;
      }
    }
  }
  {
    SCOPED_TRACE("rules 1 and 3: NaN in k row 40 -> rows that see key 40 NaN, earlier finite");
    NanCase c;
    c.k[40 * D + 7] = NAN;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    for (int i = 0; i < L; ++i) {
      if (i < 40) {
        EXPECT_TRUE(c.RowFinite(i)) << "row " << i;
      } else {
        EXPECT_TRUE(c.RowAllNan(i)) << "row " << i;
      }
    }
  }
  {
    SCOPED_TRACE("rule 1: +Inf score (q = +Inf against positive k) -> NaN row");
    NanCase c;
    for (int j = 0; j < L; ++j) c.k[j * D] = std::abs(c.k[j * D]) + 0.5f;
    c.q[66 * D] = INFINITY;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    EXPECT_TRUE(c.RowAllNan(66));
    EXPECT_TRUE(c.RowFinite(65));
  }
  {
    SCOPED_TRACE("rule 2: every allowed score -Inf -> the uniform average of all values");
    NanCase c;
    for (int j = 0; j < L; ++j) c.k[j * D] = std::abs(c.k[j * D]) + 0.5f;
    c.q[69 * D] = -INFINITY;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    for (int col = 0; col < D; ++col) {
      double mean = 0;
      for (int j = 0; j < L; ++j) mean += c.v[j * D + col];
      EXPECT_NEAR(c.out[69 * D + col], mean / L, 1e-5) << "column " << col;
    }
  }
  {
    SCOPED_TRACE("rule 3: NaN in the k of a key blocked by key_lengths has no effect");
    NanCase c;
    c.key_lengths = {50};
    c.k[60 * D + 2] = NAN;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    for (int i = 0; i < L; ++i) EXPECT_TRUE(c.RowFinite(i)) << "row " << i;
  }
  {
    SCOPED_TRACE("rules 1 and 2 with the weights asked for");
    NanCase c;
    for (int j = 0; j < L; ++j) c.k[j * D] = std::abs(c.k[j * D]) + 0.5f;
    c.q[5 * D + 3] = NAN;
    c.q[69 * D] = -INFINITY;
    std::vector<float> weights(L * L, 0.0f);
    AttentionParams p = c.Params(dtype);
    p.weights = weights.data();
    ASSERT_TRUE(backend.Attend({p}).ok());
    EXPECT_TRUE(c.RowAllNan(5));
    for (int j = 0; j < L; ++j) {
      EXPECT_TRUE(std::isnan(weights[5 * L + j])) << "weight " << j;
      EXPECT_FLOAT_EQ(weights[69 * L + j], 1.0f / L) << "weight " << j;
    }
    EXPECT_TRUE(c.RowFinite(4));
  }
  {
    SCOPED_TRACE("rule 4: NaN in v[30][4] -> column 4 NaN for rows that see key 30 only");
    NanCase c;
    c.v[30 * D + 4] = NAN;
    ASSERT_TRUE(backend.Attend({c.Params(dtype)}).ok());
    for (int i = 30; i < L; ++i) {
      EXPECT_TRUE(std::isnan(c.out[i * D + 4])) << "row " << i;
      for (int col = 0; col < D; ++col) {
        if (col != 4) {
          EXPECT_TRUE(std::isfinite(c.out[i * D + col])) << "row " << i;
        }
      }
    }
  }
}

TEST(NanRuleTest, Reference) {
  ReferenceBackend reference;
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    CheckNanRule(reference, t);
  }
}

TEST_P(CpuBackendIsaTest, FollowsTheNanRule) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    CheckNanRule(*backend_, t);
  }
}

TEST_P(CpuBackendBf16Test, FollowsTheNanRule) {
  for (DType t : {DType::kBFloat16, DType::kFloat32}) {  // both on the 16-bit path here
    SCOPED_TRACE(DTypeName(t));
    CheckNanRule(*backend_, t);
  }
}

TEST(CpuBackendTest, CreateRejectsBadOptions) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = -1});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()), ::testing::HasSubstr("was -1"));
  for (double bad : {-1.0, std::nan("")}) {
    backend = CpuBackend::Create(CpuBackendOptions{.min_flops_per_thread = bad});
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(backend.status().message()),
                ::testing::HasSubstr("min_flops_per_thread must be >= 0"));
  }
}

// A step gets one thread per min_flops_per_thread of its arithmetic, at least one, at most the
// pool; 0 gives every step the whole pool.
TEST(CpuBackendTest, ThreadsFollowTheStepsArithmetic) {
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 4}).value();
  EXPECT_EQ(backend->ThreadsFor(0), 1);
  EXPECT_EQ(backend->ThreadsFor(1.05e6), 1);  // Attend [1,4,32,64]
  EXPECT_EQ(backend->ThreadsFor(3.99e6), 1);
  EXPECT_EQ(backend->ThreadsFor(8.4e6), 2);   // Attend [1,8,64,64]
  EXPECT_EQ(backend->ThreadsFor(16.8e6), 4);  // Attend [1,4,128,64]
  EXPECT_EQ(backend->ThreadsFor(1e12), 4);
  auto all = CpuBackend::Create(CpuBackendOptions{.num_threads = 4, .min_flops_per_thread = 0});
  EXPECT_EQ(all.value()->ThreadsFor(0), 4);
  EXPECT_EQ(all.value()->ThreadsFor(1e3), 4);
  auto custom = CpuBackend::Create(CpuBackendOptions{.num_threads = 3, .min_flops_per_thread = 10});
  EXPECT_EQ(custom.value()->ThreadsFor(25), 2);
  EXPECT_EQ(custom.value()->ThreadsFor(35), 3);
}

// The threads a step is given change no bit of its answer: the same calls, small (one thread
// under the default) and large, on a backend that splits every step and one that does not.
TEST(CpuBackendTest, TheStepsThreadsChangeNoBit) {
  auto split = MakeBackend(BestIsa(), 3);  // min_flops_per_thread 0
  auto defaults = CpuBackend::Create(CpuBackendOptions{.num_threads = 3}).value();
  for (int len : {8, 200}) {
    const AttentionSpec spec{.batch = 2,
                             .num_heads = 4,
                             .num_kv_heads = 4,
                             .q_len = len,
                             .kv_len = len,
                             .head_dim = 32,
                             .v_head_dim = 32,
                             .seed = 11};
    AttentionCase a(spec);
    AttentionCase b(spec);
    ASSERT_TRUE(split->Attend({a.params()}).ok());
    ASSERT_TRUE(defaults->Attend({b.params()}).ok());
    EXPECT_EQ(a.DenseOut(), b.DenseOut()) << "L " << len;
  }
}

TEST(AvailableCoresTest, ParsesCgroupCpuLimits) {
  EXPECT_EQ(ParseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("50000 100000\n"), 0.5);
  EXPECT_EQ(ParseCgroupV2CpuMax("150000 100000"), 1.5);
  for (const char* bad : {"", "50000", "50000 100000 1", "0 100000", "50000 0", "-1 100000",
                          "5e4 100000", "50000 100000x"}) {
    EXPECT_EQ(ParseCgroupV2CpuMax(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(ParseCgroupV1CpuQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV1CpuQuota("10000\n", "100000\n"), 0.1);
  EXPECT_EQ(ParseCgroupV1CpuQuota("200000", "100000"), 2.0);
  EXPECT_EQ(ParseCgroupV1CpuQuota("", "100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV1CpuQuota("10000", "abc"), std::nullopt);

  EXPECT_EQ(CgroupV1Path("12:cpu,cpuacct:/a/b\n11:memory:/c\n0::/\n", "cpu"), "/a/b");
  EXPECT_EQ(CgroupV1Path("3:cpuacct:/x\n2:cpuset:/y\n", "cpu"), std::nullopt);
  EXPECT_EQ(CgroupV1Path("2:cpu:/p:q\n", "cpu"), "/p:q");
  EXPECT_EQ(CgroupV1Path("0::/user.slice\n", "cpu"), std::nullopt);

  EXPECT_EQ(CoresWithin(64, 1.0), 1);
  EXPECT_EQ(CoresWithin(64, 0.1), 1);  // a tenth of a core is still one thread's worth
  EXPECT_EQ(CoresWithin(64, 1.5), 2);
  EXPECT_EQ(CoresWithin(2, 8.0), 2);  // the affinity mask is the tighter
  EXPECT_EQ(CoresWithin(16, std::nullopt), 16);
  EXPECT_EQ(CoresWithin(0, std::nullopt), 1);
}

// This process in a real cgroup v1 group with a CPU quota (root and a writable cgroup v1 `cpu`
// hierarchy, as on the development machine; skipped elsewhere), then back in its own group.
TEST(AvailableCoresTest, FollowsARealCgroupV1Quota) {
  const std::string mount = "/sys/fs/cgroup/cpu";
  const std::optional<std::string> home =
      CgroupV1Path(ReadFileToString("/proc/self/cgroup").value_or(""), "cpu");
  if (!home.has_value() || access((mount + "/cgroup.procs").c_str(), W_OK) != 0) {
    GTEST_SKIP() << "no writable cgroup v1 cpu hierarchy";
  }
  const std::string home_dir = mount + (*home == "/" ? "" : *home);
  const std::string dir = home_dir + "/attnserve-cores-test-" + std::to_string(getpid());
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs(text.c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  };
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir << ": " << std::strerror(errno);
  const int outside = AvailableCores();
  int tenth = 0, one_and_a_half = 0;
  if (write(dir + "/cpu.cfs_period_us", "100000") && write(dir + "/cpu.cfs_quota_us", "10000") &&
      write(dir + "/cgroup.procs", std::to_string(getpid()))) {
    tenth = AvailableCores();
    if (write(dir + "/cpu.cfs_quota_us", "150000")) one_and_a_half = AvailableCores();
  }
  const bool back = write(home_dir + "/cgroup.procs", std::to_string(getpid()));
  const int again = AvailableCores();
  rmdir(dir.c_str());
  ASSERT_TRUE(back) << "could not move back to " << home_dir;
  EXPECT_EQ(tenth, 1);
  EXPECT_EQ(one_and_a_half, std::min(outside, 2));
  EXPECT_EQ(again, outside);
}

TEST(CpuBackendTest, DefaultsToAvailableCoresAndBestIsa) {
  auto backend = CpuBackend::Create({});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->num_threads(), AvailableCores());
  EXPECT_GE(AvailableCores(), 1);
  EXPECT_LE(AvailableCores(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ((*backend)->isa(), BestIsa());
  EXPECT_EQ((*backend)->bf16_isa(), BestBf16Isa());
  EXPECT_EQ((*backend)->name(), "cpu");
  ASSERT_EQ((*backend)->devices().size(), 1u);
  EXPECT_THAT((*backend)->devices()[0].name, ::testing::HasSubstr(IsaName(BestIsa())));
}

}  // namespace
}  // namespace attnserve::kernels::cpu
