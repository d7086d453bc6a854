// The decode-shaped attention forward: one query token per sequence (Lq = 1), the query heads of
// a GQA group packed into the rows of one block, and the keys split into chunks of a FIXED size
// (kDecodeSplitKeys), computed in parallel and merged in split order by a second kernel.
//
// Why: the fused kernels give a decode step one block per (sequence, query head) with 1 of 64
// rows in use and no parallelism over keys. Here a block reads each key and value row once for
// its whole group, and a long sequence spreads over ceil(kv_len / kDecodeSplitKeys) blocks. The
// split size is a constant, never derived from the batch: a sequence's splits, and the order
// they are merged in, depend only on its own length, so its output bits do not depend on its
// batch companions (backend.h's batch invariance).
//
// Kernel 1, FlashDecodeSplitKernel: block (split, kv head, sequence); each of kDecodeWarps warps
// takes every kDecodeWarps-th tile of 32 keys of the split, lane j scoring key j against the
// group's kGroup query rows (kept in shared memory, pre-scaled to log2 units), with the online
// softmax of online_softmax.h per row; the warps' states are merged in warp order and written
// to the workspace as (max, sum, accumulator[Dv]) per row.
// Kernel 2, FlashDecodeCombineKernel: block (query head, sequence), one thread per output
// column: merges the splits in order, normalises, or writes v_mean for a row with no allowed key
// (the NaN rule of attention_params.h holds: a NaN sum stays NaN).
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_KERNEL_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_KERNEL_H_

#include <cstdint>

#include "kernels/cuda/decode_steps.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/flash_decode_shape.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {

// The "1" (min blocks) as in the generic kernel: without it ptxas capped the registers low and
// spilled on sm_90.
template <typename Element, int kGroup>
__global__ void __launch_bounds__(kDecodeWarps * 32, 1)
    FlashDecodeSplitKernel(const FlashFwdParams p, const int max_splits, float* partial) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* q_s = reinterpret_cast<float*>(smem_raw);  // [kGroup, head_dim]
  float* warp_state = q_s + kGroup * p.head_dim;    // [kDecodeWarps, slot]
  const int slot_floats = static_cast<int>(DecodeSlotFloats(kGroup, p.v_head_dim));

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int split = static_cast<int>(blockIdx.x % max_splits);
  const int rest = static_cast<int>(blockIdx.x / max_splits);
  const int kv_head = rest % p.num_kv_heads;
  const int seq = rest / p.num_kv_heads;
  const int q_begin = p.cu_seqlens_q[seq];
  const int q_len = p.cu_seqlens_q[seq + 1] - q_begin;
  if (q_len == 0) return;  // REQUIRES q_len <= 1
  const int k_begin = p.cu_seqlens_k[seq];
  const int kv_len = p.cu_seqlens_k[seq + 1] - k_begin;
  const int key_length = p.key_lengths != nullptr ? p.key_lengths[seq] : kv_len;
  const int limit = KeyLimit(0, q_len, kv_len, key_length, p.causal, p.window);
  if (split >= DecodeSplits(limit)) return;  // the combine kernel reads only live splits
  // Keys before the window are blocked (their splits stay empty states); soft-capping and ALiBi
  // modify each score in linear units (ModifyScore).
  const int start = KeyStart(0, q_len, kv_len, p.window);
  const int aligned = kv_len - q_len;
  const bool modify = p.modifies_scores();
  const int j_begin = split * kDecodeSplitKeys;
  const int j_end = min(j_begin + kDecodeSplitKeys, limit);

  const auto [q_row, k_base, v_base] =
      detail::QkvRowsOf<Element>(p, q_begin, int64_t{kv_head} * kGroup, k_begin, kv_head);
  for (int idx = threadIdx.x; idx < kGroup * p.head_dim; idx += kDecodeWarps * 32) {
    const int g = idx / p.head_dim;
    const int d = idx % p.head_dim;
    q_s[idx] = detail::ToFloat(q_row[g * p.q_head_stride + d]) * (modify ? p.scale : p.scale_log2);
  }
  __syncthreads();

  OnlineSoftmaxRow softmax[kGroup];
  float acc[kGroup][kDecodeOutPerLane];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    softmax[g] = OnlineSoftmaxInit();
