// The generic attention forward kernel: any head_dim, v_head_dim <= kGenericMaxVHeadDim, any
// alignment. Plain fp32 arithmetic (no tensor cores) on the 16-bit operands: the fallback for
// head dimensions the tensor-core kernel is not specialised for. Same semantics and the same
// online-softmax steps (online_softmax.h) as flash_fwd_kernel.h.
//
// One warp per query row; keys in tiles of 32, lane j scoring key j of the tile against the
// row's q (kept in shared memory, pre-scaled to log2 units); each lane then accumulates output
// columns lane, lane + 32, ... over the tile's keys.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_FWD_GENERIC_KERNEL_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_FWD_GENERIC_KERNEL_H_

#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {

inline constexpr int kGenericWarps = 4;

template <typename Element>
__global__ void __launch_bounds__(kGenericWarps * 32, 1)
    FlashFwdGenericKernel(const FlashFwdParams p, const int blocks_per_seq) {
  constexpr int kOutPerLane = kGenericMaxVHeadDim / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* q_s = reinterpret_cast<float*>(smem_raw) + warp * p.head_dim;

  // One 1-D grid (flash_grid.h), blocks of kGenericWarps rows as the m blocks.
  const FlashBlockCoord coord = FlashBlockOf(blockIdx.x, blocks_per_seq, p.num_heads);
  const int seq = coord.seq;
  const int i = coord.m_block * kGenericWarps + warp;
  const int head = coord.head;
  const int q_begin = p.cu_seqlens_q[seq];
  const int q_len = p.cu_seqlens_q[seq + 1] - q_begin;
  if (i >= q_len) return;  // whole warp; only __syncwarp below
  const int k_begin = p.cu_seqlens_k[seq];
  const int kv_len = p.cu_seqlens_k[seq + 1] - k_begin;
  const int key_length = p.key_lengths != nullptr ? p.key_lengths[seq] : kv_len;
  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const int limit = KeyLimit(i, q_len, kv_len, key_length, p.causal, p.window);
  const int start = KeyStart(i, q_len, kv_len, p.window);
  const int aligned = i + kv_len - q_len;
  const bool modify = p.modifies_scores();
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[head] : 0.0f;

  const auto [q_row, k_base, v_base] =
      detail::QkvRowsOf<Element>(p, q_begin + i, head, k_begin, kv_head);
  const uint8_t* mask_row =
      p.mask != nullptr
          ? p.mask + seq * p.mask_batch_stride + head * p.mask_head_stride + i * p.mask_row_stride
          : nullptr;

  // Queries in log2 units, or (with soft-capping or ALiBi) in linear ones: ModifyScore then
  // takes each score to log2 units.
  const float q_scale = modify ? p.scale : p.scale_log2;
  for (int d = lane; d < p.head_dim; d += 32) q_s[d] = detail::ToFloat(q_row[d]) * q_scale;
  __syncwarp();

  float acc[kOutPerLane];
#pragma unroll
  for (int t = 0; t < kOutPerLane; ++t) acc[t] = 0.0f;
  OnlineSoftmaxRow softmax = OnlineSoftmaxInit();

  // From the 32-key block holding the window's first key: earlier ones are all blocked.
  for (int j0 = FirstKeyBlock(i, q_len, kv_len, 32, p.window) * 32; j0 < limit; j0 += 32) {
    const int j = j0 + lane;
    float s = NegativeInfinity();
    if (j >= start && j < limit && (mask_row == nullptr || mask_row[j * p.mask_col_stride] != 0)) {
      const Element* k_row = k_base + j * p.k_row_stride;
      float dot = 0.0f;
      for (int d = 0; d < p.head_dim; ++d) dot = fmaf(q_s[d], detail::ToFloat(k_row[d]), dot);
      s = modify ? ModifyScore(dot, p.softcap, slope, j, aligned) * kLog2e : dot;
    }
    // Every lane sees the same tile max, so every lane keeps the same running max; each lane's
    // sum covers its own keys and is reduced at the end.
    const float factor = OnlineSoftmaxRescale(softmax, detail::WarpMax(s));
#pragma unroll
    for (int t = 0; t < kOutPerLane; ++t) acc[t] *= factor;
    const float prob = OnlineSoftmaxProb(softmax, s);
    softmax.sum += prob;
    const int n = min(32, limit - j0);
    // Partial unroll; with no min-blocks hint ptxas capped the kernel at 40 registers and
    // spilled on sm_90 (hence the "1" in __launch_bounds__).
#pragma unroll 2
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, prob, jj);
      const Element* v_row = v_base + (j0 + jj) * p.v_row_stride;
#pragma unroll
      for (int t = 0; t < kOutPerLane; ++t) {
        const int d = lane + 32 * t;
        if (d < p.v_head_dim) acc[t] = fmaf(pj, detail::ToFloat(v_row[d]), acc[t]);
      }
    }
  }

  const float total = detail::WarpSum(softmax.sum);
  const float inv = OnlineSoftmaxInvSum(total);
  const bool blocked = OnlineSoftmaxFullyBlocked(total);
  const float* mean = detail::ValueMeanRow(p, seq, kv_head);
  float* o_row = p.o + (q_begin + i) * p.o_row_stride + head * p.o_head_stride;
#pragma unroll
  for (int t = 0; t < kOutPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < p.v_head_dim) {
      o_row[d] = !blocked ? acc[t] * inv : (mean != nullptr ? mean[d] : 0.0f);
    }
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_FWD_GENERIC_KERNEL_H_
