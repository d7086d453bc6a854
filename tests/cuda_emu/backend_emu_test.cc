// CudaBackend (kernels/cuda/cuda_backend.cc: request packing, the device pool and pinned
// staging, streams, path selection, the weights copy-back) on the emulated device, with every
// path it picks: the tensor-core kernel, the generic kernel, the decode path, the plain path
// (weights, Dv > 256), a packed variable-length group, 16-bit inputs. Small shapes: the
// emulator starts one host thread per CUDA thread (tests/gpu/cuda_backend_test.cc holds the
// device-sized cases; of those, the ones without kernels run here too, cuda_backend_emu_test).
// The bound is the GPU test's: max|fast - ref| <= 2 max|naive - ref| + 1e-5, the naive path
// being the backend's own weights path in the same operand type.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "kernels/reference.h"
#include "tests/gpu/backend_problem.h"
#include "tests/gpu/linear_rows.h"

namespace attnserve::kernels::cuda {
namespace {

class BackendEmuTest : public testing::TestWithParam<ComputeType> {
 protected:
  void SetUp() override {
    CudaBackendOptions options;
    options.num_streams = 2;
    auto b = CudaBackend::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }

  // `pr` through the fused paths and the weights path, both against float64.
  void Check(Problem& pr, const std::string& what) {
    SCOPED_TRACE(what);
    CheckAgainstReference(*backend_, GetParam(), pr);
  }

