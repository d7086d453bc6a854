// The AVX-512 (F, DQ, BW, VL; FMA; FLOAT16 widened by VCVTPH2PS) vector operations the fused
// attention body (attention_kernel_impl.h) and the paged attention body (paged_attention_impl.h)
// are written in: one definition of each, the kernels' traits (attention_avx512.cc,
// paged_attention_avx512.cc, paged_attention_avx512bf16.cc) add their tile shapes to it.
// Internal linkage (an unnamed namespace), as exp_cephes.h and for the same reason; include only
// from a unit compiled with at least those flags.
#ifndef ATTNSERVE_KERNELS_CPU_VEC_AVX512_H_
#define ATTNSERVE_KERNELS_CPU_VEC_AVX512_H_

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/exp_cephes.h"

namespace attnserve::kernels::cpu {
namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr int kWidth = 16;

  static __mmask16 Lanes(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V LoadN(const float* p, int n) { return _mm512_maskz_loadu_ps(Lanes(n), p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, V v, int n) { _mm512_mask_storeu_ps(p, Lanes(n), v); }
  static V LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V LoadF16N(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Lanes(n), p));
  }
  static V LoadBf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static V LoadBf16N(const uint16_t* p, int n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(Lanes(n), p)), 16));
  }
  // n FLOAT16 values to float32 by VCVTPH2PS, the tail masked.
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    int x = 0;
    for (; x + 16 <= n; x += 16) {
      _mm512_storeu_ps(
          dst + x, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + x))));
    }
    if (x < n) {
      _mm512_mask_storeu_ps(dst + x, Lanes(n - x),
                            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Lanes(n - x), src + x)));
    }
  }

  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V RoundNearest(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V ScalePow2(V y, V n) {
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
  }
  static V ZeroBelow(V v, V x, V bound) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x, bound, _CMP_LT_OQ)),
                               v);
  }
  static V Exp(V x) { return CephesExp<Avx512Ops>(x); }  // exp_cephes.h
  // -inf in the lanes where pos >= limit.
  static V MaskBeyond(V s, V limit, V pos) {
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(pos, limit, _CMP_GE_OQ),
                              _mm512_set1_ps(-__builtin_inff()));
  }
  static V ZeroIfNegInf(V x) {
    return _mm512_mask_mov_ps(x,
                              _mm512_cmp_ps_mask(x, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ),
                              _mm512_setzero_ps());
  }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  // Four reductions for about the price of one: lane l + l+8, + l+4, then within 128 bits.
  static void Reduce4(V a, V b, V c, V d, float* out) {
    const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    V x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
    const V lanes = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), x);
    _mm_storeu_ps(out, _mm512_castps512_ps128(lanes));
  }
};

}  // namespace
}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_VEC_AVX512_H_
