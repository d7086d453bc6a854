// Launch code of the attention forward kernels (FlashAttention's flash_fwd_launch_template.h
// pattern). Included only by the per-instantiation .cu files.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_FWD_LAUNCH_TEMPLATE_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_FWD_LAUNCH_TEMPLATE_H_

#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/flash_fwd_generic_kernel.h"
#include "kernels/cuda/flash_fwd_kernel.h"
#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/kernel_traits.h"

namespace attnserve::kernels::cuda {

template <typename Traits>
GpuStatus RunFlashFwd(const FlashFwdParams& p, cudaStream_t stream) {
  const int num_m_blocks = (p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (num_m_blocks == 0 || p.num_seqs == 0 || p.num_heads == 0) return {};
  auto* kernel = &FlashFwdKernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      AllowSharedMemory(kernel, kSmem, "flash forward: raising the shared-memory limit"));
  const int64_t blocks = FlashGridBlocks(num_m_blocks, p.num_seqs, p.num_heads);
  if (blocks > kMaxGridX) return {"flash forward: more than 2^31 - 1 blocks"};
  kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, kSmem, stream>>>(p, num_m_blocks);
  return CudaCheck(cudaGetLastError(), "flash forward: launch");
}

template <typename Element>
GpuStatus RunFlashFwdGenericImpl(const FlashFwdParams& p, cudaStream_t stream) {
  const int blocks_per_seq = (p.max_seqlen_q + kGenericWarps - 1) / kGenericWarps;
  if (blocks_per_seq == 0 || p.num_seqs == 0 || p.num_heads == 0) return {};
  const int smem = kGenericWarps * p.head_dim * static_cast<int>(sizeof(float));
  auto* kernel = &FlashFwdGenericKernel<Element>;
  ATTNSERVE_GPU_RETURN_IF_ERROR(AllowSharedMemory(
      kernel, smem, "generic attention forward: raising the shared-memory limit"));
  const int64_t blocks = FlashGridBlocks(blocks_per_seq, p.num_seqs, p.num_heads);
  if (blocks > kMaxGridX) return {"generic attention forward: more than 2^31 - 1 blocks"};
  kernel<<<static_cast<unsigned>(blocks), kGenericWarps * 32, smem, stream>>>(p, blocks_per_seq);
  return CudaCheck(cudaGetLastError(), "generic attention forward: launch");
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_FWD_LAUNCH_TEMPLATE_H_
