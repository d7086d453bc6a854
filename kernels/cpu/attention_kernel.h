// The ISA-neutral interface of the fused attention kernel (the "launch" side of the split
// body / launch / instantiation, as FlashAttention splits its CUDA kernels).
//
// One task computes one block of kQueryBlock query rows of one (batch entry, query head) of an
// AttentionParams. The body is attention_kernel_impl.h, compiled once per instruction set in its
// own translation unit (attention_avx512.cc, attention_avx2.cc, attention_generic.cc) with
// per-file compiler flags; cpu_backend.cc picks one table at run time.
//
// Batch invariance: a task's arithmetic depends only on the problem it belongs to (its shape,
// options and data) and on the instruction set, never on the thread that runs it or on other
// tasks: tile sizes are the constants below, and every reduction runs in a fixed order.
#ifndef ATTNSERVE_KERNELS_CPU_ATTENTION_KERNEL_H_
#define ATTNSERVE_KERNELS_CPU_ATTENTION_KERNEL_H_

#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::cpu {

// Query rows per task. Every vector of the kernel runs across these rows (one query row per
// lane), so all softmax statistics are vertical vector operations, never horizontal sums.
inline constexpr int kQueryBlock = 64;
// Keys per tile of the online softmax.
inline constexpr int kKeyTile = 128;

// The instruction sets with a kernel. kAuto picks the best one the CPU supports.
enum class Isa { kAuto, kGeneric, kAvx2, kAvx512 };

// One instantiation of the kernel.
struct AttentionKernel {
  Isa isa;
  const char* name;  // "avx512", "avx2", "generic"
  // Floats of scratch one task needs for head dims (D, Dv); the buffer passed to Run must hold
  // that many floats and be 64-byte aligned.
  int64_t (*scratch_floats)(int head_dim, int v_head_dim);
  // Computes rows [i0, min(i0 + kQueryBlock, q_len)) of (b, h) of p: writes out, and the
  // weights rows when p.weights != nullptr.
  void (*run)(const AttentionParams& p, int b, int h, int i0, float* scratch);
};

// The per-ISA tables, constant-initialised data defined in the per-ISA translation units (data,
// not functions, so nothing compiled with wider instructions runs before dispatch). Calling into
// a table whose instructions the CPU lacks is undefined: check cpu_features.h first.
extern const AttentionKernel kGenericAttentionKernel;
extern const AttentionKernel kAvx2AttentionKernel;
extern const AttentionKernel kAvx512AttentionKernel;

// ---------------------------------------------------------------------------------------------
// The bfloat16 kernel (attention_bf16.cc): Q, K, V and P as bfloat16 operands, float32
// accumulation and a float32 online softmax. Fused path only (no weights output), head dims up to
// kMaxBf16HeadDim.

// The 16-bit compute paths. kAuto picks the best one the CPU supports; kNone computes every
// request on the float32 path (as a CPU without AVX512_BF16 does).
enum class Bf16Isa { kAuto, kNone, kAvx512Bf16, kAmx };

inline constexpr int kMaxBf16HeadDim = 512;

struct Bf16AttentionKernel {
  Bf16Isa isa;
  const char* name;  // "amx_bf16", "avx512_bf16"
  // Bytes of K and V of one (batch entry, kv head) of p, packed into the layouts the products
  // read; Pack writes them (64-byte aligned buffer). Each (b, kv head) is packed once per call,
  // before the tasks that read it.
  int64_t (*packed_bytes)(const AttentionParams& p);
  void (*pack)(const AttentionParams& p, int b, int kv_head, void* packed);
  // Bytes of scratch one task needs (64-byte aligned).
  int64_t (*scratch_bytes)(int head_dim, int v_head_dim);
  // Rows [i0, min(i0 + kQueryBlock, q_len)) of (b, h) of p, from the packed K and V of
  // (b, h / group). REQUIRES: p.weights == nullptr, head dims <= kMaxBf16HeadDim.
  void (*run)(const AttentionParams& p, int b, int h, int i0, const void* packed, void* scratch);
  // n elements of `type` (FLOAT32, FLOAT16, BFLOAT16) at src to bfloat16 (round to nearest
  // even), vectorised: the projections' input rows.
  void (*to_bf16)(DType type, const void* src, int n, uint16_t* dst);
};

extern const Bf16AttentionKernel kAmxAttentionKernel;
extern const Bf16AttentionKernel kAvx512Bf16AttentionKernel;

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_ATTENTION_KERNEL_H_
