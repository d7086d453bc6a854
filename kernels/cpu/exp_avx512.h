// exp(x) on 16 floats for the AVX-512 translation units (attention_avx512.cc,
// attention_bf16.cc). Internal linkage (static), so each unit compiled with its own flags keeps its
// own copy and no out-of-line copy is shared between units built with different instruction sets.
// Include only from a unit compiled with at least -mavx512f -mavx512dq.
#ifndef ATTNSERVE_KERNELS_CPU_EXP_AVX512_H_
#define ATTNSERVE_KERNELS_CPU_EXP_AVX512_H_

#include <immintrin.h>

namespace attnserve::kernels::cpu {

// exp(x) to about 1 ulp (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial,
// 2^n built in the exponent bits); x < -87 (exp(-inf) included) gives exactly 0, NaN gives NaN.
static inline __m512 Exp512(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  // Clamp with x as the second operand: min/max return it when it is NaN, so NaN propagates
  // (the NaN rule of attention_params.h needs exp(NaN) = NaN).
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 poly = _mm512_set1_ps(1.9875691500e-4f);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y =
      _mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow),
                             _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_EXP_AVX512_H_
