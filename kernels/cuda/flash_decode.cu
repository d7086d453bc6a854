// Launch code of the decode-shaped path (flash_decode_kernel.h), both operand types.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "kernels/cuda/flash_decode_kernel.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/flash_grid.h"

namespace attnserve::kernels::cuda {
namespace {

template <typename Element, int kGroup>
GpuStatus Launch(const FlashFwdParams& p, int max_seqlen_k, void* workspace, cudaStream_t stream) {
  const int max_splits = DecodeSplits(max_seqlen_k);
  if (max_splits == 0 || p.num_seqs == 0 || p.num_heads == 0) return {};
  float* partial = static_cast<float*>(workspace);
  const int64_t split_blocks = int64_t{p.num_seqs} * p.num_kv_heads * max_splits;
  const int64_t combine_blocks = int64_t{p.num_seqs} * p.num_heads;
  if (split_blocks > kMaxGridX || combine_blocks > kMaxGridX) {
    return {"decode attention: more than 2^31 - 1 blocks"};
  }
  const int smem = DecodeSplitSmemBytes(kGroup, p.head_dim, p.v_head_dim);
  auto* split_kernel = &FlashDecodeSplitKernel<Element, kGroup>;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      AllowSharedMemory(split_kernel, smem, "decode attention: raising the shared-memory limit"));
  split_kernel<<<static_cast<unsigned>(split_blocks), kDecodeWarps * 32, smem, stream>>>(
      p, max_splits, partial);
  ATTNSERVE_GPU_RETURN_IF_ERROR(CudaCheck(cudaGetLastError(), "decode attention: split launch"));
  FlashDecodeCombineKernel<kGroup>
      <<<static_cast<unsigned>(combine_blocks), kDecodeMaxVHeadDim, 0, stream>>>(p, max_splits,
                                                                                 partial);
  return CudaCheck(cudaGetLastError(), "decode attention: combine launch");
}

template <typename Element>
GpuStatus LaunchForGroup(const FlashFwdParams& p, int max_seqlen_k, void* workspace,
                         cudaStream_t stream) {
  switch (p.num_heads / p.num_kv_heads) {
    case 1:
      return Launch<Element, 1>(p, max_seqlen_k, workspace, stream);
    case 2:
      return Launch<Element, 2>(p, max_seqlen_k, workspace, stream);
    case 4:
      return Launch<Element, 4>(p, max_seqlen_k, workspace, stream);
    case 8:
      return Launch<Element, 8>(p, max_seqlen_k, workspace, stream);
  }
  return {"decode attention: group size " + std::to_string(p.num_heads / p.num_kv_heads) +
          " not in {1, 2, 4, 8}"};
}

}  // namespace

GpuStatus FlashDecode(const FlashFwdParams& p, ComputeType type, int max_seqlen_k, void* workspace,
                      cudaStream_t stream) {
  if (!DecodeSupported(p)) return {"decode attention: shape not supported (DecodeSupported)"};
  return type == ComputeType::kFloat16
             ? LaunchForGroup<__half>(p, max_seqlen_k, workspace, stream)
             : LaunchForGroup<__nv_bfloat16>(p, max_seqlen_k, workspace, stream);
}

}  // namespace attnserve::kernels::cuda
