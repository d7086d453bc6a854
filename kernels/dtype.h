// Element types on the wire and their conversions to and from float32, the type every kernel
// computes in on the CPU. FLOAT16 and BFLOAT16 are converted at the edges of a request.
#ifndef ATTNSERVE_KERNELS_DTYPE_H_
#define ATTNSERVE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"
#include "base/float16.h"

namespace attnserve::kernels {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kBool };

// Bytes per element: 4, 2, 2, 1.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType t);

// The scalar float16/bfloat16 codec lives in base/float16.h (shared with the safetensors reader
// and the client); kernels code calls it as kernels::HalfToFloat etc. as well.
using ::attnserve::BFloat16ToFloat;
using ::attnserve::FloatToBFloat16;
using ::attnserve::FloatToHalf;
using ::attnserve::HalfToFloat;

// Converts n packed little-endian elements of `type` (FLOAT32, FLOAT16 or BFLOAT16) at `src` to
// float32, and back. `src`/`dst` need no alignment.
void ToFloat32(DType type, const void* src, size_t n, float* dst);
void FromFloat32(DType type, const float* src, size_t n, void* dst);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_DTYPE_H_
