// Attention over a paged KV cache (decode sessions; kernels/paged_attention_params.h): the
// decode-shaped kernel of flash_decode_kernel.h generalised to pages, to q_len >= 1 per sequence
// (decode steps and prefill chunks, causal bottom-right), to float32 caches and v_head_dim up to
// 256, with the log-sum-exp as an optional output.
//
// Rows. A block computes kPagedRows query rows of one sequence that share a kv head: row
// r = token * group + g (query head kv_head * group + g of the sequence's token `token`). For a
// decode step with GQA 8 that is the group's 8 heads; with group 1 it is 8 tokens of a prefill
// chunk. Each key and value row a block reads serves all of its rows.
//
// Splits. The keys of a sequence are cut at multiples of kPagedSplitKeys (a constant): block
// (split, row block, kv head, sequence) of kernel 1 computes its rows' online-softmax states over
// the split's keys and writes (max, sum, accumulator[Dv]) per row to the workspace; kernel 2
// merges, per row, the splits that row can see in split order, normalises, and writes out and
// lse. A row's result depends only on its own sequence (its token, the sequence's pages and
// lengths): which block computes it, and how the batch's workspace is laid out, do not change a
// bit (batch invariance, paged_attention_params.h).
//
// Kernel 1, PagedAttentionSplitKernel: each of kPagedWarps warps takes every kPagedWarps-th tile
// of 32 keys of the split; lane j reads key j of the tile through the page table and scores it
// against the block's rows (queries in shared memory, pre-scaled to log2 units); the tile's
// probabilities go to shared memory, and each lane accumulates the value columns it owns
// (lane + 32 t) over the tile's keys. Keys past a row's causal limit, or before its sliding
// window's start, score -inf (weight exactly 0); with soft-capping or ALiBi (PagedAttentionParams'
// modifications) each score is modified in linear units (ModifyScore) before it is taken to log2
// units. A split wholly before the window of every row of the block is not computed, and kernel 2
// merges a row's splits from the first one its window reaches (PagedFirstSplit): a session's
// dropped pages are never read. The warps' states are merged in warp order.
// Kernel 2, PagedAttentionCombineKernel: same blocks without the split; thread c owns columns
// c, c + 128, ... of every row.
//
// NaN rule (attention_params.h): a NaN or +Inf score makes the row's sum NaN, hence a NaN row
// and lse. A row whose allowed scores are all -Inf has a zero sum: it is treated as fully
// blocked and attends uniformly to every key of its sequence (kernel 2 averages v over them, a
// slow path for a row no finite input produces), with lse -Inf, as ReferencePagedAttention64.
#ifndef ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNEL_H_
#define ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNEL_H_

#include <cstdint>

#include "kernels/cuda/decode_steps.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention_shape.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels::cuda {

inline constexpr float kLn2 = 0.6931471805599453f;

// The block's place in the grid of kernel 1 (without `split`) and kernel 2.
struct PagedBlock {
  int seq;
  int kv_head;
  int row0;    // first row (token * group + g) of the block
  int n_rows;  // rows of the block in use, 1..kPagedRows; 0: nothing to do
};

ATTNSERVE_HD PagedBlock PagedBlockOf(const PagedKernelParams& p, int64_t b, int row_blocks) {
  PagedBlock blk;
  const int row_block = static_cast<int>(b % row_blocks);
  b /= row_blocks;
  blk.kv_head = static_cast<int>(b % p.num_kv_heads);
  blk.seq = static_cast<int>(b / p.num_kv_heads);
  const int rows = p.q_lens[blk.seq] * (p.num_heads / p.num_kv_heads);
  blk.row0 = row_block * kPagedRows;
  blk.n_rows = blk.row0 >= rows ? 0 : min(kPagedRows, rows - blk.row0);
  return blk;
}

// Keys row `row` of sequence `seq` may attend to (causal, bottom-right aligned): those before
// this limit, its aligned position pos = limit - 1 included.
ATTNSERVE_HD int PagedRowLimit(const PagedKernelParams& p, int seq, int row) {
  const int token = row / (p.num_heads / p.num_kv_heads);
  return p.kv_lens[seq] - p.q_lens[seq] + token + 1;
}

// The first key the row may attend to: its sliding window's start, pos - window_left (0 without
// a window, window_left < 0), as KeyStart computes it for dense rows. Starts grow with the
// token, as limits do.
ATTNSERVE_HD int PagedRowStart(const PagedKernelParams& p, int window_left, int seq, int row) {
  const int token = row / (p.num_heads / p.num_kv_heads);
  return KeyStart(token, p.q_lens[seq], p.kv_lens[seq], KeyWindow{window_left, -1});
}

