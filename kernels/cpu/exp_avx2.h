// exp(x) on 8 floats for the AVX2 translation units (through vec_avx2.h: attention_avx2.cc,
// paged_attention_avx2.cc). Internal linkage (static), as exp_avx512.h and for the same reason.
// Include only from a unit compiled with at least -mavx2 -mfma.
#ifndef ATTNSERVE_KERNELS_CPU_EXP_AVX2_H_
#define ATTNSERVE_KERNELS_CPU_EXP_AVX2_H_

#include <immintrin.h>

namespace attnserve::kernels::cpu {

// exp(x) to about 1 ulp, as Exp512 in exp_avx512.h; x < -87 gives exactly 0, NaN gives NaN.
static inline __m256 Exp256(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  // x second: min/max return it when it is NaN, so exp(NaN) = NaN (the NaN rule).
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y =
      _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_EXP_AVX2_H_
