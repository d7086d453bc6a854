// The attention kernels flash_emu_test.cc runs, launched on the emulator (flash_emu_kernels.cc),
// behind a plain function: the test's cases include no kernel body, so that each mutant
// (make_mutant.sh) links them as they are and compiles only flash_emu_kernels.cc against its
// copy of kernels/cuda/.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_FLASH_EMU_KERNELS_H_
#define ATTNSERVE_TESTS_CUDA_EMU_FLASH_EMU_KERNELS_H_

#include <string>

#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/kernel_traits.h"

namespace attnserve::kernels::cuda {

// The tensor-core kernel's instantiations (kTensorCoreHeadDims), the generic and the decode
// kernel. The numbers are ATTNSERVE_EMU_ONLY_KERNEL's (flash_emu_kernels.cc).
enum class Kernel {
  kHdim32 = 0,
  kHdim64 = 1,
  kHdim96 = 2,
  kHdim128 = 3,
  kHdim160 = 4,
  kHdim192 = 5,
  kHdim256 = 6,
  kGeneric = 7,
  kDecode = 8
};

// The padded head dim of a tensor-core kernel; 0 for the others.
inline int TensorCoreDim(Kernel k) {
  return k < Kernel::kGeneric ? kTensorCoreHeadDims[static_cast<int>(k)] : 0;
}
inline std::string KernelName(Kernel k) {
  if (k == Kernel::kGeneric) return "generic";
  if (k == Kernel::kDecode) return "decode";
  return "hdim" + std::to_string(TensorCoreDim(k));
}

// Runs `kernel` in `type` over p, as the launch code of kernels/cuda/ would (flash_fwd_launch_
// template.h, flash_decode.cu: the same block shape, dynamic shared memory and grid, from the same
// traits and helpers), on the emulator. Failures are gtest failures of the calling test.
void LaunchKernel(Kernel kernel, ComputeType type, const FlashFwdParams& p);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_TESTS_CUDA_EMU_FLASH_EMU_KERNELS_H_
