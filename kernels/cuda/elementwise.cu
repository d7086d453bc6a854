// Small elementwise kernels around the attention: operand conversion, the value mean of the
// fully-blocked-row fallback, and the bias of the cuBLAS fallback.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/flash_fwd.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Element>
__global__ void ConvertKernel(const float* __restrict__ src, Element* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = detail::FromFloat<Element>(src[i]);
  }
}

__global__ void ValueMeanKernel(const float* __restrict__ v, int64_t v_row_stride,
                                int64_t v_head_stride, const int* __restrict__ cu_seqlens_k,
                                int num_kv_heads, int v_head_dim, float* __restrict__ v_mean) {
  const int seq = blockIdx.x / num_kv_heads;
  const int g = blockIdx.x % num_kv_heads;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= v_head_dim) return;
  const int begin = cu_seqlens_k[seq];
  const int len = cu_seqlens_k[seq + 1] - begin;
  const float* col = v + begin * v_row_stride + g * v_head_stride + c;
  float sum = 0.0f;
  for (int j = 0; j < len; ++j) sum += col[j * v_row_stride];
  v_mean[(int64_t{seq} * num_kv_heads + g) * v_head_dim + c] = len > 0 ? sum / len : 0.0f;
}

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                              int cols) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] += bias[i % cols];
  }
}

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

}  // namespace

GpuStatus ConvertFromFloat(const float* src, void* dst, int64_t n, ComputeType type,
                           cudaStream_t stream) {
  if (n == 0) return {};
  if (type == ComputeType::kFloat16) {
    ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), n);
  } else {
    ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  }
  return CudaCheck(cudaGetLastError(), "convert to 16-bit operands: launch");
}

GpuStatus ValueMean(const float* v, int64_t v_row_stride, int64_t v_head_stride,
                    const int* cu_seqlens_k, int num_seqs, int num_kv_heads, int v_head_dim,
                    float* v_mean, cudaStream_t stream) {
  if (num_seqs == 0) return {};
  const dim3 grid(static_cast<unsigned>(num_seqs) * num_kv_heads, (v_head_dim + 63) / 64);
  ValueMeanKernel<<<grid, 64, 0, stream>>>(v, v_row_stride, v_head_stride, cu_seqlens_k,
                                           num_kv_heads, v_head_dim, v_mean);
  return CudaCheck(cudaGetLastError(), "value mean: launch");
}

GpuStatus AddBias(float* y, const float* bias, int64_t rows, int cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return {};
  AddBiasKernel<<<GridFor(n), kThreads, 0, stream>>>(y, bias, n, cols);
  return CudaCheck(cudaGetLastError(), "bias: launch");
}

}  // namespace attnserve::kernels::cuda
