// Linear attention's kernel (linear_attention.h): one warp per (batch item, query head, 32
// columns of Dv), the state in shared memory, keys and query rows taken in order.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/feature_map.h"

namespace attnserve::kernels::cuda {

using feature_map::Feature;  // φ of one element, as kernels::ApplyFeatureMap computes it

// Outside the anonymous namespace: its `extern __shared__` array must name the one the
// emulation defines (tests/cuda_emu/emu.cc) when this file runs there.
__global__ void __launch_bounds__(kLinearColumns) LinearAttentionKernel(LinearAttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d_k = p.head_dim;
  float* s = reinterpret_cast<float*>(smem_raw);  // S tile [D][kLinearColumns]
  float* z = s + d_k * kLinearColumns;            // z [D]
  float* f = z + d_k;                             // φ of the key or query row taken [D]
  const int lane = static_cast<int>(threadIdx.x);
  const int tiles = (p.v_head_dim + kLinearColumns - 1) / kLinearColumns;
  const int64_t item = blockIdx.x;  // (b · num_heads + h) · tiles + tile
  const int tile = static_cast<int>(item % tiles);
  const int h = static_cast<int>(item / tiles % p.num_heads);
  const int b = static_cast<int>(item / tiles / p.num_heads);
  const int kvh = h / (p.num_heads / p.num_kv_heads);
  const int c = tile * kLinearColumns + lane;  // this lane's column of Dv
  const bool has_column = c < p.v_head_dim;
  const float* q = p.q.data + b * p.q.batch_stride + h * p.q.head_stride;
  const float* k = p.k.data + b * p.k.batch_stride + kvh * p.k.head_stride;
  const float* v = p.v.data + b * p.v.batch_stride + kvh * p.v.head_stride;
  float* o = p.o + b * p.o_batch_stride + h * p.o_head_stride;
  const int key_length = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;

  for (int d = 0; d < d_k; ++d) s[d * kLinearColumns + lane] = 0.0f;
  for (int d = lane; d < d_k; d += kLinearColumns) z[d] = 0.0f;
  int added = 0;  // keys [0, added) are in the state
  for (int i = 0; i < p.q_len; ++i) {
    // Limits never fall as i grows (causality bottom-right aligned; key lengths fixed).
    const int limit = KeyLimit(i, p.q_len, p.kv_len, key_length, p.causal);
    for (; added < limit; ++added) {
      const float* key = k + added * p.k.row_stride;
      __syncthreads();  // every lane is done reading f and z
      for (int d = lane; d < d_k; d += kLinearColumns) f[d] = Feature(p.feature_map, key[d]);
      const float value = has_column ? v[added * p.v.row_stride + c] : 0.0f;
      __syncthreads();
      // z += φ(k) (each element by one lane), S[:, c] += φ(k) v[c]: LinearAddKey's roundings.
      for (int d = lane; d < d_k; d += kLinearColumns) z[d] = __fadd_rn(z[d], f[d]);
      for (int d = 0; d < d_k; ++d) {
        float& cell = s[d * kLinearColumns + lane];
        cell = __fadd_rn(cell, __fmul_rn(f[d], value));
      }
    }
    const float* query = q + i * p.q.row_stride;
    __syncthreads();
    for (int d = lane; d < d_k; d += kLinearColumns) f[d] = Feature(p.feature_map, query[d]);
    __syncthreads();  // f and z complete
    // LinearReadQuery: both sums over D in index order; a zero normaliser gives zeros.
    float norm = 0.0f, acc = 0.0f;
    for (int d = 0; d < d_k; ++d) {
      norm = __fadd_rn(norm, __fmul_rn(f[d], z[d]));
      acc = __fadd_rn(acc, __fmul_rn(f[d], s[d * kLinearColumns + lane]));
    }
    const float inv = norm != 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
    if (has_column) o[i * p.o_row_stride + c] = __fmul_rn(acc, inv);
  }
}

GpuStatus LinearAttentionForward(const LinearAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim < 1 || p.head_dim > kLinearMaxHeadDim || p.v_head_dim < 1 || p.num_kv_heads < 1 ||
      p.num_heads % p.num_kv_heads != 0 ||
      (p.feature_map != FeatureMap::kEluPlusOne && p.feature_map != FeatureMap::kRelu &&
       p.feature_map != FeatureMap::kIdentity)) {
    return {"linear attention: unsupported shape or feature map"};
  }
  if (p.batch == 0 || p.num_heads == 0 || p.q_len == 0) return {};
  const int64_t tiles = (p.v_head_dim + kLinearColumns - 1) / kLinearColumns;
  const int64_t blocks = int64_t{p.batch} * p.num_heads * tiles;
  if (blocks > kMaxGridX) return {"linear attention: more than 2^31 - 1 blocks"};
  LinearAttentionKernel<<<static_cast<unsigned>(blocks), kLinearColumns,
                          LinearAttentionSmemBytes(p.head_dim), stream>>>(p);
  return CudaCheck(cudaGetLastError(), "linear attention launch");
}

}  // namespace attnserve::kernels::cuda
