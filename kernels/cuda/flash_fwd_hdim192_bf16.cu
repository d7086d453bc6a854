// One instantiation per file so that nvcc builds them in parallel (FlashAttention's pattern).
#include "kernels/cuda/flash_fwd_launch_template.h"

namespace attnserve::kernels::cuda {

template <>
GpuStatus RunFlashFwdHdim<192, ComputeType::kBFloat16>(const FlashFwdParams& p,
                                                       cudaStream_t stream) {
  return RunFlashFwd<FlashFwdTraitsHdim<192, ComputeType::kBFloat16>>(p, stream);
}

}  // namespace attnserve::kernels::cuda
