// The paged attention kernel for AVX2 + FMA + F16C. Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx2PagedAttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx2p {
namespace {

struct PVec {
  using V = __m256;
  static constexpr int kWidth = 8;
  // P·V: 4 row-heads x 2 vectors = 8 accumulators + 2 value vectors + 1 broadcast of 16 ymm.
  static constexpr int kScoreRows = 4;
  static constexpr int kPvRows = 4;
  static constexpr bool kBf16Dot = false;  // no bfloat16 dot product
  static constexpr int kPvVecs = 2;

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
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Exp(V x) { return Exp256(x); }
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
}  // namespace attnserve::kernels::cpu::avx2p

#define ATTNSERVE_CPU_ISA_NAMESPACE avx2p
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kAvx2PagedAttentionKernel = {Isa::kAvx2,
                                                               "avx2",
                                                               &avx2p::paged::ScratchFloats,
                                                               &avx2p::paged::PartialFloats,
                                                               &avx2p::paged::Run,
                                                               &avx2p::paged::Combine};
}  // namespace attnserve::kernels::cpu
