// Shapes of the decode-shaped path (flash_decode_kernel.h), shared by its launch code, the
// dispatch (plain C++) and the host emulation tests. No CUDA headers.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_SHAPE_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_SHAPE_H_

#include <cstdint>

#include "kernels/cuda/online_softmax.h"  // ATTNSERVE_HD

namespace attnserve::kernels::cuda {

inline constexpr int kDecodeSplitKeys = 256;  // keys per split: a constant (flash_decode_kernel.h)
inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeOutPerLane = 4;  // v_head_dim <= 128
inline constexpr int kDecodeMaxVHeadDim = 32 * kDecodeOutPerLane;

// Splits of a sequence whose rows may attend to `limit` keys (KeyLimit).
ATTNSERVE_HD int DecodeSplits(int limit) {
  return (limit + kDecodeSplitKeys - 1) / kDecodeSplitKeys;
}

// Floats of one (sequence, kv head, split) slot of the workspace: per row, max, sum, acc[Dv].
ATTNSERVE_HD int64_t DecodeSlotFloats(int group, int v_head_dim) {
  return int64_t{group} * (2 + v_head_dim);
}

// Shared memory of the split kernel: the group's scaled queries and the warps' states.
inline int DecodeSplitSmemBytes(int group, int head_dim, int v_head_dim) {
  return static_cast<int>(sizeof(float)) *
         (group * head_dim + kDecodeWarps * static_cast<int>(DecodeSlotFloats(group, v_head_dim)));
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_SHAPE_H_
