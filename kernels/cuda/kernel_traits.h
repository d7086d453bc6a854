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

// kHeadDim is the padded width of q, k, v and o in shared memory and registers: the runtime
// head_dim and v_head_dim are multiples of 8 at most kHeadDim, and the columns past them are
// zero-filled when loading (zero columns of q and k leave q.k unchanged; zero columns of v make
// output columns that are never stored). One width for both: a separate v width would square the
// number of instantiations for the rare D != Dv.
// kMods_: the kernel takes ScoreMods (flash_fwd_kernel.h); its shapes are chosen for it below.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, ComputeType kType_,
          bool kQInRegs_ = (kHeadDim_ <= 128), bool kMods_ = false>
struct FlashFwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr ComputeType kType = kType_;
  static constexpr bool kMods = kMods_;
  using Element = typename ElementOf<kType>::type;

  // 16-byte chunks (8 elements) per shared-memory row. Chunks are XOR-swizzled so that the 8
  // row addresses of one ldmatrix phase hit 8 different bank groups: within groups of 8 chunks
  // by (row % 8) when rows are a multiple of 128 bytes; else (rows of 64 + 128 k bytes: head
  // dims 32, 96, 160, 224) within groups of 4 chunks by (row / 2) % 4, odd rows starting half a
  // bank line later (flash_fwd_kernel.h: SwizzledOffset).
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kSwizzleChunks = kHeadDim % 64 == 0 ? 8 : 4;
  static constexpr int kSmemQElems = kBlockM * kHeadDim;
  static constexpr int kSmemKElems = kBlockN * kHeadDim;
  static constexpr int kSmemVElems = kBlockN * kHeadDim;
  // The mask tile, one byte a score, copied in 4-byte words (cp.async takes 4 bytes at least):
  // a mask row starts at any byte offset o (0-3) within its first word, so a tile row holds
  // kBlockN + o bytes of kBlockN / 4 + 1 words, its scores at bytes [o, o + kBlockN)
  // (flash_fwd_kernel.h: LoadMaskTileAsync). A warp reads the tile at rows lane / 4 (8 rows), up
  // to 3 consecutive words of each (4 lanes x 2 bytes from byte o + 8t); rows kMaskWords words
  // apart with kMaskWords % 8 == 4 start the 8 rows at 8 different multiples of 4 words modulo
  // the 32 banks, so their word triples never share a bank (no conflict for any offsets). The
  // smallest such row at least kBlockN / 4 + 1 words long.
  static constexpr int kMaskWords = (kBlockN / 4 + 4) / 8 * 8 + 4;
  static constexpr int kMaskStride = 4 * kMaskWords;  // bytes
  static constexpr int kSmemMaskBytes = kBlockM * kMaskStride;
  static constexpr int kSmemBytes =
      (kSmemQElems + kSmemKElems + kSmemVElems) * static_cast<int>(sizeof(Element)) +
      kSmemMaskBytes;

  // Per-thread register tiles (m16n8 accumulators of 4 floats).
  static constexpr int kSTiles = kBlockN / 8;    // score tiles per warp row
  static constexpr int kOTiles = kHeadDim / 8;   // output tiles per warp row
  static constexpr int kQSteps = kHeadDim / 16;  // k16 steps of Q.K^T
  // Q's A-fragments (kQSteps x 4 registers) stay in registers for the whole key loop up to head
  // dim 128; above, they are re-read from shared memory (Q is never overwritten there) at each
  // k16 step, which keeps O (kOTiles x 4) + S (kSTiles x 4) within 255 registers without
  // spilling (ptxas fails the build on any: kernels/cuda/CMakeLists.txt).
  static constexpr bool kQInRegs = kQInRegs_;

  static_assert(kBlockM == 16 * kNWarps, "one m16 row tile per warp");
  static_assert(kHeadDim % 32 == 0 && kHeadDim >= 32 && kHeadDim <= 256,
                "head_dim must be a multiple of 32 in [32, 256] (k16 steps, 4-chunk swizzle)");
  static_assert(kBlockN % 16 == 0, "key tile must be a multiple of 16 (k16 steps of P.V)");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q tile must split evenly");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tiles must split evenly");
  static_assert(kMaskWords % 8 == 4 && kMaskWords >= kBlockN / 4 + 1, "mask tile row stride");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the sm_90 per-block limit");
  static_assert(sizeof(Element) == 2, "16-bit tensor-core operands");
};

// The instantiations (kTensorCoreHeadDims, flash_params.h), one .cu file per dim and type
// (flash_fwd_hdim*.cu). The block shapes: 4 warps, 64 query rows; kBlockN as large as compiles
// without spilling at 255 registers (ptxas -v, sm_80 and sm_90; the build fails on a spill):
// 128 up to hdim 64 (fewer key-loop iterations and barriers for small tiles), 64 for 96 and
// 128, 32 for 160, 16 for 192 and 256 (32 spilled 16-60 bytes; 224 spilled at 32 and cannot
// split 16-key tiles over 128 threads, so it has no instantiation). Registers of tiles per
// thread: hdim 64: 64 (S) + 32 (O) + 16 (Q); hdim 128: 32 + 64 + 32; hdim 256: 8 + 128, Q from
// shared memory. Shared memory: 20 KiB (hdim 32) to 52 KiB (hdim 128). Not yet measured on a
// GPU: the small kBlockN of 192/256 costs a barrier per 16 keys.
// The kMods instantiations (windows, soft-capping, ALiBi; flash_fwd_kernel.h) need a few more
// live values: at hdim 64 they take 64-key blocks, and at hdim 96 Q from shared memory (with
// the plain shapes, ptxas spilled 16 and 24 bytes there); the other dims keep the plain shapes.
constexpr int FlashBlockN(int head_dim, bool mods) {
  if (head_dim <= 32) return 128;
  if (head_dim <= 64) return mods ? 64 : 128;
  if (head_dim <= 128) return 64;
  return head_dim <= 160 ? 32 : 16;
}
constexpr bool FlashQInRegs(int head_dim, bool mods) {
  return mods ? head_dim != 96 && head_dim <= 128 : head_dim <= 128;
}
template <int kHeadDim, ComputeType kType, bool kMods = false>
using FlashFwdTraitsHdim = FlashFwdTraits<kHeadDim, 64, FlashBlockN(kHeadDim, kMods), 4, kType,
                                          FlashQInRegs(kHeadDim, kMods), kMods>;

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_KERNEL_TRAITS_H_
