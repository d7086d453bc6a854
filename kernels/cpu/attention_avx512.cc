// The fused attention kernel for AVX-512 (F, DQ; FMA). Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx512AttentionKernel after the run-time
// check in cpu_features.h.
// GCC 12 warns that the _mm512_undefined_* placeholders inside its own intrinsics "may be used
// uninitialized" (a false positive of its headers).
#if !defined(__clang__)  // clang has no such warning (and warns about the unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/exp_avx512.h"
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
  static V Exp(V x) { return Exp512(x); }  // exp_avx512.h
};

}  // namespace
}  // namespace attnserve::kernels::cpu::avx512

#define ATTNSERVE_CPU_ISA_NAMESPACE avx512
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kAvx512AttentionKernel = {Isa::kAvx512, "avx512",
                                                       &avx512::ScratchFloats, &avx512::Run};
}  // namespace attnserve::kernels::cpu