// The first split holding a key the row may attend to. The splits before it are never computed
// for the row, nor read (a session drops the pages wholly before its next token's split).
ATTNSERVE_HD int PagedFirstSplit(const PagedKernelParams& p, int window_left, int seq, int row) {
  return PagedRowStart(p, window_left, seq, row) / kPagedSplitKeys;
}

template <typename Element, int kOutPerLane>
__global__ void __launch_bounds__(kPagedWarps * 32, 1)
    PagedAttentionSplitKernel(const PagedAttentionParams p, const int row_blocks,
                              const int max_splits, float* partial) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int slot_floats = PagedSlotFloats(p.v_head_dim);
  float* q_s = reinterpret_cast<float*>(smem_raw);          // [kPagedRows, head_dim]
  float* p_s = q_s + kPagedRows * p.head_dim;               // [kPagedWarps, kPagedRows, 32]
  float* warp_state = p_s + kPagedWarps * kPagedRows * 32;  // [kPagedWarps, kPagedRows, slot]

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int split = static_cast<int>(blockIdx.x % max_splits);
  const PagedBlock blk = PagedBlockOf(p, blockIdx.x / max_splits, row_blocks);
  if (blk.n_rows == 0) return;
  // Limits grow with the token: the block's last row sees the most keys.
  const int block_limit = PagedRowLimit(p, blk.seq, blk.row0 + blk.n_rows - 1);
  if (split >= PagedSplits(block_limit)) return;  // kernel 2 reads only splits a row can see
  if (split < PagedFirstSplit(p, p.window_left, blk.seq, blk.row0)) return;  // before every window
  const int j_begin = split * kPagedSplitKeys;
  const int j_end = min(j_begin + kPagedSplitKeys, block_limit);
  const int group = p.num_heads / p.num_kv_heads;
  const int32_t* pages = p.page_table + int64_t{blk.seq} * p.max_pages_per_seq;
  const Element* k_pages = static_cast<const Element*>(p.k_pages);
  const Element* v_pages = static_cast<const Element*>(p.v_pages);

  // Scores in log2 units; with soft-capping or ALiBi in linear ones first (ModifyScore).
  const bool modify = p.softcap != 0.0f || p.alibi_slopes != nullptr;
  const float q_scale = modify ? p.scale : p.scale * kLog2e;
  const int q_token0 = p.q_offsets[blk.seq];
  for (int idx = threadIdx.x; idx < kPagedRows * p.head_dim; idx += kPagedWarps * 32) {
    const int r = idx / p.head_dim;
    const int d = idx % p.head_dim;
    float x = 0.0f;
    if (r < blk.n_rows) {
      const int row = blk.row0 + r;
      const int head = blk.kv_head * group + row % group;
      const int64_t token = q_token0 + row / group;
      const int64_t at = (token * p.num_heads + head) * p.head_dim + d;
      // q in float32 or in the cache's type (q_dtype): queries are not rounded to the cache's.
      x = (p.q_dtype == DType::kFloat32 ? static_cast<const float*>(p.q)[at]
                                        : detail::ToFloat(static_cast<const Element*>(p.q)[at])) *
          q_scale;
    }
    q_s[idx] = x;
  }
  __syncthreads();

  int limit[kPagedRows], start[kPagedRows];
  float slope[kPagedRows];
  OnlineSoftmaxRow softmax[kPagedRows];
  float acc[kPagedRows][kOutPerLane];
#pragma unroll
  for (int r = 0; r < kPagedRows; ++r) {
    limit[r] = r < blk.n_rows ? PagedRowLimit(p, blk.seq, blk.row0 + r) : 0;
    start[r] = r < blk.n_rows ? PagedRowStart(p, p.window_left, blk.seq, blk.row0 + r) : 0;
    slope[r] = p.alibi_slopes != nullptr && r < blk.n_rows
                   ? p.alibi_slopes[blk.kv_head * group + (blk.row0 + r) % group]
                   : 0.0f;
    softmax[r] = OnlineSoftmaxInit();
#pragma unroll
    for (int t = 0; t < kOutPerLane; ++t) acc[r][t] = 0.0f;
  }
  float* my_p = p_s + warp * kPagedRows * 32;
  for (int j0 = j_begin + warp * 32; j0 < j_end; j0 += kPagedWarps * 32) {
    const int j = j0 + lane;
    float s[kPagedRows];
    ScoreKey(q_s, p.head_dim,
             j < j_end ? k_pages + p.k_offset(pages[j / p.page_size], blk.kv_head, j % p.page_size)
                       : nullptr,
             s);
#pragma unroll
    for (int r = 0; r < kPagedRows; ++r) {
      if (r >= blk.n_rows) break;  // uniform over the block
      if (modify) s[r] = ModifyScore(s[r], p.softcap, slope[r], j, limit[r] - 1) * kLog2e;
      if (!(j < j_end && j < limit[r] && j >= start[r])) s[r] = NegativeInfinity();
      s[r] = OnlineSoftmaxStep(softmax[r], acc[r], s[r]);  // now the probability
      my_p[r * 32 + lane] = s[r];
    }
    __syncwarp();
    const int n = min(32, j_end - j0);
    for (int jj = 0; jj < n; ++jj) {
      const int key = j0 + jj;
      const Element* v_row =
          v_pages + p.v_offset(pages[key / p.page_size], blk.kv_head, key % p.page_size);
      float vals[kOutPerLane];
      LoadLaneColumns(v_row, lane, p.v_head_dim, vals);
#pragma unroll
      for (int r = 0; r < kPagedRows; ++r) {
        if (r >= blk.n_rows) break;
        const float pj = my_p[r * 32 + jj];
#pragma unroll
        for (int t = 0; t < kOutPerLane; ++t) acc[r][t] = fmaf(pj, vals[t], acc[r][t]);
      }
    }
    __syncwarp();  // my_p is rewritten by the next tile
  }

  // This warp's state per row -> shared memory; then warp 0 merges the warps in order.
