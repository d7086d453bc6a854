// The plain attention path: cuBLAS GEMMs around a masked softmax kernel that materialises the
// weights (flash_fwd.h). Deliberately simple; its cost is O(L^2) memory per head.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr int kSoftmaxThreads = 256;

__device__ float BlockReduce(float x, bool is_max, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  x = is_max ? detail::WarpMax(x) : detail::WarpSum(x);
  __syncthreads();  // scratch may still be read by the previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  constexpr int kWarps = kSoftmaxThreads / 32;
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// ScoreMods as the softmax kernel takes them (FlashFwdParams' window, softcap, alibi_slopes).
struct SoftmaxMods {
  KeyWindow window;
  float softcap;
  const float* alibi_slopes;  // device [num_heads] or nullptr
};

// One block per (row, head) of one sequence: s holds scale * q.k in fp32, [num_heads, q_len,
// kv_len]; modifies the scores (soft-cap, ALiBi), then writes the softmax over the allowed keys
// in place (fp32 weights) and as 16-bit P. A row with no allowed key gets 1 / kv_len everywhere
// (reference semantics).
template <typename Element>
__global__ void __launch_bounds__(kSoftmaxThreads)
    MaskedSoftmaxKernel(float* __restrict__ s, Element* __restrict__ prob, int q_len, int kv_len,
                        int key_length, bool causal, const uint8_t* __restrict__ mask,
                        int64_t mask_head_stride, int64_t mask_row_stride, int64_t mask_col_stride,
                        SoftmaxMods mods) {
  __shared__ float scratch[kSoftmaxThreads / 32];
  // One 1-D grid (grid y is capped at 65535 and heads are not): row fastest, then head.
  const int i = static_cast<int>(blockIdx.x % q_len);
  const int h = static_cast<int>(blockIdx.x / q_len);
  const int64_t row_offset = (int64_t{h} * q_len + i) * kv_len;
  float* row = s + row_offset;
  Element* prow = prob + row_offset;
  const int limit = KeyLimit(i, q_len, kv_len, key_length, causal, mods.window);
  const int start = KeyStart(i, q_len, kv_len, mods.window);
  const uint8_t* mrow =
      mask != nullptr ? mask + h * mask_head_stride + i * mask_row_stride : nullptr;
  auto allowed = [&](int j) {
    return j >= start && j < limit && (mrow == nullptr || mrow[j * mask_col_stride] != 0);
  };
  if (mods.softcap != 0.0f || mods.alibi_slopes != nullptr) {
    const float slope = mods.alibi_slopes != nullptr ? mods.alibi_slopes[h] : 0.0f;
    for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) {
      row[j] = ModifyScore(row[j], mods.softcap, slope, j, i + kv_len - q_len);
    }
  }
  float mx = NegativeInfinity();
  for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) {
    if (allowed(j)) mx = fmaxf(mx, row[j]);
  }
  mx = BlockReduce(mx, true, scratch);
  // fmaxf drops NaN scores: a row of allowed NaN scores keeps mx = -inf, and its exponentials
  // are then taken against 0 (as OnlineSoftmaxProb does) so that the NaN reaches the sum.
  if (mx == NegativeInfinity()) mx = 0.0f;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) {
    if (allowed(j)) sum += expf(row[j] - mx);
  }
  sum = BlockReduce(sum, false, scratch);
  // The NaN rule (attention_params.h): a NaN or +Inf score makes the sum NaN, and the whole row
  // (blocked keys included: 0 * NaN) NaN; only a sum of exactly 0 means "no allowed key".
  const bool blocked = sum == 0.0f;
  const float inv = blocked ? 0.0f : 1.0f / sum;
  const float uniform = 1.0f / kv_len;
  for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) {
    const float w = blocked ? uniform : (allowed(j) ? expf(row[j] - mx) : 0.0f) * inv;
    row[j] = w;
    prow[j] = detail::FromFloat<Element>(w);
  }
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t NaiveAttentionWorkspaceBytes(const FlashFwdParams& p, const int* cu_seqlens_q_host,
                                    const int* cu_seqlens_k_host) {
  size_t most = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const size_t elems = size_t(p.num_heads) * (cu_seqlens_q_host[s + 1] - cu_seqlens_q_host[s]) *
                         (cu_seqlens_k_host[s + 1] - cu_seqlens_k_host[s]);
    most = std::max(most, Align256(elems * sizeof(float)) + Align256(elems * 2));
  }
  return most;
}

