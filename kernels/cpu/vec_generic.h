// The portable "vector" operations (one float per vector) the fused attention body and the
// paged attention body are written in, for the generic kernels (attention_generic.cc,
// paged_attention_generic.cc): one definition of each, as vec_avx2.h and vec_avx512.h are for
// their ISAs. Separate multiply and add in Fmadd (ISO C++ mode does not contract them): one
// rounding each.
#ifndef ATTNSERVE_KERNELS_CPU_VEC_GENERIC_H_
#define ATTNSERVE_KERNELS_CPU_VEC_GENERIC_H_

#include <cmath>
#include <cstdint>

#include "kernels/dtype.h"

namespace attnserve::kernels::cpu {
namespace {

struct GenericOps {
  using V = float;
  static constexpr int kWidth = 1;

  // IEEE binary16 to float32 (exact), written out here rather than called per element.
  static float Half(uint16_t h) {
    const uint32_t sign = uint32_t{h & 0x8000u} << 16;
    const uint32_t exp = h >> 10 & 0x1f;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return __builtin_bit_cast(float, sign | 0x7f800000u | man << 13);
    if (exp != 0) return __builtin_bit_cast(float, sign | (exp + 112) << 23 | man << 13);
    const float sub = static_cast<float>(man) * 0x1p-24f;  // subnormal or zero: exact
    return sign != 0 ? -sub : sub;
  }

  static V Zero() { return 0.0f; }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static void Store(float* p, V v) { *p = v; }
  static V LoadN(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static void StoreN(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  static V LoadF16(const uint16_t* p) { return Half(*p); }
  static V LoadF16N(const uint16_t* p, int n) { return n > 0 ? Half(*p) : 0.0f; }
  static V LoadBf16(const uint16_t* p) { return __builtin_bit_cast(float, uint32_t{*p} << 16); }
  static V LoadBf16N(const uint16_t* p, int n) { return n > 0 ? LoadBf16(p) : 0.0f; }
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    ToFloat32(DType::kFloat16, src, n, dst);
  }

  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  // NaN in b wins, as the vector max instructions' second operand does.
  static V Max(V a, V b) { return a > b ? a : b; }
  static V Fmadd(V a, V b, V c) { return a * b + c; }
  static V Exp(V x) { return std::exp(x); }
  static V MaskBeyond(V s, V limit, V pos) { return pos >= limit ? -__builtin_inff() : s; }
  static V ZeroIfNegInf(V x) { return x == -__builtin_inff() ? 0.0f : x; }

  static float ReduceAdd(V v) { return v; }
  static void Reduce4(V a, V b, V c, V d, float* out) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
  static float ReduceMax(V v) { return v; }
};

}  // namespace
}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_VEC_GENERIC_H_