#pragma unroll
  for (int r = 0; r < kPagedRows; ++r) {
    if (r >= blk.n_rows) break;
    StoreWarpRow(softmax[r], acc[r], lane, p.v_head_dim,
                 warp_state + (warp * kPagedRows + r) * slot_floats);
  }
  __syncthreads();
  if (warp != 0) return;
  for (int r = 0; r < blk.n_rows; ++r) {
    const int row_index = blk.row0 + r;
    const int head = blk.kv_head * group + row_index % group;
    const int64_t token = q_token0 + row_index / group;
    float* slot = partial + ((token * p.num_heads + head) * max_splits + split) * slot_floats;
    MergeWarpRows(warp_state + r * slot_floats, int64_t{kPagedRows} * slot_floats, kPagedWarps,
                  lane, p.v_head_dim, slot);
  }
}

// Block (row block, kv head, sequence) as in kernel 1; kPagedWarps * 32 threads.
template <typename Element>
__global__ void __launch_bounds__(kPagedWarps * 32)
    PagedAttentionCombineKernel(const PagedKernelParams p, const int window_left,
                                const int row_blocks, const int max_splits, const float* partial) {
  const PagedBlock blk = PagedBlockOf(p, blockIdx.x, row_blocks);
  const int group = p.num_heads / p.num_kv_heads;
  const int slot_floats = PagedSlotFloats(p.v_head_dim);
  for (int r = 0; r < blk.n_rows; ++r) {
    const int row_index = blk.row0 + r;
    const int head = blk.kv_head * group + row_index % group;
    const int64_t token = p.q_offsets[blk.seq] + row_index / group;
    const int splits = PagedSplits(PagedRowLimit(p, blk.seq, row_index));
    const int first = PagedFirstSplit(p, window_left, blk.seq, row_index);
    const float* base = partial + (token * p.num_heads + head) * max_splits * slot_floats;
    float m = NegativeInfinity();
    for (int s = first; s < splits; ++s) m = Max(m, base[s * slot_floats]);
    const float m_ref = m == NegativeInfinity() ? 0.0f : m;
    float l = 0.0f;
    for (int s = first; s < splits; ++s)
      l += base[s * slot_floats + 1] * Exp2(base[s * slot_floats] - m_ref);
    // A zero sum (every allowed score -inf): the uniform average over the sequence's keys (the
    // NaN rule's rule 2). A NaN sum stays NaN.
    const bool no_weight = OnlineSoftmaxFullyBlocked(l);
    const float inv = OnlineSoftmaxInvSum(l);
    float* o = p.out + (token * p.num_heads + head) * p.v_head_dim;
    for (int d = threadIdx.x; d < p.v_head_dim; d += kPagedWarps * 32) {
      float a = 0.0f;
      if (no_weight) {
        const int kv_len = p.kv_lens[blk.seq];
        const int32_t* pages = p.page_table + int64_t{blk.seq} * p.max_pages_per_seq;
        const Element* v_pages = static_cast<const Element*>(p.v_pages);
        for (int j = 0; j < kv_len; ++j) {
          a += detail::ToFloat(
              v_pages[p.v_offset(pages[j / p.page_size], blk.kv_head, j % p.page_size) + d]);
        }
        o[d] = a / static_cast<float>(kv_len);
        continue;
      }
      for (int s = first; s < splits; ++s) {
        const float* row = base + s * slot_floats;
        a += row[2 + d] * Exp2(row[0] - m_ref);
      }
      o[d] = a * inv;
    }
    if (p.lse != nullptr && threadIdx.x == 0) {
      p.lse[token * p.num_heads + head] = no_weight ? NegativeInfinity() : (m + log2f(l)) * kLn2;
    }
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNEL_H_
