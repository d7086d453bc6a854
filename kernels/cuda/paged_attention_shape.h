// Shapes of the paged attention kernels (paged_attention_kernel.h), shared by their launch code
// (paged_attention.cu), the backend (plain C++) and the host emulation tests. No CUDA headers.
#ifndef ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_SHAPE_H_
#define ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_SHAPE_H_

#include <cstdint>

#include "kernels/cuda/online_softmax.h"  // ATTNSERVE_HD
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels::cuda {

inline constexpr int kPagedWarps = 4;
// Query rows per block: (token, head of the GQA group) pairs of one sequence and one kv head,
// row r = token * group + head_in_group. A key and value row read once serves all of them.
inline constexpr int kPagedRows = 8;
inline constexpr int kPagedMaxHeadDim = 256;
inline constexpr int kPagedMaxVHeadDim = 256;  // 8 output columns per lane

// Splits of `keys` keys (a row with `keys` allowed keys, or a block whose last row has them):
// fixed chunks of kPagedSplitKeys (paged_attention_params.h's batch invariance).
ATTNSERVE_HD int PagedSplits(int keys) { return (keys + kPagedSplitKeys - 1) / kPagedSplitKeys; }

// Blocks of kPagedRows rows of a sequence with `q_len` query tokens, per kv head.
ATTNSERVE_HD int PagedRowBlocks(int q_len, int group) {
  return (q_len * group + kPagedRows - 1) / kPagedRows;
}

// Floats of one (query row, split) slot of the workspace: max (log2 units), sum, acc[Dv].
ATTNSERVE_HD int PagedSlotFloats(int v_head_dim) { return 2 + v_head_dim; }

// The workspace: a slot per (packed query token, query head, split < max_splits), where
// max_splits = PagedSplits(largest kv_len of the batch). Its layout depends on the batch; the
// values written to a slot do not.
inline int64_t PagedWorkspaceBytes(int total_q, int num_heads, int max_kv_len, int v_head_dim) {
  return int64_t{4} * total_q * num_heads * PagedSplits(max_kv_len) * PagedSlotFloats(v_head_dim);
}

// Shared memory of the split kernel: the rows' scaled queries, the warps' probabilities of the
// current tile, and the warps' final states.
inline int PagedSplitSmemBytes(int head_dim, int v_head_dim) {
  return static_cast<int>(sizeof(float)) * (kPagedRows * head_dim + kPagedWarps * kPagedRows * 32 +
                                            kPagedWarps * kPagedRows * PagedSlotFloats(v_head_dim));
}

// Output columns per lane of a kernel instantiation (4 or 8).
inline int PagedOutPerLane(int v_head_dim) { return v_head_dim <= 128 ? 4 : 8; }

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_SHAPE_H_
