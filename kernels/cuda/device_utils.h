// Inline-PTX wrappers the attention kernels are built from: asynchronous global->shared copies
// (cp.async, sm_80+), ldmatrix, the m16n8k16 tensor-core MMA for fp16 and bf16, and operand
// packing. CUDA only; included by the kernel bodies.
#ifndef ATTNSERVE_KERNELS_CUDA_DEVICE_UTILS_H_
#define ATTNSERVE_KERNELS_CUDA_DEVICE_UTILS_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/flash_params.h"

namespace attnserve::kernels::cuda::detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes global -> shared without passing through registers; when !valid the 16 bytes
// are zero-filled instead (rows past the end of a sequence must be finite zeros, not garbage
// that 0 * garbage could turn into NaN).
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
// Copies 4 bytes global -> shared (through L1: .cg takes only 16); the first src_bytes (0 to 4)
// come from gmem, the rest are zero-filled, and no byte past gmem + src_bytes is read. Both
// addresses must be 4-byte aligned. For tiles whose rows start at any byte (the mask).
__device__ __forceinline__ void CpAsync4(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 b16 matrices; lane t supplies the row address of matrix t / 8, row t % 8; register i
// receives matrix i (lane holds row lane / 4, columns 2 * (lane % 4) + {0, 1}).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, each matrix transposed (lane holds column lane / 4, rows 2 * (lane % 4) + {0, 1}).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b on a 16x8x16 tile, fp32 accumulators (PTX ISA, "mma.m16n8k16" fragment layouts).
template <ComputeType kType>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kType == ComputeType::kFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit operands (lo in the low half), round to nearest.
template <ComputeType kType>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (kType == ComputeType::kFloat16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

__device__ __forceinline__ float ToFloat(float x) { return x; }  // float32 caches and inputs
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
// float32 to a 16-bit element, rounding to nearest even.
template <typename Element>
__device__ __forceinline__ Element FromFloat(float x);
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Where a block's rows start: row q_row of query head `head` in q, row k_row of kv head
// `kv_head` in k and v.
template <typename Element>
struct QkvRows {
  const Element* q;
  const Element* k;
  const Element* v;
};
template <typename Element>
__device__ __forceinline__ QkvRows<Element> QkvRowsOf(const FlashFwdParams& p, int64_t q_row,
                                                      int64_t head, int64_t k_row,
                                                      int64_t kv_head) {
  return {static_cast<const Element*>(p.q) + q_row * p.q_row_stride + head * p.q_head_stride,
          static_cast<const Element*>(p.k) + k_row * p.k_row_stride + kv_head * p.k_head_stride,
          static_cast<const Element*>(p.v) + k_row * p.v_row_stride + kv_head * p.v_head_stride};
}

// The value mean that the rows of (seq, kv_head) with no allowed key take (p.v_mean), or null
// when the launch has none (such rows are zero).
__device__ __forceinline__ const float* ValueMeanRow(const FlashFwdParams& p, int seq,
                                                     int kv_head) {
  return p.v_mean != nullptr ? p.v_mean + (int64_t{seq} * p.num_kv_heads + kv_head) * p.v_head_dim
                             : nullptr;
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace attnserve::kernels::cuda::detail

#endif  // ATTNSERVE_KERNELS_CUDA_DEVICE_UTILS_H_
