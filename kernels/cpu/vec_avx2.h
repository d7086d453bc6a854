// The AVX2 + FMA + F16C vector operations the fused attention body (attention_kernel_impl.h) and
// the paged attention body (paged_attention_impl.h) are written in: one definition of each, the
// kernels' traits (attention_avx2.cc, paged_attention_avx2.cc) add their tile shapes to it.
// Internal linkage (an unnamed namespace), as exp_cephes.h and for the same reason; include only
// from a unit compiled with at least those flags.
#ifndef ATTNSERVE_KERNELS_CPU_VEC_AVX2_H_
#define ATTNSERVE_KERNELS_CPU_VEC_AVX2_H_

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/exp_cephes.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu {
namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr int kWidth = 8;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // Partial vectors through a small buffer (AVX2 has no masked 16-bit loads); only the last
  // vector of a row takes this path.
  static V LoadN(const float* p, int n) {
    alignas(32) float buf[8] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return _mm256_load_ps(buf);
  }
  static void StoreN(float* p, V v, int n) {
    alignas(32) float buf[8];
    _mm256_store_ps(buf, v);
    for (int i = 0; i < n; ++i) p[i] = buf[i];
  }
  static V LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V LoadF16N(const uint16_t* p, int n) {
    alignas(16) uint16_t buf[8] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
  }
  static V LoadBf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static V LoadBf16N(const uint16_t* p, int n) {
    alignas(16) uint16_t buf[8] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return LoadBf16(buf);
  }
  // n FLOAT16 values to float32, whole vectors by VCVTPH2PS, the tail out of line.
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    int x = 0;
    for (; x + 8 <= n; x += 8) {
      _mm256_storeu_ps(dst + x,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x))));
    }
    if (x < n) ToFloat32(DType::kFloat16, src + x, n - x, dst + x);
  }

  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V RoundNearest(V x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V ScalePow2(V y, V n) {
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  static V ZeroBelow(V v, V x, V bound) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, bound, _CMP_LT_OQ), v);
  }
  static V Exp(V x) { return CephesExp<Avx2Ops>(x); }  // exp_cephes.h
  // -inf in the lanes where pos >= limit.
  static V MaskBeyond(V s, V limit, V pos) {
    return _mm256_blendv_ps(s, _mm256_set1_ps(-__builtin_inff()),
                            _mm256_cmp_ps(pos, limit, _CMP_GE_OQ));
  }
  static V ZeroIfNegInf(V x) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ), x);
  }

  static float ReduceAdd(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static void Reduce4(V a, V b, V c, V d, float* out) {
    out[0] = ReduceAdd(a);
    out[1] = ReduceAdd(b);
    out[2] = ReduceAdd(c);
    out[3] = ReduceAdd(d);
  }
  static float ReduceMax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
};

}  // namespace
}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_VEC_AVX2_H_