  std::unique_ptr<CudaBackend> backend_;
};

// The tensor-core kernel (D = Dv = 64, and 24/32 zero-padded) with GQA, causal and a mask with
// a fully blocked row; the generic kernel (D = 40, Dv = 72); the plain path alone (Dv = 264).
TEST_P(BackendEmuTest, EveryPrefillPath) {
  std::mt19937 rng(1);
  Problem tc = MakeProblem(rng, 2, 2, 1, 9, 21, 64, 64);
  tc.causal = true;
  tc.mask.resize(size_t(2) * 9 * 21);
  for (size_t i = 0; i < tc.mask.size(); ++i) tc.mask[i] = rng() % 3 != 0;
  for (int j = 0; j < 21; ++j) tc.mask[4 * 21 + j] = 0;
  Check(tc, "tensor cores, hdim 64");
  Problem padded = MakeProblem(rng, 1, 2, 2, 7, 13, 24, 32);
  padded.key_lengths = {5};
  Check(padded, "tensor cores, hdim 32 padded");
  Problem generic = MakeProblem(rng, 1, 2, 2, 5, 11, 40, 72);
  Check(generic, "generic");
  Problem wide = MakeProblem(rng, 1, 2, 2, 3, 7, 32, 264);
  Check(wide, "naive only (Dv 264)");
}

// Sliding windows, soft-capping and ALiBi (ScoreMods) on every path: the tensor-core kernel
// with whole key blocks before the window skipped, the generic kernel, the decode path, the
// plain path. The weights path is checked against float64 too, so a modification both paths
// dropped would show.
TEST_P(BackendEmuTest, ScoreModsOnEveryPath) {
  std::mt19937 rng(7);
  Problem tc = MakeProblem(rng, 1, 2, 1, 20, 150, 64, 64);
  tc.causal = true;
  tc.mods = {.window_left = 24, .window_right = 0, .softcap = 2.0f};
  tc.slopes = {0.5f, 0.125f};
  Check(tc, "tensor cores: causal window of 25, soft-cap, ALiBi");
  Problem both = MakeProblem(rng, 1, 2, 2, 12, 40, 64, 64);
  both.mods = {.window_left = 3, .window_right = 5};
  both.mask.resize(size_t(12) * 40);
  for (size_t i = 0; i < both.mask.size(); ++i) both.mask[i] = rng() % 4 != 0;
  Check(both, "tensor cores: window on both sides with a mask");
  Problem generic = MakeProblem(rng, 1, 2, 2, 6, 45, 40, 72);
  generic.mods = {.window_left = 40, .window_right = -1, .softcap = 1.5f};
  generic.slopes = {0.25f, 1.0f};
  Check(generic, "generic: window, soft-cap, ALiBi");
  Problem decode = MakeProblem(rng, 2, 4, 2, 1, 300, 64, 64);
  decode.mods = {.window_left = 70, .window_right = -1, .softcap = 3.0f};
  decode.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  Check(decode, "decode: window across splits, soft-cap, ALiBi");
  Problem wide = MakeProblem(rng, 1, 2, 2, 3, 9, 32, 264);
  wide.mods = {.window_left = 1, .window_right = 1, .softcap = 1.0f};
  wide.slopes = {0.5f, 0.5f};
  Check(wide, "naive only (Dv 264): window, soft-cap, ALiBi");
}

// Decode steps (q_len 1): GQA 4/2, key lengths with 0 (a fully blocked row).
TEST_P(BackendEmuTest, DecodeSteps) {
  std::mt19937 rng(2);
  Problem pr = MakeProblem(rng, 3, 4, 2, 1, 40, 64, 64);
  pr.key_lengths = {40, 0, 7};
  Check(pr, "decode");
}

// Items of different lengths in one call (one packed launch), each against float64, and the
// bits of one item the same alone and among companions.
TEST_P(BackendEmuTest, PackedVariableLengthsAreBatchInvariant) {
  std::mt19937 rng(3);
  std::vector<Problem> problems;
  for (int l : {1, 9, 17}) problems.push_back(MakeProblem(rng, 1 + l % 2, 2, 2, l, l + 3, 64, 64));
  ASSERT_TRUE(backend_->AttendAs({problems[2].Params(false)}, GetParam()).ok());
  const std::vector<float> alone = problems[2].out;
  std::vector<AttentionParams> batch;
  for (Problem& pr : problems) batch.push_back(pr.Params(false));
  ASSERT_TRUE(backend_->AttendAs(batch, GetParam()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), problems[2].out.data(), alone.size() * sizeof(float)), 0);
  for (Problem& pr : problems) {
    const std::vector<float> fast = pr.out;
    const Reference64 ref = ReferenceAttention64(pr.Params(false));
    ASSERT_TRUE(backend_->AttendAs({pr.Params(true)}, GetParam()).ok());
    EXPECT_TRUE(WithinNaiveBound(fast, pr.out, ref.out));
  }
}

// 16-bit inputs go to the device as they are and give the bits of their float32 values.
TEST_P(BackendEmuTest, SixteenBitInputsGiveTheBitsOfTheirFloat32Values) {
  const DType dtype = GetParam() == ComputeType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  std::mt19937 rng(4);
  Problem pr = MakeProblem(rng, 2, 2, 1, 6, 10, 64, 64);
  pr.key_lengths = {0, 8};  // the value mean of a fully blocked row
  std::vector<uint16_t> enc[3];
  std::vector<float>* x[3] = {&pr.q, &pr.k, &pr.v};
  for (int n = 0; n < 3; ++n) {
    enc[n].resize(x[n]->size());
    FromFloat32(dtype, x[n]->data(), x[n]->size(), enc[n].data());
    ToFloat32(dtype, enc[n].data(), x[n]->size(), x[n]->data());
  }
  ASSERT_TRUE(backend_->AttendAs({pr.Params(false)}, GetParam()).ok());
  const std::vector<float> out32 = pr.out;
  AttentionParams p = pr.Params(false);
  p.input_dtype = dtype;
  p.q.data = enc[0].data();
  p.k.data = enc[1].data();
  p.v.data = enc[2].data();
  ASSERT_TRUE(backend_->Attend({p}).ok());
  EXPECT_EQ(std::memcmp(pr.out.data(), out32.data(), out32.size() * sizeof(float)), 0);
}

// The module path (RunMultiHead: projections through cuBLASLt, the heads of the projections as
// HeadAttentionParams splits them, the output projection): self-attention with causal and a
// [B, 1, Lq, Lk] mask with a fully blocked row (heads of d_k 16, padded to 32), and
// cross-attention with key lengths (d_k 32), against float64 with the GPU test's bound.
TEST_P(BackendEmuTest, MultiHeadSelfAndCross) {
  std::mt19937 rng(5);
  for (bool self : {true, false}) {
    SCOPED_TRACE(self ? "self" : "cross");
    const MultiHeadWeights m = RandomModule(rng, 64, self ? 4 : 2);
    MultiHeadProblem pr = MakeMultiHeadProblem(rng, m, 2, 7, 12, self);
    if (self) {
      pr.mask.resize(size_t(2) * 7 * 7);
      for (uint8_t& e : pr.mask) e = rng() % 4 != 0;
      for (int j = 0; j < 7; ++j) pr.mask[size_t(1) * 7 * 7 + 3 * 7 + j] = 0;  // (1, 3) blocked
    } else {
      pr.key_lengths = {12, 5};
    }
    const Reference64 ref = ReferenceMultiHead64(pr.Params(false));
    ASSERT_TRUE(backend_->MultiHeadAs({pr.Params(false)}, GetParam()).ok());
    const std::vector<float> fast = pr.out;
    ASSERT_TRUE(backend_->MultiHeadAs({pr.Params(true)}, GetParam()).ok());
    EXPECT_TRUE(WithinNaiveBound(fast, pr.out, ref.out));
    EXPECT_LE(MaxAbsDiff(pr.weights, ref.weights), WeightsTolerance(GetParam()));
  }
}

// Project (module sessions' projections, cuda_multi_head.cc): W_qkv and W_o over float32 and
// bfloat16 inputs, staged, multiplied and copied back; the emulator's cuBLASLt computes in
// float64 (emu_blas.cc), so the result is the float64 reference's to float32 rounding here (a
// device's TF32 is checked by tests/gpu/); each item's bits alone and beside another item are
// the same.
TEST_P(BackendEmuTest, ProjectMatchesTheReference) {
  ExpectProjectMatchesReference(*backend_, 64, 4, 37, 1e-6, 9);
}

// Linear attention (linear_attention.cu) through Attend: every feature map, causal with more
// and fewer queries than keys, GQA, key lengths (one of 0: rows of zeros), Dv over one 32-column
// tile and not a multiple of it. Against the float64 reference within the CPU backend's bound,
// and bit for bit the CPU backend's rows: the kernel rounds every product and sum on its own in
// the CPU's order, and takes the same features (kernels/feature_map.h). A linear item beside a
// softmax one and another linear one in the same call has its bits alone.
TEST(LinearAttentionEmuTest, AttendMatchesTheReferenceAndTheCpuBackend) {
  auto gpu = CudaBackend::Create(CudaBackendOptions{});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  struct Case {
    const char* name;
    int batch, hq, hkv, lq, lk, d, dv;
    bool causal;
    FeatureMap map;
    std::vector<int32_t> key_lengths;
  };
  const Case cases[] = {
      {"elu, causal, GQA, lengths", 2, 4, 2, 9, 23, 16, 40, true, FeatureMap::kEluPlusOne, {23, 0}},
      {"elu, full", 1, 2, 2, 7, 5, 24, 8, false, FeatureMap::kEluPlusOne, {}},
      {"relu, causal, more queries than keys", 1, 2, 1, 12, 7, 8, 33, true, FeatureMap::kRelu, {}},
      {"identity, full", 2, 2, 2, 5, 11, 8, 8, false, FeatureMap::kIdentity, {}},
      {"identity, causal, lengths", 2, 1, 1, 6, 6, 4, 64, true, FeatureMap::kIdentity, {3, 6}},
  };
  std::mt19937 rng(31);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr = MakeProblem(rng, c.batch, c.hq, c.hkv, c.lq, c.lk, c.d, c.dv);
    pr.causal = c.causal;
    pr.key_lengths = c.key_lengths;
    AttentionParams p = pr.Params(false);
    p.kind = AttentionKind::kLinear;
    p.feature_map = c.map;
    const Reference64 ref = ReferenceAttention64(p);
    double scale = 1;  // an identity map's small normalisers make large outputs
    for (double x : ref.out) scale = std::max(scale, std::fabs(x));
    // Beside a softmax item and a second linear one.
    Problem other = MakeProblem(rng, 1, 2, 1, 4, 9, 64, 64);
    AttentionParams softmax = other.Params(false);
    Problem second = MakeProblem(rng, 1, 1, 1, 3, 3, 8, 8);
    AttentionParams linear2 = second.Params(false);
    linear2.kind = AttentionKind::kLinear;
    ASSERT_TRUE((*gpu)->Attend({softmax, p, linear2}).ok());
    const std::vector<float> together = pr.out;
    EXPECT_LE(MaxAbsDiff(pr.out, ref.out), 2e-5 * scale);
    const Reference64 softmax_ref = ReferenceAttention64(softmax);
    EXPECT_LE(MaxAbsDiff(other.out, softmax_ref.out), 1e-2) << "the softmax item beside it";
    AttentionParams alone = pr.Params(false);  // the output poisoned again
    alone.kind = AttentionKind::kLinear;
    alone.feature_map = c.map;
    ASSERT_TRUE((*gpu)->Attend({alone}).ok());
    EXPECT_EQ(std::memcmp(together.data(), pr.out.data(), pr.out.size() * sizeof(float)), 0)
        << "batch invariance";
    const std::vector<float> device = pr.out;
    const std::vector<float> cpu = LinearRowsOnHost(alone);
    EXPECT_EQ(std::memcmp(device.data(), cpu.data(), cpu.size() * sizeof(float)), 0)
        << "the CPU backend's bits";
    if (!c.key_lengths.empty() && c.key_lengths[1] == 0) {
      // Item 1 has no key: every row is zero (the normaliser rule).
      const size_t half = device.size() / 2;
      for (size_t n = half; n < device.size(); ++n) ASSERT_EQ(device[n], 0.0f) << n;
    }
  }
}