#pragma unroll
    for (int t = 0; t < kDecodeOutPerLane; ++t) acc[g][t] = 0.0f;
  }
  for (int j0 = j_begin + warp * 32; j0 < j_end; j0 += kDecodeWarps * 32) {
    const int j = j0 + lane;
    float s[kGroup];
    ScoreKey(q_s, p.head_dim, j < j_end ? k_base + int64_t{j} * p.k_row_stride : nullptr, s);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int head = kv_head * kGroup + g;
      bool allowed = j < j_end && j >= start;
      if (allowed && p.mask != nullptr) {
        allowed = p.mask[seq * p.mask_batch_stride + head * p.mask_head_stride +
                         int64_t{j} * p.mask_col_stride] != 0;
      }
      if (modify) {
        const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[head] : 0.0f;
        s[g] = ModifyScore(s[g], p.softcap, slope, j, aligned) * kLog2e;
      }
      if (!allowed) s[g] = NegativeInfinity();
      s[g] = OnlineSoftmaxStep(softmax[g], acc[g], s[g]);  // now the probability
    }
    const int n = min(32, j_end - j0);
    for (int jj = 0; jj < n; ++jj) {
      const Element* v_row = v_base + int64_t{j0 + jj} * p.v_row_stride;
      float vals[kDecodeOutPerLane];
      LoadLaneColumns(v_row, lane, p.v_head_dim, vals);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float pj = __shfl_sync(0xffffffffu, s[g], jj);
#pragma unroll
        for (int t = 0; t < kDecodeOutPerLane; ++t) acc[g][t] = fmaf(pj, vals[t], acc[g][t]);
      }
    }
  }

  // This warp's state per row -> shared memory; then warp 0 merges the warps in order.
  const int row_floats = 2 + p.v_head_dim;
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    StoreWarpRow(softmax[g], acc[g], lane, p.v_head_dim,
                 warp_state + warp * slot_floats + g * row_floats);
  }
  __syncthreads();
  if (warp != 0) return;
  float* slot =
      partial + ((int64_t{seq} * p.num_kv_heads + kv_head) * max_splits + split) * slot_floats;
  for (int g = 0; g < kGroup; ++g) {
    MergeWarpRows(warp_state + g * row_floats, slot_floats, kDecodeWarps, lane, p.v_head_dim,
                  slot + g * row_floats);
  }
}

// Block (query head, sequence), thread d writes output column d (blockDim >= v_head_dim).
template <int kGroup>
__global__ void __launch_bounds__(kDecodeMaxVHeadDim)
    FlashDecodeCombineKernel(const FlashFwdParams p, const int max_splits, const float* partial) {
  const int head = static_cast<int>(blockIdx.x % p.num_heads);
  const int seq = static_cast<int>(blockIdx.x / p.num_heads);
  const int d = threadIdx.x;
  const int q_begin = p.cu_seqlens_q[seq];
  const int q_len = p.cu_seqlens_q[seq + 1] - q_begin;
  if (q_len == 0 || d >= p.v_head_dim) return;
  const int kv_len = p.cu_seqlens_k[seq + 1] - p.cu_seqlens_k[seq];
  const int key_length = p.key_lengths != nullptr ? p.key_lengths[seq] : kv_len;
  const int splits = DecodeSplits(KeyLimit(0, q_len, kv_len, key_length, p.causal, p.window));
  const int kv_head = head / kGroup;
  const int g = head % kGroup;
  const int slot_floats = static_cast<int>(DecodeSlotFloats(kGroup, p.v_head_dim));
  const float* base = partial +
                      (int64_t{seq} * p.num_kv_heads + kv_head) * max_splits * slot_floats +
                      g * (2 + p.v_head_dim);
  float m = NegativeInfinity();
  for (int s = 0; s < splits; ++s) m = Max(m, base[s * slot_floats]);
  const float m_ref = m == NegativeInfinity() ? 0.0f : m;
  float l = 0.0f;
  float a = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float* row = base + s * slot_floats;
    const float f = Exp2(row[0] - m_ref);
    l += row[1] * f;
    a += row[2 + d] * f;
  }
  float* o = p.o + int64_t{q_begin} * p.o_row_stride + int64_t{head} * p.o_head_stride;
  if (!OnlineSoftmaxFullyBlocked(l)) {
    o[d] = a * OnlineSoftmaxInvSum(l);
  } else {
    const float* mean = detail::ValueMeanRow(p, seq, kv_head);
    o[d] = mean != nullptr ? mean[d] : 0.0f;
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_DECODE_KERNEL_H_
