// Linear attention's feature maps φ (attention_params.h, FeatureMap), one element at a time, for
// the CPU (kernels/linear_state.cc: Attend and decode sessions) and the CUDA kernel
// (kernels/cuda/linear_attention.cu) alike, so that both get the same bits.
//
// elu(x) + 1 is x + 1 for x > 0 and exp(x) below. That exp is FeatureExp, not the C library's:
// std::exp is a scalar call (it was most of a row's cost on the CPU), and the device's expf
// differs from the host's by up to 2 ulp. FeatureExp is Cephes' expf (range reduction by ln 2 in
// two parts, exp(r) = 1 + r + r² P(r) with P of degree 5), written as single roundings (no fused
// multiply-add: Mul and Add are __fmul_rn and __fadd_rn on the device; host callers compile with
// -ffp-contract=off) and branch-free, so the CPU vectorises it and every CPU, ISA and device
// computes the same bits. Its error against exp rounded to float is at most 1 ulp over
// (-inf, 0] (tests/kernels/feature_map_test.cc), subnormal results included (2^n is applied in
// two exact halves, so a subnormal result is rounded once). The softmax kernels' exp
// (kernels/cpu/exp_cephes.h) is the same algorithm with fused multiply-adds on each ISA's
// vectors: faster there, but its bits may differ between instruction sets, which these must not.
#ifndef ATTNSERVE_KERNELS_FEATURE_MAP_H_
#define ATTNSERVE_KERNELS_FEATURE_MAP_H_

#include <cstdint>

#include "kernels/attention_params.h"

#if defined(__CUDACC__)
#define ATTNSERVE_FEATURE_HD __host__ __device__ __forceinline__
#else
#define ATTNSERVE_FEATURE_HD inline
#endif

namespace attnserve::kernels::feature_map {

// Single roundings, and a float's bits: the device's intrinsics, or plain operations on the host
// (whose callers compile with -ffp-contract=off).
#if defined(__CUDA_ARCH__)
ATTNSERVE_FEATURE_HD float Mul(float a, float b) { return __fmul_rn(a, b); }
ATTNSERVE_FEATURE_HD float Add(float a, float b) { return __fadd_rn(a, b); }
ATTNSERVE_FEATURE_HD uint32_t BitsOf(float x) { return __float_as_uint(x); }
ATTNSERVE_FEATURE_HD float FloatOf(uint32_t bits) { return __uint_as_float(bits); }
#else
ATTNSERVE_FEATURE_HD float Mul(float a, float b) { return a * b; }
ATTNSERVE_FEATURE_HD float Add(float a, float b) { return a + b; }
ATTNSERVE_FEATURE_HD uint32_t BitsOf(float x) { return __builtin_bit_cast(uint32_t, x); }
ATTNSERVE_FEATURE_HD float FloatOf(uint32_t bits) { return __builtin_bit_cast(float, bits); }
#endif

// exp(x) for x <= 0 (elu + 1's negative side); any x is safe to pass (branch-free callers
// evaluate it for every element), but only x <= 0 gives exp(x): above 0 it gives 1, NaN gives
// exp(-110) = 0.
ATTNSERVE_FEATURE_HD float FeatureExp(float x) {
  // Below -110, exp(x) < 2^-158 rounds to +0 (the smallest subnormal is 2^-149).
  float xc = x > -110.0f ? x : -110.0f;
  xc = xc < 0.0f ? xc : 0.0f;
  // n = round(x / ln 2) by the 1.5 · 2^23 trick: t's last bits are n, rounded to nearest even;
  // |x / ln 2| < 2^22 here.
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23, bits 0x4B400000
  const float t = Add(Mul(xc, 1.44269504088896341f), kRound);
  const float n = Add(t, -kRound);  // exact: an integer in [-159, 0]
  const int32_t ni = static_cast<int32_t>(BitsOf(t) - 0x4B400000u);
  // r = x - n ln 2, ln 2 in two parts: n · 0.693359375 (9 bits) is exact.
  float r = Add(xc, Mul(n, -0.693359375f));
  r = Add(r, Mul(n, 2.12194440e-4f));
  // exp(r) on |r| <= ln 2 / 2: 1 + r + r² · P(r).
  float p = 1.9875691500e-4f;
  p = Add(Mul(p, r), 1.3981999507e-3f);
  p = Add(Mul(p, r), 8.3334519073e-3f);
  p = Add(Mul(p, r), 4.1665795894e-2f);
  p = Add(Mul(p, r), 1.6666665459e-1f);
  p = Add(Mul(p, r), 5.0000001201e-1f);
  p = Add(Add(Mul(p, Mul(r, r)), r), 1.0f);
  // · 2^n as 2^h · 2^(n-h), h = floor(n / 2): both factors normal, the first product exact.
  const int32_t h = ni >> 1;
  const float lo = FloatOf(static_cast<uint32_t>(h + 127) << 23);
  const float hi = FloatOf(static_cast<uint32_t>(ni - h + 127) << 23);
  return Mul(Mul(p, lo), hi);
}

// elu(x) + 1. NaN stays NaN (x > 0 and x <= 0 both false).
ATTNSERVE_FEATURE_HD float EluPlusOne(float x) {
  const float e = FeatureExp(x);
  return x > 0.0f ? Add(x, 1.0f) : (x <= 0.0f ? e : x);
}

// φ(x) for one element.
ATTNSERVE_FEATURE_HD float Feature(FeatureMap map, float x) {
  switch (map) {
    case FeatureMap::kEluPlusOne:
      return EluPlusOne(x);
    case FeatureMap::kRelu:
      return x > 0.0f ? x : 0.0f;
    case FeatureMap::kIdentity:
      break;
  }
  return x;
}

}  // namespace attnserve::kernels::feature_map

#endif  // ATTNSERVE_KERNELS_FEATURE_MAP_H_
