// The one parameter struct of the CUDA attention kernels (FlashAttention's flash.h pattern):
// device pointers, strides in elements (not bytes), dimensions and flags. The host code fills
// it in one place (cuda_backend_internal.h, FlashParamsFor) from kernels::AttentionParams after the
// inputs have been copied to the device; benchmarks and tests fill it for device buffers they
// own. No CUDA headers here: plain C++ includes it too.
//
// Layout: a variable-length batch of `num_seqs` sequences packed along the token dimension, as
// in FlashAttention's varlen API. Sequence s owns query tokens [cu_seqlens_q[s],
// cu_seqlens_q[s+1]) and key tokens [cu_seqlens_k[s], cu_seqlens_k[s+1]); element
// (token t, head h, column c) of q lives at q + t * q_row_stride + h * q_head_stride + c (the
// last dimension is contiguous). Every (sequence, head, block of query rows) is computed by one
// thread block over the whole key range in a fixed order, with no split of the keys: a
// sequence's output bits depend only on that sequence (batch invariance, backend.h).
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_PARAMS_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_PARAMS_H_

#include <cstdint>

#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {

// The tensor-core operand type of q, k and v. Output and accumulation are always float32.
enum class ComputeType : uint8_t { kFloat16, kBFloat16 };

inline const char* ComputeTypeName(ComputeType t) {
  return t == ComputeType::kFloat16 ? "float16" : "bfloat16";
}

// The largest v_head_dim of the fused kernels (the generic one keeps v_head_dim / 32 output
// columns per lane in registers); above it the backend takes the cuBLAS path.
inline constexpr int kGenericMaxVHeadDim = 256;

// The padded head dims with a tensor-core instantiation of flash_fwd_kernel.h (one .cu file per
// dim and type, flash_fwd_hdim*.cu): a call runs on the smallest that holds both head_dim and
// v_head_dim, zero-padded (flash_fwd.h: TensorCoreHeadDim). FlashAttention's set less 224: no
// block shape of hdim 224 compiled without spilling (kernel_traits.h), so 200-224 run on 256.
inline constexpr int kTensorCoreHeadDims[] = {32, 64, 96, 128, 160, 192, 256};

struct FlashFwdParams {
  // Inputs in ComputeType: q [total_q, num_heads, head_dim], k [total_k, num_kv_heads, head_dim],
  // v [total_k, num_kv_heads, v_head_dim] (strided as above).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t k_row_stride = 0, k_head_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0;

  // Output, float32 [total_q, num_heads, v_head_dim].
  float* o = nullptr;
  int64_t o_row_stride = 0, o_head_stride = 0;

  // Sequences: cu_seqlens_q / cu_seqlens_k [num_seqs + 1], device int32, starting at 0.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // Optional device int32 [num_seqs]: keys at j >= key_lengths[s] are blocked (the sequence's
  // kv_len still counts for causal alignment and the uniform fallback). nullptr = none.
  const int* key_lengths = nullptr;
  int num_seqs = 0;
  int max_seqlen_q = 0;  // max over sequences of the query length (sizes the grid)

  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // REQUIRES num_heads % num_kv_heads == 0 (GQA: head h reads h / group)
  int head_dim = 0;      // of q and k
  int v_head_dim = 0;    // of v and o

  float scale = 1.0f;       // multiplies q.k
  float scale_log2 = 1.0f;  // scale * log2(e): the kernels work in exp2 units
  bool causal = false;      // bottom-right aligned per sequence: j <= i + kv_len - q_len

  // ScoreMods (attention_params.h): the window, soft-capping and ALiBi. With softcap or ALiBi
  // a score is modified in linear units (scale·q·k, ModifyScore) and then taken to log2 units.
  // alibi_slopes: device float32 [num_heads], or nullptr.
  KeyWindow window;
  float softcap = 0.0f;
  const float* alibi_slopes = nullptr;
  ATTNSERVE_HD bool modifies_scores() const { return softcap != 0.0f || alibi_slopes != nullptr; }
  // Any of them: the tensor-core kernel's kMods instantiation runs (flash_fwd_kernel.h).
  ATTNSERVE_HD bool has_score_mods() const {
    return window.left >= 0 || window.right >= 0 || modifies_scores();
  }

  // Optional boolean mask (0 = blocked), element (s, h, i, j) at
  // mask + s * mask_batch_stride + h * mask_head_stride + i * mask_row_stride + j * mask_col_stride
  // (stride 0 broadcasts). nullptr = none.
  const uint8_t* mask = nullptr;
  int64_t mask_batch_stride = 0, mask_head_stride = 0, mask_row_stride = 0, mask_col_stride = 0;

  // Optional float32 [num_seqs, num_kv_heads, v_head_dim]: the mean of each sequence's values
  // over all of its kv_len keys, written to rows with no allowed key (reference semantics).
  // REQUIRES non-null whenever such a row can occur (mask, key_lengths, or causal with
  // q_len > kv_len); when null such rows are written as zeros.
  const float* v_mean = nullptr;
};

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_PARAMS_H_
