// The portable paged attention kernel: the same body with one float per "vector", compiled
// without ISA flags (it runs on any CPU). Also the plain cross-check of the vector paths.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::genericp {
namespace {

// IEEE binary16 to float32 (exact), written out here rather than called per element.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = h >> 10 & 0x1f;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return __builtin_bit_cast(float, sign | 0x7f800000u | man << 13);
  if (exp != 0) return __builtin_bit_cast(float, sign | (exp + 112) << 23 | man << 13);
  const float sub = static_cast<float>(man) * 0x1p-24f;  // subnormal or zero: exact
  return sign != 0 ? -sub : sub;
}

struct PVec {
  using V = float;
  static constexpr int kWidth = 1;
  static constexpr int kScoreRows = 4;
  static constexpr int kPvRows = 4;
  static constexpr bool kBf16Dot = false;  // no bfloat16 dot product
  static constexpr int kPvVecs = 4;

  static V Zero() { return 0.0f; }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static V LoadN(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static void Store(float* p, V v) { *p = v; }
  static void StoreN(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  static V LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static V LoadF16N(const uint16_t* p, int n) { return n > 0 ? HalfToFloat(*p) : 0.0f; }
  static V LoadBf16(const uint16_t* p) { return __builtin_bit_cast(float, uint32_t{*p} << 16); }
  static V LoadBf16N(const uint16_t* p, int n) { return n > 0 ? LoadBf16(p) : 0.0f; }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  // NaN in b wins, as the vector max instructions' second operand does.
  static V Max(V a, V b) { return a > b ? a : b; }
  // Separate multiply and add (ISO C++ mode does not contract them): one rounding each.
  static V Fmadd(V a, V b, V c) { return a * b + c; }
  static V Exp(V x) { return std::exp(x); }
  static float ReduceAdd(V v) { return v; }
  static void Reduce4(V a, V b, V c, V d, float* out) {
    out[0] = ReduceAdd(a);
    out[1] = ReduceAdd(b);
    out[2] = ReduceAdd(c);
    out[3] = ReduceAdd(d);
  }
  static float ReduceMax(V v) { return v; }
};

}  // namespace
}  // namespace attnserve::kernels::cpu::genericp

#define ATTNSERVE_CPU_ISA_NAMESPACE genericp
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kGenericPagedAttentionKernel = {Isa::kGeneric,
                                                                  "generic",
                                                                  &genericp::paged::ScratchFloats,
                                                                  &genericp::paged::PartialFloats,
                                                                  &genericp::paged::Run,
                                                                  &genericp::paged::Combine};
}  // namespace attnserve::kernels::cpu
