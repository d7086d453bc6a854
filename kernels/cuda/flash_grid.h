// The launch grid of the fused attention kernels, shared by the launch code
// (flash_fwd_launch_template.h), the kernels and the host emulation tests (tests/cuda_emu/).
//
// One block per (block of query rows, query head, sequence), all on grid x: grid y and z are
// capped at 65535, and a request may have more heads than that (q/k/v [1, 65536, 1, 8] is
// valid); grid x takes up to 2^31 - 1 blocks. Block b computes m block b % m_blocks of head
// (b / m_blocks) % num_heads of sequence b / (m_blocks * num_heads): the m blocks of one head,
// then the heads of one sequence, so that neighbouring blocks (and the query heads of one GQA
// group) read the same K/V from L2.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_GRID_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_GRID_H_

#include <cstdint>

#include "kernels/cuda/online_softmax.h"  // ATTNSERVE_HD

namespace attnserve::kernels::cuda {

inline constexpr int64_t kMaxGridX = 2147483647;  // 2^31 - 1

// The number of blocks, or 0 when there is nothing to compute; the caller rejects a count above
// kMaxGridX.
inline int64_t FlashGridBlocks(int m_blocks, int num_seqs, int num_heads) {
  return int64_t{m_blocks} * num_seqs * num_heads;
}

struct FlashBlockCoord {
  int m_block;
  int head;
  int seq;
};

ATTNSERVE_HD FlashBlockCoord FlashBlockOf(unsigned block, int m_blocks, int num_heads) {
  const int b = static_cast<int>(block);
  const int rest = b / m_blocks;
  return {b % m_blocks, rest % num_heads, rest / num_heads};
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_GRID_H_
