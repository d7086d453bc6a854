// Kernel selection: padded head dim (32, 64, ..., 256 on tensor cores; else generic) x operand
// type. Causal, masks, key lengths and GQA branch at run time inside the kernels.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/flash_decode_shape.h"
#include "kernels/cuda/flash_fwd.h"

namespace attnserve::kernels::cuda {
namespace {

bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

int TensorCoreHeadDim(const FlashFwdParams& p) {
  if (p.head_dim < 8 || p.head_dim % 8 != 0 || p.v_head_dim < 8 || p.v_head_dim % 8 != 0) return 0;
  const int width = std::max(p.head_dim, p.v_head_dim);
  for (const int dim : kTensorCoreHeadDims) {
    if (width <= dim) return dim;
  }
  return 0;
}

FlashPath SelectFlashPath(const FlashFwdParams& p) {
  const bool tensor_core_layout =
      Aligned(p.q, 16) && Aligned(p.k, 16) && Aligned(p.v, 16) && Aligned(p.o, 8) &&
      p.q_row_stride % 8 == 0 && p.q_head_stride % 8 == 0 && p.k_row_stride % 8 == 0 &&
      p.k_head_stride % 8 == 0 && p.v_row_stride % 8 == 0 && p.v_head_stride % 8 == 0 &&
      p.o_row_stride % 2 == 0 && p.o_head_stride % 2 == 0 &&
      (p.mask == nullptr ||
       (Aligned(p.mask, 4) && (p.mask_col_stride == 0 || p.mask_col_stride == 1)));
  if (tensor_core_layout && TensorCoreHeadDim(p) != 0) return FlashPath::kTensorCore;
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
    case FlashPath::kTensorCore:
      return "tensor-core";
    case FlashPath::kGeneric:
      return "generic";
    case FlashPath::kUnsupported:
      return "unsupported";
  }
  return "?";
}

// A switch on the padded head dim, then the type and whether p has ScoreMods (as FlashAttention's
// static_switch.h dispatch): the plain instantiation has no register to spare for a window
// (flash_fwd_kernel.h), and attention without mods is the common case.
template <ComputeType kType, bool kMods>
GpuStatus RunTensorCore(const FlashFwdParams& p, cudaStream_t stream) {
  switch (TensorCoreHeadDim(p)) {
    case 32:
      return RunFlashFwdHdim<32, kType, kMods>(p, stream);
    case 64:
      return RunFlashFwdHdim<64, kType, kMods>(p, stream);
    case 96:
      return RunFlashFwdHdim<96, kType, kMods>(p, stream);
    case 128:
      return RunFlashFwdHdim<128, kType, kMods>(p, stream);
    case 160:
      return RunFlashFwdHdim<160, kType, kMods>(p, stream);
    case 192:
      return RunFlashFwdHdim<192, kType, kMods>(p, stream);
    case 256:
      return RunFlashFwdHdim<256, kType, kMods>(p, stream);
  }
  return {"flash forward: no tensor-core instantiation for head_dim " + std::to_string(p.head_dim) +
          ", v_head_dim " + std::to_string(p.v_head_dim)};
}

GpuStatus FlashForward(const FlashFwdParams& p, ComputeType type, cudaStream_t stream) {
  const bool fp16 = type == ComputeType::kFloat16;
  switch (SelectFlashPath(p)) {
    case FlashPath::kTensorCore:
      if (p.has_score_mods()) {
        return fp16 ? RunTensorCore<ComputeType::kFloat16, true>(p, stream)
                    : RunTensorCore<ComputeType::kBFloat16, true>(p, stream);
      }
      return fp16 ? RunTensorCore<ComputeType::kFloat16, false>(p, stream)
                  : RunTensorCore<ComputeType::kBFloat16, false>(p, stream);
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
