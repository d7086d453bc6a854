// Linear attention on the device (kernels/attention_params.h, AttentionKind::kLinear): the
// recurrent form of Katharopoulos et al. 2020, as the CPU backend computes it
// (kernels/cpu/linear_attention.cc, kernels/linear_state.h). For one (batch item, query head),
// the running state S = sum φ(k_j) v_jᵀ [D][Dv] and z = sum φ(k_j) [D] take each allowed key once,
// in key order, as the rows' limits (causality bottom-right aligned, key lengths) reach it, and
// each query row reads them: out = φ(q)ᵀ S / (φ(q) · z), zeros when φ(q) · z is exactly 0. Time
// O((Lq + Lk) · D · Dv), memory O(D · Dv) per head, whatever the length.
//
// One block (one warp) per (batch item, query head, 32 columns of Dv): its S tile [D][32] and z
// live in shared memory; lane c owns column c of the tile and sums over D in index order. Every
// product and sum is rounded on its own (no fused multiply-add), in the CPU backend's order, and
// the features are kernels/feature_map.h's (elu + 1's exp included: not the device's expf), so
// a row has the CPU backend's bits with every feature map. A row's bits depend on its own
// (b, h) alone (batch invariance).
//
// Float32 inputs and output on the device; the backend widens 16-bit inputs while it stages
// them, as the CPU backend does.
#ifndef ATTNSERVE_KERNELS_CUDA_LINEAR_ATTENTION_H_
#define ATTNSERVE_KERNELS_CUDA_LINEAR_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/gpu_status.h"

namespace attnserve::kernels::cuda {

// A [batch, heads, rows, dim] view of float32 device memory; strides in elements, dim contiguous.
struct LinearView {
  const float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

struct LinearAttentionParams : AttentionShape {
  LinearView q, k, v;  // q [batch, num_heads, q_len, D]; k [.., num_kv_heads, kv_len, D]; v (Dv)
  float* o = nullptr;  // [batch, num_heads, q_len, Dv]
  int64_t o_batch_stride = 0, o_head_stride = 0, o_row_stride = 0;
  bool causal = false;
  const int* key_lengths = nullptr;  // device [batch], or nullptr: kv_len each
  FeatureMap feature_map = FeatureMap::kEluPlusOne;
};

// The launch's shape from `a` (dims, lengths, causality, the feature map); the caller sets the
// device views, the output and the key lengths.
inline LinearAttentionParams LinearShapeOf(const AttentionParams& a) {
  LinearAttentionParams p;
  static_cast<AttentionShape&>(p) = a;
  p.causal = a.causal;
  p.feature_map = a.feature_map;
  return p;
}

// The columns of Dv one block computes.
inline constexpr int kLinearColumns = 32;
// The dynamic shared memory of a launch at head dim D: the S tile, z and φ of the row read.
inline size_t LinearAttentionSmemBytes(int head_dim) {
  return sizeof(float) * size_t(head_dim) * (kLinearColumns + 2);
}
// The largest head dim a launch takes (its shared memory within the 48 KiB every device gives a
// block without opting in).
inline constexpr int kLinearMaxHeadDim = 256;

// Computes p.o on `stream`. An error names what failed (bad shape, grid too large, the launch).
GpuStatus LinearAttentionForward(const LinearAttentionParams& p, cudaStream_t stream);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LINEAR_ATTENTION_H_
