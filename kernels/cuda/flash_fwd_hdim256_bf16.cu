// One head dim and type per file so that nvcc builds them in parallel (FlashAttention's
// pattern): the plain and the ScoreMods instantiation (flash_fwd_kernel.h).
#include "kernels/cuda/flash_fwd_launch_template.h"

namespace attnserve::kernels::cuda {

template <>
GpuStatus RunFlashFwdHdim<256, ComputeType::kBFloat16, false>(const FlashFwdParams& p,
                                                              cudaStream_t stream) {
  return RunFlashFwd<FlashFwdTraitsHdim<256, ComputeType::kBFloat16>>(p, stream);
}

template <>
GpuStatus RunFlashFwdHdim<256, ComputeType::kBFloat16, true>(const FlashFwdParams& p,
                                                             cudaStream_t stream) {
  return RunFlashFwd<FlashFwdTraitsHdim<256, ComputeType::kBFloat16, true>>(p, stream);
}

}  // namespace attnserve::kernels::cuda
