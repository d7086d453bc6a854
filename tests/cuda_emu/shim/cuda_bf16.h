// Shim of CUDA's cuda_bf16.h for the host emulation (tests/cuda_emu/README.md): __nv_bfloat16
// and the conversions the kernels use, round to nearest even, NaN kept NaN.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_BF16_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_BF16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tests/cuda_emu/emu.h"

struct __nv_bfloat16 {
  uint16_t x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (overflow rounds to infinity)
  return {static_cast<uint16_t>(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_BF16_H_
