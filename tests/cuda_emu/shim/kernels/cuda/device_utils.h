// Shim of kernels/cuda/device_utils.h for the host emulation (tests/cuda_emu/README.md): the
// same functions, the inline PTX replaced by emulations written from the PTX ISA:
//   cp.async.cg.shared.global 16 (src-size 0 zero-fills), cp.async.ca.shared.global 4 (src-size
//   0 to 4, the rest zero-filled), commit_group, wait_group 0;
//   ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16;
//   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// ("Matrix Fragments for mma.m16n8k16 with floating point type" and "Warp-level matrix load
// instruction: ldmatrix" of the PTX ISA). The helpers without PTX (PackPair, ToFloat, the
// shuffle reductions) are the real file's, kept identical (tests/cuda_emu/shim_check.sh).
#ifndef ATTNSERVE_KERNELS_CUDA_DEVICE_UTILS_H_
#define ATTNSERVE_KERNELS_CUDA_DEVICE_UTILS_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/flash_params.h"
#include "tests/cuda_emu/emu.h"

namespace attnserve::kernels::cuda::detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg.shared.global [smem], [gmem], 16, src_bytes: src_bytes of 0 zero-fills the 16
// destination bytes and reads nothing. Both addresses must be 16-byte aligned.
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool valid) {
  unsigned char* dst = emu::SharedAt(smem, 16, 16, "cp.async destination");
  if (reinterpret_cast<uintptr_t>(gmem) % 16 != 0) emu::Fail("cp.async: unaligned source");
  static const unsigned char kZeros[16] = {};
  emu::CpAsync(dst, valid ? gmem : kZeros, 16);
}
// cp.async.ca.shared.global [smem], [gmem], 4, src_bytes: the first src_bytes (0 to 4) from
// gmem, the rest zero-filled; nothing past gmem + src_bytes is read (ASan checks). Both
// addresses must be 4-byte aligned.
__device__ __forceinline__ void CpAsync4(uint32_t smem, const void* gmem, int src_bytes) {
  unsigned char* dst = emu::SharedAt(smem, 4, 4, "cp.async destination");
  if (reinterpret_cast<uintptr_t>(gmem) % 4 != 0) emu::Fail("cp.async: unaligned source");
  if (src_bytes < 0 || src_bytes > 4) emu::Fail("cp.async: src-size outside [0, 4]");
  static const unsigned char kZeros[4] = {};
  emu::CpAsync(dst, src_bytes > 0 ? gmem : kZeros, src_bytes);
  emu::CpAsync(dst + src_bytes, kZeros, 4 - src_bytes);
}
__device__ __forceinline__ void CpAsyncCommit() { emu::CpAsyncCommit(); }
__device__ __forceinline__ void CpAsyncWaitAll() { emu::CpAsyncWait(0); }

namespace emu_impl {

// ldmatrix .x4: lane l addresses row l % 8 of matrix l / 8 (16 bytes each). Without .trans,
// lane l receives, for each matrix i, the two b16 elements of row l / 4 at columns
// 2 * (l % 4) and 2 * (l % 4) + 1 (the lower column in the low half); with .trans the matrix is
// transposed first: elements (row 2 * (l % 4), column l / 4) and (row 2 * (l % 4) + 1, column
// l / 4).
inline void LdMatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  emu::Slot s;
  s.op = trans ? emu::kOpLdMatrixX4Trans : emu::kOpLdMatrixX4;
  s.w[0] = addr;
  const emu::Slot* all = emu::WarpExchange(s);
  const int l = emu::LaneId();
  for (int i = 0; i < 4; ++i) {
    auto element = [&](int row, int col) {  // of matrix i
      const unsigned char* p = emu::SharedAt(all[8 * i + row].w[0], 16, 16, "ldmatrix row");
      uint16_t v;
      std::memcpy(&v, p + 2 * col, 2);
      return static_cast<uint32_t>(v);
    };
    if (!trans) {
      r[i] = element(l / 4, 2 * (l % 4)) | (element(l / 4, 2 * (l % 4) + 1) << 16);
    } else {
      r[i] = element(2 * (l % 4), l / 4) | (element(2 * (l % 4) + 1, l / 4) << 16);
    }
  }
}

