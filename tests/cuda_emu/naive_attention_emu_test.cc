// The plain attention path (naive_attention.cu's NaiveAttentionForward: S = scale Q K^T by
// cuBLAS, the masked softmax kernel, O = P V by cuBLAS) on the host emulation: host_cu.sh
// rewrites the file's launch, the emulator runs the softmax kernel and shim/cublas_v2.h answers
// the GEMMs (emu_blas.cc). Checked against the float64 reference on every option the path
// takes: fp16 and bf16, odd lengths and mixed packs, causal with Lq < Lk and Lq > Lk, key
// lengths, the six mask layouts, GQA, D != Dv (and Dv > 256, the reason the path exists),
// the returned weights, fully blocked rows and the NaN rule (attention_params.h).
//
// Few query rows: the softmax kernel runs one block of 256 emulated threads per (row, head),
// about 100 us of thread start each on the 2 loaded cores here. The per-row logic is the
// same for every row; key counts go past 256 (each thread loops over several keys) where it
// matters (the blocked key ranges).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/flash_fwd.h"
#include "tests/cuda_emu/attention_case.h"

namespace attnserve::kernels::cuda {
namespace {

// P is rounded to the operand type before P V (as on the tensor-core paths): 2^-11 relative in
// fp16, 2^-8 in bf16, on outputs of magnitude <= 1. The weights are fp32 from fp32 scores.
double Tolerance(ComputeType type) { return type == ComputeType::kFloat16 ? 2e-3 : 1.2e-2; }
constexpr double kWeightTolerance = 1e-5;

// NaiveAttentionForward over p's buffers, with its workspace exactly
// NaiveAttentionWorkspaceBytes and NaN-filled (a read before a write, or past it, shows);
// returns the weights (NaN-filled first, exact size) unless `with_weights` is false.
std::vector<float> RunNaive(const FlashFwdParams& p, ComputeType type, bool with_weights) {
  const int* cu_q = p.cu_seqlens_q;  // host arrays: a device pointer is a host one here
  const int* cu_k = p.cu_seqlens_k;
  const size_t ws_bytes = NaiveAttentionWorkspaceBytes(p, cu_q, cu_k);
  std::unique_ptr<unsigned char[]> ws(new unsigned char[ws_bytes]);
  std::memset(ws.get(), 0xff, ws_bytes);
  size_t n_weights = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    n_weights += size_t(p.num_heads) * (cu_q[s + 1] - cu_q[s]) * (cu_k[s + 1] - cu_k[s]);
  }
  std::unique_ptr<float[]> weights(new float[n_weights]);
  std::fill(weights.get(), weights.get() + n_weights, kNaN);
  cublasHandle_t blas = nullptr;
  EXPECT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const GpuStatus st =
      NaiveAttentionForward(p, type, cu_q, cu_k, p.key_lengths,
                            with_weights ? weights.get() : nullptr, ws.get(), blas, nullptr);
  EXPECT_TRUE(st.ok()) << st.error;
  cublasDestroy(blas);
  if (!with_weights) return {};
  return std::vector<float>(weights.get(), weights.get() + n_weights);
}

class NaiveAttentionEmuTest : public testing::TestWithParam<ComputeType> {
 protected:
  ComputeType type() const { return GetParam(); }
  // D != Dv, neither a multiple of 8 (the path takes any head dims).
  static Case Base(const std::string& name) {
    Case c;
    c.name = name;
    c.head_dim = 40;
    c.v_head_dim = 72;
    return c;
  }
  Outcome Run(const Case& c, bool with_weights = true, uint32_t seed = 1) {
    return RunCase(c, type(), seed,
                   [&](const FlashFwdParams& p) { return RunNaive(p, type(), with_weights); });
  }
  Outcome Check(const Case& c, uint32_t seed = 1) {
    const Outcome r = Run(c, true, seed);
    ExpectMatches(c, std::string("naive ") + ComputeTypeName(type()), Tolerance(type()), r);
    ExpectWeightsMatch(c, std::string("naive ") + ComputeTypeName(type()), kWeightTolerance, r);
    return r;
  }
};

// Odd lengths, Lq = 1, and a mixed pack with a 1 x 1 sequence and one with no queries.
TEST_P(NaiveAttentionEmuTest, OddLengthsDecodeAndMixedPacks) {
  Case c = Base("odd");
  c.seqs = {{7, 133}};
  Check(c);
  c = Base("decode");
  c.seqs = {{1, 150}};
  Check(c);
  c = Base("pack");
  c.seqs = {{1, 1}, {6, 70}, {0, 5}, {12, 9}};
  Check(c);
}

// Head dims: D = Dv = 64, and Dv = 264 > 256 (no fused kernel takes it; CudaBackend sends it
// here).
TEST_P(NaiveAttentionEmuTest, HeadDims) {
  Case c = Base("d64");
  c.head_dim = c.v_head_dim = 64;
  c.seqs = {{5, 29}, {3, 8}};
  Check(c);
  c = Base("dv264");
  c.head_dim = 32;
  c.v_head_dim = 264;
  c.seqs = {{4, 21}};
  Check(c);
}

// Causal (bottom-right aligned) with Lq < Lk and Lq > Lk: the first Lq - Lk rows of the
// second sequence have no allowed key and attend uniformly.
TEST_P(NaiveAttentionEmuTest, Causal) {
  Case c = Base("causal");
  c.seqs = {{6, 70}, {12, 5}};
  c.causal = true;
  Check(c);
}

// Key lengths Lk, 0 (every row blocked), 1 and odd, without and with causal.
TEST_P(NaiveAttentionEmuTest, KeyLengths) {
  Case c = Base("key_lengths");
  c.seqs = {{3, 40}, {3, 40}, {3, 40}, {3, 40}};
  c.key_lengths = {40, 0, 1, 23};
  Check(c);
  c.causal = true;
  c.name = "key_lengths_causal";
  Check(c);
}

// The six mask layouts of flash_emu_test (per head with blocked rows, broadcast over heads,
// key padding, broadcast over keys (column stride 0), blocked key ranges, all blocked).
TEST_P(NaiveAttentionEmuTest, MaskLayouts) {
  for (MaskLayout m : kMaskLayouts) {
    Case c = Base("mask" + std::to_string(static_cast<int>(m)));
    c.seqs = m == MaskLayout::kBlockedTiles ? std::vector<Seq>{{4, 301}}
                                            : std::vector<Seq>{{6, 81}, {3, 33}};
    c.mask = m;
    c.causal = m == MaskLayout::kPerHead;
    Check(c);
  }
}

// Grouped-query attention: 4 query heads on 2 and on 1 key/value heads (one strided-batched
// GEMM per key/value head over its group).
TEST_P(NaiveAttentionEmuTest, GroupedQueryAttention) {
  Case c = Base("gqa_4_2");
  c.seqs = {{5, 40}, {3, 11}};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  Check(c);
  c.name = "gqa_4_1";
  c.num_kv_heads = 1;
  c.causal = true;
  Check(c);
}

// Without weights the scores go to the workspace: the same outputs, bit for bit.
TEST_P(NaiveAttentionEmuTest, WithoutWeights) {
  Case c = Base("no_weights");
  c.seqs = {{6, 81}, {0, 4}, {3, 33}};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.mask = MaskLayout::kPerHead;
  const Outcome with = Check(c);
  const Outcome without = Run(c, false);
  ASSERT_EQ(with.out.size(), without.out.size());
  for (size_t e = 0; e < with.out.size(); ++e) {
    ASSERT_EQ(std::memcmp(&with.out[e], &without.out[e], sizeof(float)), 0) << e;
  }
}

// The NaN rule (attention_params.h), each on one head of one sequence, weights included.
TEST_P(NaiveAttentionEmuTest, NaNRule) {
  ExpectNaNRule(
      Base(""), [&](const Case& c) { return Check(c); }, [&](const Case& c) { return Run(c); });
}

INSTANTIATE_TEST_SUITE_P(Types, NaiveAttentionEmuTest,
                         testing::Values(ComputeType::kFloat16, ComputeType::kBFloat16),
                         [](const testing::TestParamInfo<ComputeType>& info) {
                           return std::string(ComputeTypeName(info.param));
                         });

// The cuBLAS shim itself, against products written out by hand: column-major operands,
// transposes, leading dimensions past the rows, batch strides, alpha and beta, and beta = 0
// not reading C (cuBLAS's contract; the naive path writes into NaN-filled memory).
TEST(CublasShimTest, StridedBatchedGemmFollowsCublasConventions) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  // Two batches of A^T (A stored k x m = 3 x 2, lda 4) times B (k x n = 3 x 2, ldb 3).
  auto half = [](float f) { return __float2half_rn(f); };
  std::vector<__half> a(2 * 8), b(2 * 6);
  for (int i = 0; i < 16; ++i) a[i] = half(static_cast<float>(i % 8) - 3);  // A[r, c] = 4c + r - 3
  for (int i = 0; i < 12; ++i) b[i] = half(static_cast<float>(i) * 0.5f);
  std::vector<float> c(2 * 10, kNaN);  // C m x n = 2 x 2, ldc 5, batch stride 10
  const float alpha = 2.0f, beta = 0.0f;
  ASSERT_EQ(
      cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a.data(), CUDA_R_16F,
                                 4, 8, b.data(), CUDA_R_16F, 3, 6, &beta, c.data(), CUDA_R_32F, 5,
                                 10, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_SUCCESS);
  for (int batch = 0; batch < 2; ++batch) {
    for (int j = 0; j < 2; ++j) {
      for (int i = 0; i < 2; ++i) {
        double want = 0;
        for (int l = 0; l < 3; ++l) {
          want += (4.0 * i + l - 3) * ((batch * 6 + j * 3 + l) * 0.5);  // op(A)[i, l] = A[l, i]
        }
        EXPECT_EQ(c[batch * 10 + j * 5 + i], 2 * want) << batch << " " << i << " " << j;
      }
    }
    for (int e = 2; e < 5; ++e) EXPECT_TRUE(std::isnan(c[batch * 10 + e])) << "past m";
  }
  // beta = 1 accumulates; op(B) = B^T (B stored n x k = 2 x 3, ldb 2).
  std::vector<float> c2 = {1, 2, 3, 4};
  const float one = 1.0f;
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_T, 2, 2, 3, &one, a.data(), CUDA_R_16F, 4,
                         b.data(), CUDA_R_16F, 2, &one, c2.data(), CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 2; ++i) {
      double want = 1 + i + 2 * j;
      for (int l = 0; l < 3; ++l) want += (4.0 * i + l - 3) * ((j + 2 * l) * 0.5);
      EXPECT_EQ(c2[i + 2 * j], want) << i << " " << j;
    }
  }
  // The documented argument checks: ldc < max(1, m), lda < max(1, k) with op T.
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, a.data(), CUDA_R_16F, 2,
                         b.data(), CUDA_R_16F, 3, &one, c2.data(), CUDA_R_32F, 1,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, a.data(), CUDA_R_16F, 2,
                         b.data(), CUDA_R_16F, 3, &one, c2.data(), CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
}  // namespace attnserve::kernels::cuda
