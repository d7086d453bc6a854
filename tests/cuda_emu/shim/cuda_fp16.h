// Shim of CUDA's cuda_fp16.h for the host emulation (tests/cuda_emu/README.md): __half and the
// conversions the kernels use, round to nearest even (the compiler's own half conversions).
#ifndef ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_
#define ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

#include "tests/cuda_emu/emu.h"

struct __half {
  uint16_t x;
};

namespace emu {
// The compiler's IEEE half, converted to and from float by round to nearest even: _Float16 where
// the compiler has it (GCC; clang from 15 on x86), else clang's storage-only __fp16, which converts
// the same way (F16C, or compiler-rt's __truncsfhf2) but may only be a local variable.
#if defined(__FLT16_MAX__) || !defined(__clang__)
using HostHalf = _Float16;
#else
using HostHalf = __fp16;
#endif
}  // namespace emu
struct __half2 {
  __half x, y;
};

inline __half __float2half_rn(float f) {
  const emu::HostHalf h = static_cast<emu::HostHalf>(f);
  __half r;
  std::memcpy(&r.x, &h, 2);
  return r;
}
inline float __half2float(__half h) {
  emu::HostHalf v;
  std::memcpy(&v, &h.x, 2);
  return static_cast<float>(v);
}
inline __half2 __floats2half2_rn(float lo, float hi) {
  return {__float2half_rn(lo), __float2half_rn(hi)};
}

#endif  // ATTNSERVE_TESTS_CUDA_EMU_SHIM_CUDA_FP16_H_
