// The fused attention kernel for AVX2 + FMA (+ F16C for FLOAT16 inputs). Compiled with per-file
// flags (kernels/cpu/CMakeLists.txt); reached only through kAvx2AttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx2 {
namespace {

struct Vec {
  using V = __m256;
  static constexpr int kWidth = 8;
  // 6 keys x 2 vectors = 12 accumulators + 2 query loads + 1 broadcast of the 16 ymm registers.
  static constexpr int kScoreKeys = 6;
  static constexpr int kScoreVecs = 2;
  static constexpr int kPvCols = 6;
  static constexpr int kPvVecs = 2;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V MaskBeyond(V s, V limit, V pos) {
    return _mm256_blendv_ps(s, _mm256_set1_ps(-__builtin_inff()),
                            _mm256_cmp_ps(pos, limit, _CMP_GE_OQ));
  }
  static V ZeroIfNegInf(V x) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ), x);
  }
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    int x = 0;
    for (; x + 8 <= n; x += 8) {
      _mm256_storeu_ps(dst + x,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x))));
    }
    if (x < n) ToFloat32(DType::kFloat16, src + x, n - x, dst + x);  // out of line, generic code
  }
  static V Exp(V x) { return Exp256(x); }  // exp_avx2.h
};

}  // namespace
}  // namespace attnserve::kernels::cpu::avx2

#define ATTNSERVE_CPU_ISA_NAMESPACE avx2
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kAvx2AttentionKernel = {Isa::kAvx2, "avx2", &avx2::ScratchFloats,
                                                     &avx2::Run};
}  // namespace attnserve::kernels::cpu
