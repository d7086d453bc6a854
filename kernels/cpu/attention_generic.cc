// The portable fallback of the fused attention kernel: the same body with one float per
// "vector", compiled without ISA flags (it runs on any CPU; the compiler may still use the
// baseline SSE2 for scalar float arithmetic). Also the kernel the tests use as a
// plain cross-check of the vector paths.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::generic {
namespace {

struct Vec {
  using V = float;
  static constexpr int kWidth = 1;
  static constexpr int kScoreKeys = 4;
  static constexpr int kScoreVecs = 4;
  static constexpr int kPvCols = 4;
  static constexpr int kPvVecs = 4;

  static V Zero() { return 0.0f; }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static void Store(float* p, V v) { *p = v; }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Max(V a, V b) { return a > b ? a : b; }
  // Separate multiply and add (ISO C++ mode does not contract them): one rounding each.
  static V Fmadd(V a, V b, V c) { return a * b + c; }
  static V MaskBeyond(V s, V limit, V pos) { return pos >= limit ? -__builtin_inff() : s; }
  static V ZeroIfNegInf(V x) { return x == -__builtin_inff() ? 0.0f : x; }
  static V Exp(V x) { return std::exp(x); }
  static void HalfToFloat(const uint16_t* src, int n, float* dst) {
    ToFloat32(DType::kFloat16, src, n, dst);
  }
};

}  // namespace
}  // namespace attnserve::kernels::cpu::generic

#define ATTNSERVE_CPU_ISA_NAMESPACE generic
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kGenericAttentionKernel = {Isa::kGeneric, "generic",
                                                        &generic::ScratchFloats, &generic::Run};
}  // namespace attnserve::kernels::cpu