inline float Decode(uint16_t bits, ComputeType type) {
  if (type == ComputeType::kFloat16) return __half2float(__half{bits});
  return __bfloat162float(__nv_bfloat16{bits});
}

// mma.m16n8k16 .row.col, fp32 accumulators. With groupID g = lane / 4 and t = lane % 4:
//   A (16x16, 4 registers of 2 elements a0..a7): a0,a1 at (g, 2t + {0,1}), a2,a3 at
//     (g + 8, 2t + {0,1}), a4,a5 at (g, 2t + 8 + {0,1}), a6,a7 at (g + 8, 2t + 8 + {0,1});
//   B (16x8, 2 registers b0..b3): b0,b1 at (k = 2t + {0,1}, n = g), b2,b3 at (2t + 8 + {0,1}, g);
//   C/D (16x8, c0..c3): c0,c1 at (g, 2t + {0,1}), c2,c3 at (g + 8, 2t + {0,1}).
// Products are exact in float64 and summed in float64, rounded to float32 once: the hardware's
// accumulation order and rounding are not specified, so the tests' tolerances must cover both.
// Slot words: a in 0-3, b in 4-5, the lane's accumulators c in 6-9; the warp's product is made
// once (MmaCombine, by the last lane to arrive) and each lane's d comes back in words 0-3.
inline void MmaCombine(emu::Slot* all) {
  const ComputeType type =
      all[0].op == emu::kOpMmaF16 ? ComputeType::kFloat16 : ComputeType::kBFloat16;
  double am[16][16];
  double bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4;
    const int t = lane % 4;
    const uint32_t* w = all[lane].w;
    for (int h = 0; h < 2; ++h) {
      auto half = [&](uint32_t reg) { return static_cast<uint16_t>(h == 0 ? reg : reg >> 16); };
      am[g][2 * t + h] = Decode(half(w[0]), type);
      am[g + 8][2 * t + h] = Decode(half(w[1]), type);
      am[g][2 * t + 8 + h] = Decode(half(w[2]), type);
      am[g + 8][2 * t + 8 + h] = Decode(half(w[3]), type);
      bm[2 * t + h][g] = Decode(half(w[4]), type);
      bm[2 * t + 8 + h][g] = Decode(half(w[5]), type);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4;
    const int t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e >= 2 ? 8 : 0);
      const int col = 2 * t + (e & 1);
      float c;
      std::memcpy(&c, &all[lane].w[6 + e], 4);
      double acc = c;
      for (int k = 0; k < 16; ++k) acc += am[row][k] * bm[k][col];
      const float d = static_cast<float>(acc);
      std::memcpy(&all[lane].w[e], &d, 4);
    }
  }
}

inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, ComputeType type) {
  emu::Slot s;
  s.op = type == ComputeType::kFloat16 ? emu::kOpMmaF16 : emu::kOpMmaBF16;
  for (int i = 0; i < 4; ++i) s.w[i] = a[i];
  s.w[4] = b0;
  s.w[5] = b1;
  std::memcpy(&s.w[6], d, sizeof(d));
  const emu::Slot* all = emu::WarpExchange(s, &MmaCombine);
  std::memcpy(d, all[emu::LaneId()].w, sizeof(d));
}

}  // namespace emu_impl

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  emu_impl::LdMatrix(r, addr, false);
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  emu_impl::LdMatrix(r, addr, true);
}

template <ComputeType kType>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  emu_impl::Mma(d, a, b0, b1, kType);
}

// --- Identical to kernels/cuda/device_utils.h from here on (shim_check.sh compares). ---
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