GpuStatus NaiveAttentionForward(const FlashFwdParams& p, ComputeType type,
                                const int* cu_seqlens_q_host, const int* cu_seqlens_k_host,
                                const int* key_lengths_host, float* weights, void* workspace,
                                cublasHandle_t blas, cudaStream_t stream) {
  const cudaDataType_t dt = type == ComputeType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  const int group = p.num_heads / p.num_kv_heads;
  const float zero = 0.0f;
  const float one = 1.0f;
  ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(cublasSetStream(blas, stream), "cublasSetStream"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CublasCheck(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode"));
  int64_t weights_offset = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_begin = cu_seqlens_q_host[s];
    const int q_len = cu_seqlens_q_host[s + 1] - q_begin;
    const int k_begin = cu_seqlens_k_host[s];
    const int kv_len = cu_seqlens_k_host[s + 1] - k_begin;
    if (q_len == 0) continue;
    const int64_t elems = int64_t{p.num_heads} * q_len * kv_len;
    float* scores = weights != nullptr ? weights + weights_offset : static_cast<float*>(workspace);
    void* prob = static_cast<char*>(workspace) + Align256(elems * sizeof(float));
    weights_offset += elems;
    const int64_t plane = int64_t{q_len} * kv_len;
    const size_t esize = 2;
    for (int g = 0; g < p.num_kv_heads; ++g) {
      // Row-major S[h] (q_len x kv_len) is column-major S^T = K Q^T: m = kv_len, n = q_len.
      const void* k =
          static_cast<const char*>(p.k) + (k_begin * p.k_row_stride + g * p.k_head_stride) * esize;
      const void* q = static_cast<const char*>(p.q) +
                      (q_begin * p.q_row_stride + int64_t{g} * group * p.q_head_stride) * esize;
      ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
          cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, kv_len, q_len, p.head_dim,
                                     &p.scale, k, dt, static_cast<int>(p.k_row_stride), 0, q, dt,
                                     static_cast<int>(p.q_row_stride), p.q_head_stride, &zero,
                                     scores + g * group * plane, CUDA_R_32F, kv_len, plane, group,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "naive attention: S = Q K^T"));
    }
    const int key_length = key_lengths_host != nullptr ? key_lengths_host[s] : kv_len;
    const uint8_t* mask = p.mask != nullptr ? p.mask + s * p.mask_batch_stride : nullptr;
    const int64_t blocks = int64_t{q_len} * p.num_heads;
    if (blocks > kMaxGridX) return {"naive attention: more than 2^31 - 1 rows x heads"};
    const unsigned grid = static_cast<unsigned>(blocks);
    const SoftmaxMods mods{p.window, p.softcap, p.alibi_slopes};
    if (type == ComputeType::kFloat16) {
      MaskedSoftmaxKernel<<<grid, kSoftmaxThreads, 0, stream>>>(
          scores, static_cast<__half*>(prob), q_len, kv_len, key_length, p.causal, mask,
          p.mask_head_stride, p.mask_row_stride, p.mask_col_stride, mods);
    } else {
      MaskedSoftmaxKernel<<<grid, kSoftmaxThreads, 0, stream>>>(
          scores, static_cast<__nv_bfloat16*>(prob), q_len, kv_len, key_length, p.causal, mask,
          p.mask_head_stride, p.mask_row_stride, p.mask_col_stride, mods);
    }
    ATTNSERVE_GPU_RETURN_IF_ERROR(
        CudaCheck(cudaGetLastError(), "naive attention: masked softmax launch"));
    for (int g = 0; g < p.num_kv_heads; ++g) {
      // Row-major O[h] (q_len x Dv, ld o_row_stride) is column-major O^T = V^T P^T.
      const void* v =
          static_cast<const char*>(p.v) + (k_begin * p.v_row_stride + g * p.v_head_stride) * esize;
      const void* pr = static_cast<const char*>(prob) + int64_t{g} * group * plane * esize;
      float* o = p.o + q_begin * p.o_row_stride + int64_t{g} * group * p.o_head_stride;
      ATTNSERVE_GPU_RETURN_IF_ERROR(CublasCheck(
          cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, p.v_head_dim, q_len, kv_len,
                                     &one, v, dt, static_cast<int>(p.v_row_stride), 0, pr, dt,
                                     kv_len, plane, &zero, o, CUDA_R_32F,
                                     static_cast<int>(p.o_row_stride), p.o_head_stride, group,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "naive attention: O = P V"));
    }
  }
  return {};
}

}  // namespace attnserve::kernels::cuda
