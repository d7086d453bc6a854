// The steps the decode-shaped kernels share (flash_decode_kernel.h, paged_attention_kernel.h):
// each lane scores one key against a group of query rows staged in shared memory, each row takes
// the online-softmax step, and at the end each warp leaves every row's state and partial output
// in shared memory, which warp 0 merges in warp order into the row's slot of the split's partial
// results (the combine kernels then merge the splits in turn).
//
// A row's state, in shared memory and in a slot alike: [max_log2, sum, out[0 .. v_head_dim)].
#ifndef ATTNSERVE_KERNELS_CUDA_DECODE_STEPS_H_
#define ATTNSERVE_KERNELS_CUDA_DECODE_STEPS_H_

#include <cstdint>

#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {

// The scores of the lane's key k_row (nullptr: none, every score 0) against kRows query rows
// staged in shared memory (q_s [kRows][head_dim]): s[r] = sum_d q_s[r][d] · k_row[d], one fmaf
// chain in d order.
template <int kRows, typename Element>
__device__ __forceinline__ void ScoreKey(const float* q_s, int head_dim, const Element* k_row,
                                         float (&s)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = 0.0f;
  if (k_row == nullptr) return;
  for (int d = 0; d < head_dim; ++d) {
    const float kd = detail::ToFloat(k_row[d]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = fmaf(q_s[r * head_dim + d], kd, s[r]);
  }
}

// One row's online-softmax step over the warp's 32 scores, this lane's s (log2 units; -inf when
// blocked): the running max moves to the warp's, the row's accumulators are rescaled, and s's
// probability is returned and added to the running sum.
template <int kOutPerLane>
__device__ __forceinline__ float OnlineSoftmaxStep(OnlineSoftmaxRow& row, float (&acc)[kOutPerLane],
                                                   float s) {
  const float factor = OnlineSoftmaxRescale(row, detail::WarpMax(s));
#pragma unroll
  for (int t = 0; t < kOutPerLane; ++t) acc[t] *= factor;
  const float prob = OnlineSoftmaxProb(row, s);
  row.sum += prob;
  return prob;
}

// The lane's columns d = lane + 32 · t of a value row, as float (0 past v_head_dim).
template <int kOutPerLane, typename Element>
__device__ __forceinline__ void LoadLaneColumns(const Element* v_row, int lane, int v_head_dim,
                                                float (&vals)[kOutPerLane]) {
#pragma unroll
  for (int t = 0; t < kOutPerLane; ++t) {
    const int d = lane + 32 * t;
    vals[t] = d < v_head_dim ? detail::ToFloat(v_row[d]) : 0.0f;
  }
}

// This warp's state of one row into `row`: its max, the warp's sum of `softmax.sum` over the
// lanes (lane 0 writes both) and the output columns d = lane + 32 · t the lane accumulated.
template <int kOutPerLane>
__device__ __forceinline__ void StoreWarpRow(const OnlineSoftmaxRow& softmax,
                                             const float (&acc)[kOutPerLane], int lane,
                                             int v_head_dim, float* row) {
  const float total = detail::WarpSum(softmax.sum);
  if (lane == 0) {
    row[0] = softmax.max_log2;
    row[1] = total;
  }
#pragma unroll
  for (int t = 0; t < kOutPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < v_head_dim) row[2 + d] = acc[t];
  }
}

// The `warps` states of one row (warp w's at first + w · warp_stride) merged in warp order into
// `slot`: m the largest max, l = sum_w sum_w · 2^(max_w - m), out = sum_w out_w · 2^(max_w - m),
// taken against 0 while every max is -inf. Run by one warp.
__device__ __forceinline__ void MergeWarpRows(const float* first, int64_t warp_stride, int warps,
                                              int lane, int v_head_dim, float* slot) {
  float m = NegativeInfinity();
  for (int w = 0; w < warps; ++w) m = Max(m, first[w * warp_stride]);
  const float m_ref = m == NegativeInfinity() ? 0.0f : m;
  float l = 0.0f;
  for (int w = 0; w < warps; ++w) {
    const float* row = first + w * warp_stride;
    l += row[1] * Exp2(row[0] - m_ref);
  }
  for (int d = lane; d < v_head_dim; d += 32) {
    float a = 0.0f;
    for (int w = 0; w < warps; ++w) {
      const float* row = first + w * warp_stride;
      a += row[2 + d] * Exp2(row[0] - m_ref);
    }
    slot[2 + d] = a;
  }
  if (lane == 0) {
    slot[0] = m;
    slot[1] = l;
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_DECODE_STEPS_H_
