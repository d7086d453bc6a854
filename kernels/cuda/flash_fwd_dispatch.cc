// Kernel selection: head_dim (64, 128, generic) x operand type. Causal, masks, key lengths and
// GQA branch at run time inside the kernels.
#include <cstdint>

#include "kernels/cuda/flash_decode_shape.h"
#include "kernels/cuda/flash_fwd.h"

namespace attnserve::kernels::cuda {
namespace {

bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

FlashPath SelectFlashPath(const FlashFwdParams& p) {
  const bool tensor_core_layout =
      Aligned(p.q, 16) && Aligned(p.k, 16) && Aligned(p.v, 16) && Aligned(p.o, 8) &&
      p.q_row_stride % 8 == 0 && p.q_head_stride % 8 == 0 && p.k_row_stride % 8 == 0 &&
      p.k_head_stride % 8 == 0 && p.v_row_stride % 8 == 0 && p.v_head_stride % 8 == 0 &&
      p.o_row_stride % 2 == 0 && p.o_head_stride % 2 == 0;
  if (tensor_core_layout && p.head_dim == p.v_head_dim) {
    if (p.head_dim == 64) return FlashPath::kHdim64;
    if (p.head_dim == 128) return FlashPath::kHdim128;
  }
  if (p.v_head_dim <= kGenericMaxVHeadDim && p.head_dim >= 1) return FlashPath::kGeneric;
  return FlashPath::kUnsupported;
}

bool DecodeSupported(const FlashFwdParams& p) {
  if (p.num_kv_heads < 1 || p.num_heads % p.num_kv_heads != 0) return false;
  const int group = p.num_heads / p.num_kv_heads;
  return p.max_seqlen_q <= 1 && (group == 1 || group == 2 || group == 4 || group == 8) &&
         p.v_head_dim >= 1 && p.v_head_dim <= kDecodeMaxVHeadDim && p.head_dim >= 1 &&
         p.head_dim <= 256;
}

size_t FlashDecodeWorkspaceBytes(const FlashFwdParams& p, int max_seqlen_k) {
  const int group = p.num_kv_heads > 0 ? p.num_heads / p.num_kv_heads : 0;
  return sizeof(float) * static_cast<size_t>(p.num_seqs) * p.num_kv_heads *
         DecodeSplits(max_seqlen_k) * DecodeSlotFloats(group, p.v_head_dim);
}

const char* FlashPathName(FlashPath path) {
  switch (path) {
    case FlashPath::kHdim64:
      return "hdim64";
    case FlashPath::kHdim128:
      return "hdim128";
    case FlashPath::kGeneric:
      return "generic";
    case FlashPath::kUnsupported:
      return "unsupported";
  }
  return "?";
}

GpuStatus FlashForward(const FlashFwdParams& p, ComputeType type, cudaStream_t stream) {
  const bool fp16 = type == ComputeType::kFloat16;
  switch (SelectFlashPath(p)) {
    case FlashPath::kHdim64:
      return fp16 ? RunFlashFwdHdim<64, ComputeType::kFloat16>(p, stream)
                  : RunFlashFwdHdim<64, ComputeType::kBFloat16>(p, stream);
    case FlashPath::kHdim128:
      return fp16 ? RunFlashFwdHdim<128, ComputeType::kFloat16>(p, stream)
                  : RunFlashFwdHdim<128, ComputeType::kBFloat16>(p, stream);
    case FlashPath::kGeneric:
      return fp16 ? RunFlashFwdGeneric<ComputeType::kFloat16>(p, stream)
                  : RunFlashFwdGeneric<ComputeType::kBFloat16>(p, stream);
    case FlashPath::kUnsupported:
      break;
  }
  return {"flash forward: v_head_dim " + std::to_string(p.v_head_dim) +
          " is above the fused kernels' limit of " + std::to_string(kGenericMaxVHeadDim)};
}

}  // namespace attnserve::kernels::cuda
