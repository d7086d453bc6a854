// Compile-time shapes of the fused forward kernel (FlashAttention's kernel_traits.h pattern):
// derived from a few integers and checked by static_assert. CUDA only.
//
// Each warp owns 16 query rows (one m16n8k16 row tile), so a block of kNWarps warps covers
// kBlockM = 16 * kNWarps rows; its Q fragments stay in registers for the whole key loop. K and
// V tiles of kBlockN keys stream through shared memory (cp.async), one buffer each: V[n] is
// fetched while Q.K[n]^T runs and K[n+1] while P.V[n] runs (FlashAttention-2's schedule).
//
// Tuning status: these block shapes are FlashAttention-2's sm80 choices adapted to one m16
// tile per warp; they are NOT yet measured on an H100/H200 (no GPU was available when they were
// written). tests/gpu/run_h200.sh measures them; record the outcome here.
#ifndef ATTNSERVE_KERNELS_CUDA_KERNEL_TRAITS_H_
#define ATTNSERVE_KERNELS_CUDA_KERNEL_TRAITS_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/flash_params.h"

namespace attnserve::kernels::cuda {

template <ComputeType kType>
struct ElementOf;
template <>
struct ElementOf<ComputeType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<ComputeType::kBFloat16> {
  using type = __nv_bfloat16;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, ComputeType kType_>
struct FlashFwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr ComputeType kType = kType_;
  using Element = typename ElementOf<kType>::type;

  // 16-byte chunks (8 elements) per shared-memory row; chunks are XOR-swizzled with (row % 8)
  // so that the 8 row addresses of one ldmatrix phase hit 8 different bank groups.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kSmemQElems = kBlockM * kHeadDim;
  static constexpr int kSmemKElems = kBlockN * kHeadDim;
  static constexpr int kSmemVElems = kBlockN * kHeadDim;
  static constexpr int kSmemMaskBytes = kBlockM * kBlockN;  // the mask tile, one byte a score
  static constexpr int kSmemBytes =
      (kSmemQElems + kSmemKElems + kSmemVElems) * static_cast<int>(sizeof(Element)) +
      kSmemMaskBytes;

  // Per-thread register tiles (m16n8 accumulators of 4 floats).
  static constexpr int kSTiles = kBlockN / 8;    // score tiles per warp row
  static constexpr int kOTiles = kHeadDim / 8;   // output tiles per warp row
  static constexpr int kQSteps = kHeadDim / 16;  // k16 steps of Q.K^T

  static_assert(kBlockM == 16 * kNWarps, "one m16 row tile per warp");
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 64 && kHeadDim <= 256,
                "head_dim must be a multiple of 16 in [64, 256] (>= 8 chunks for the swizzle)");
  static_assert(kBlockN % 16 == 0, "key tile must be a multiple of 16 (k16 steps of P.V)");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q tile must split evenly");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tiles must split evenly");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the sm_90 per-block limit");
  static_assert(sizeof(Element) == 2, "16-bit tensor-core operands");
};

// The specialised instances (one .cu file each, see flash_fwd_hdim*.cu).
// hdim 64: kBlockN 128 halves the number of key-loop iterations (and barriers) for the small
// tiles; registers: 64 (S) + 32 (O) + 16 (Q) floats per thread; 48 KiB of shared memory.
template <ComputeType kType>
using FlashFwdTraitsHdim64 = FlashFwdTraits<64, 64, 128, 4, kType>;
// hdim 128: 64 (O) + 32 (S) + 32 (Q) registers of tiles per thread; 52 KiB of shared memory.
template <ComputeType kType>
using FlashFwdTraitsHdim128 = FlashFwdTraits<128, 64, 64, 4, kType>;

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_KERNEL_TRAITS_H_
