// Shim of CUDA's cuda_fp16.h for the host emulation (tests/cuda_emu/README.md): __half and the
// conversions the kernels use, round to nearest even (GCC's _Float16 arithmetic conversions).
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

#include "tests/cuda_emu/emu.h"

struct __half {
  uint16_t x;
};
struct __half2 {
  __half x, y;
};

inline __half __float2half_rn(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  __half r;
  std::memcpy(&r.x, &h, 2);
  return r;
}
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.x, 2);
  return static_cast<float>(v);
}
inline __half2 __floats2half2_rn(float lo, float hi) {
  return {__float2half_rn(lo), __float2half_rn(hi)};
}

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_
