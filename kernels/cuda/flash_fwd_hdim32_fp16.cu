// One instantiation per file so that nvcc builds them in parallel (FlashAttention's pattern).
#include "kernels/cuda/flash_fwd_launch_template.h"

namespace attnserve::kernels::cuda {

template <>
GpuStatus RunFlashFwdHdim<32, ComputeType::kFloat16>(const FlashFwdParams& p, cudaStream_t stream) {
  return RunFlashFwd<FlashFwdTraitsHdim<32, ComputeType::kFloat16>>(p, stream);
}

}  // namespace attnserve::kernels::cuda