// MultiHead with linear heads: the projections (the emulator's cuBLASLt, in float64) around the
// linear kernel on the projection buffers' strides, self and cross, against the float64
// reference module.
TEST(LinearAttentionEmuTest, MultiHeadMatchesTheReferenceModule) {
  auto gpu = CudaBackend::Create(CudaBackendOptions{});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937 rng(17);
  for (bool self : {true, false}) {
    SCOPED_TRACE(self ? "self" : "cross");
    const MultiHeadWeights m = RandomModule(rng, 64, 4);
    MultiHeadProblem pr = MakeMultiHeadProblem(rng, m, 2, 7, self ? 7 : 12, self);
    if (!self) pr.key_lengths = {12, 5};
    MultiHeadParams p = pr.Params(false);
    p.causal = self;
    p.kind = AttentionKind::kLinear;
    const Reference64 ref = ReferenceMultiHead64(p);
    ASSERT_TRUE((*gpu)->MultiHead({p}).ok());
    EXPECT_LE(MaxAbsDiff(pr.out, ref.out), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, BackendEmuTest,
                         testing::Values(ComputeType::kFloat16, ComputeType::kBFloat16),
                         [](const testing::TestParamInfo<ComputeType>& info) {
                           return std::string(ComputeTypeName(info.param));
                         });

}  // namespace
}  // namespace attnserve::kernels::cuda
