// The paged attention kernel for AVX-512 (F, DQ, BW, VL; FMA; F16C for FLOAT16 caches, through
// VCVTPH2PS). Compiled with per-file flags (kernels/cpu/CMakeLists.txt); reached only through
// kAvx512PagedAttentionKernel after the run-time check in cpu_features.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own intrinsics (see avx512.cc)

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/exp_avx512.h"
#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx512p {
namespace {

struct PVec {
  using V = __m512;
  static constexpr int kWidth = 16;
  // Scores: 8 accumulators + the key vector + query loads. P·V: 4 row-heads x 4 vectors = 16
  // accumulators + 4 value vectors + 1 broadcast of the 32 zmm registers.
  static constexpr int kScoreRows = 8;
  static constexpr int kPvRows = 4;
  static constexpr int kPvVecs = 4;

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
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Exp(V x) { return Exp512(x); }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
};

}  // namespace
}  // namespace attnserve::kernels::cpu::avx512p

#define ATTNSERVE_CPU_ISA_NAMESPACE avx512p
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kAvx512PagedAttentionKernel = {Isa::kAvx512,
                                                                 "avx512",
                                                                 &avx512p::paged::ScratchFloats,
                                                                 &avx512p::paged::PartialFloats,
                                                                 &avx512p::paged::Run,
                                                                 &avx512p::paged::Combine};
}  // namespace attnserve::kernels::cpu
