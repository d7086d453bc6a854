// The fused attention kernel for AVX-512 (F, DQ; FMA). Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx512AttentionKernel after the run-time
// check in cpu_features.h.
// GCC 12 warns that the _mm512_undefined_* placeholders inside its own intrinsics "may be used
// uninitialized" (a false positive of its headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx512 {
namespace {

struct Vec {
  using V = __m512;
  static constexpr int kWidth = 16;
  // 6 keys x 4 vectors (64 query rows) = 24 accumulators + 4 query loads + 1 broadcast of the
  // 32 zmm registers.
  static constexpr int kScoreKeys = 6;
  static constexpr int kScoreVecs = 4;
  static constexpr int kPvCols = 6;
  static constexpr int kPvVecs = 4;

  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V MaskBeyond(V s, V limit, V pos) {
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(pos, limit, _CMP_GE_OQ),
                              _mm512_set1_ps(-__builtin_inff()));
  }
  static V ZeroIfNegInf(V x) {
    return _mm512_mask_mov_ps(x,
                              _mm512_cmp_ps_mask(x, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ),
                              _mm512_setzero_ps());
  }
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    int x = 0;
    for (; x + 16 <= n; x += 16) {
      _mm512_storeu_ps(
          dst + x, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + x))));
    }
    if (x < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - x)) - 1);
      _mm512_mask_storeu_ps(dst + x, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + x)));
    }
  }
  // exp(x) to about 1 ulp (Cephes expf: range reduction by ln 2 in two parts, degree-5
  // polynomial, 2^n built in the exponent bits); x < -87 (exp(-inf) included) gives exactly 0.
  static V Exp(V x) {
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V poly = _mm512_set1_ps(1.9875691500e-4f);
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
    const V y = _mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow),
                               _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
  }
};

}  // namespace
}  // namespace attnserve::kernels::cpu::avx512

#define ATTNSERVE_CPU_ISA_NAMESPACE avx512
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kAvx512AttentionKernel = {Isa::kAvx512, "avx512",
                                                       &avx512::ScratchFloats, &avx512::Run};
}  // namespace attnserve::kernels::cpu
