// The launches of flash_emu_kernels.h: the kernel headers' bodies compiled as host C++ and run by
// the emulator (emu.h).
//
// ATTNSERVE_EMU_ONLY_KERNEL=n (a Kernel's number) builds only that kernel: a mutant's copy of this
// file (tests/cuda_emu/CMakeLists.txt) compiles just the kernel its filter runs; LaunchKernel fails
// the test for any other.
#include "tests/cuda_emu/flash_emu_kernels.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "kernels/cuda/flash_decode_kernel.h"
#include "kernels/cuda/flash_decode_shape.h"
#include "kernels/cuda/flash_fwd_generic_kernel.h"
#include "kernels/cuda/flash_fwd_kernel.h"
#include "kernels/cuda/flash_grid.h"
#include "tests/cuda_emu/attention_case.h"
#include "tests/cuda_emu/emu.h"

#ifndef ATTNSERVE_EMU_ONLY_KERNEL
#define ATTNSERVE_EMU_ONLY_KERNEL -1
#endif
// A bit per Kernel number (ATTNSERVE_EMU_HEAD_DIMS in CMakeLists.txt); all by default.
#ifndef ATTNSERVE_EMU_KERNELS
#define ATTNSERVE_EMU_KERNELS 0x1ff
#endif

namespace attnserve::kernels::cuda {
namespace {

constexpr bool Built(Kernel k) {
  const int n = static_cast<int>(k);
  return ATTNSERVE_EMU_ONLY_KERNEL < 0 ? ((ATTNSERVE_EMU_KERNELS >> n) & 1) != 0
                                       : ATTNSERVE_EMU_ONLY_KERNEL == n;
}

template <typename Traits>
void LaunchTensorCore(const FlashFwdParams& p) {
  const int num_m_blocks = (p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (num_m_blocks == 0 || p.num_seqs == 0 || p.num_heads == 0) return;
  const int64_t blocks = FlashGridBlocks(num_m_blocks, p.num_seqs, p.num_heads);
  ASSERT_LE(blocks, kMaxGridX);
  emu::Launch(dim3(static_cast<unsigned>(blocks)), dim3(Traits::kNThreads), Traits::kSmemBytes,
              [&] { FlashFwdKernel<Traits>(p, num_m_blocks); });
}

template <typename Element>
void LaunchGeneric(const FlashFwdParams& p) {
  const int blocks_per_seq = (p.max_seqlen_q + kGenericWarps - 1) / kGenericWarps;
  if (blocks_per_seq == 0 || p.num_seqs == 0 || p.num_heads == 0) return;
  const size_t smem = kGenericWarps * p.head_dim * sizeof(float);
  const int64_t blocks = FlashGridBlocks(blocks_per_seq, p.num_seqs, p.num_heads);
  ASSERT_LE(blocks, kMaxGridX);
  emu::Launch(dim3(static_cast<unsigned>(blocks)), dim3(kGenericWarps * 32), smem,
              [&] { FlashFwdGenericKernel<Element>(p, blocks_per_seq); });
}

// The decode path's two kernels, as flash_decode.cu launches them; the workspace is exact-size
// and NaN-filled, so a slot read before it is written shows.
template <typename Element, int kGroup>
void LaunchDecodeGroup(const FlashFwdParams& p) {
  int max_k = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    max_k = std::max(max_k, p.cu_seqlens_k[s + 1] - p.cu_seqlens_k[s]);
  }
  const int max_splits = DecodeSplits(max_k);
  if (max_splits == 0 || p.num_seqs == 0 || p.num_heads == 0) return;
  const size_t n =
      size_t(p.num_seqs) * p.num_kv_heads * max_splits * DecodeSlotFloats(kGroup, p.v_head_dim);
  std::unique_ptr<float[]> ws(new float[n]);
  std::fill(ws.get(), ws.get() + n, kNaN);
  const int64_t split_blocks = int64_t{p.num_seqs} * p.num_kv_heads * max_splits;
  emu::Launch(dim3(static_cast<unsigned>(split_blocks)), dim3(kDecodeWarps * 32),
              DecodeSplitSmemBytes(kGroup, p.head_dim, p.v_head_dim),
              [&] { FlashDecodeSplitKernel<Element, kGroup>(p, max_splits, ws.get()); });
  emu::Launch(dim3(static_cast<unsigned>(p.num_seqs * p.num_heads)), dim3(kDecodeMaxVHeadDim), 0,
              [&] { FlashDecodeCombineKernel<kGroup>(p, max_splits, ws.get()); });
}

template <typename Element>
void LaunchDecode(const FlashFwdParams& p) {
  ASSERT_LE(p.max_seqlen_q, 1);
  ASSERT_LE(p.v_head_dim, kDecodeMaxVHeadDim);
  switch (p.num_heads / p.num_kv_heads) {
    case 1:
      return LaunchDecodeGroup<Element, 1>(p);
    case 2:
      return LaunchDecodeGroup<Element, 2>(p);
    case 4:
      return LaunchDecodeGroup<Element, 4>(p);
    case 8:
      return LaunchDecodeGroup<Element, 8>(p);
  }
  FAIL() << "group size not supported by the decode path";
}

template <int kHeadDim>
void LaunchTensorCoreDim(ComputeType type, const FlashFwdParams& p) {
  // The same check as the dispatch's TensorCoreHeadDim (flash_fwd_dispatch.cc): both head dims
  // multiples of 8 that fit the padded width.
  ASSERT_TRUE(p.head_dim % 8 == 0 && p.v_head_dim % 8 == 0 && p.head_dim <= kHeadDim &&
              p.v_head_dim <= kHeadDim);
  // And the instantiation, plain or with ScoreMods, as FlashForward picks it.
  const bool fp16 = type == ComputeType::kFloat16;
  if (p.has_score_mods()) {
    fp16 ? LaunchTensorCore<FlashFwdTraitsHdim<kHeadDim, ComputeType::kFloat16, true>>(p)
         : LaunchTensorCore<FlashFwdTraitsHdim<kHeadDim, ComputeType::kBFloat16, true>>(p);
  } else {
    fp16 ? LaunchTensorCore<FlashFwdTraitsHdim<kHeadDim, ComputeType::kFloat16>>(p)
         : LaunchTensorCore<FlashFwdTraitsHdim<kHeadDim, ComputeType::kBFloat16>>(p);
  }
}

// One kernel, in a template so that a kernel this object does not build is never instantiated.
template <Kernel kKernel>
void Launch(ComputeType type, const FlashFwdParams& p) {
  if constexpr (!Built(kKernel)) {
    FAIL() << KernelName(kKernel) << " is not built into this binary (ATTNSERVE_EMU_ONLY_KERNEL "
           << ATTNSERVE_EMU_ONLY_KERNEL << ", ATTNSERVE_EMU_HEAD_DIMS' mask "
           << ATTNSERVE_EMU_KERNELS << ")";
  } else if constexpr (kKernel == Kernel::kDecode) {
    return type == ComputeType::kFloat16 ? LaunchDecode<__half>(p) : LaunchDecode<__nv_bfloat16>(p);
  } else if constexpr (kKernel == Kernel::kGeneric) {
    return type == ComputeType::kFloat16 ? LaunchGeneric<__half>(p)
                                         : LaunchGeneric<__nv_bfloat16>(p);
  } else {
    return LaunchTensorCoreDim<kTensorCoreHeadDims[static_cast<int>(kKernel)]>(type, p);
  }
}

}  // namespace

void LaunchKernel(Kernel kernel, ComputeType type, const FlashFwdParams& p) {
  switch (kernel) {
    case Kernel::kHdim32:
      return Launch<Kernel::kHdim32>(type, p);
    case Kernel::kHdim64:
      return Launch<Kernel::kHdim64>(type, p);
    case Kernel::kHdim96:
      return Launch<Kernel::kHdim96>(type, p);
    case Kernel::kHdim128:
      return Launch<Kernel::kHdim128>(type, p);
    case Kernel::kHdim160:
      return Launch<Kernel::kHdim160>(type, p);
    case Kernel::kHdim192:
      return Launch<Kernel::kHdim192>(type, p);
    case Kernel::kHdim256:
      return Launch<Kernel::kHdim256>(type, p);
    case Kernel::kGeneric:
      return Launch<Kernel::kGeneric>(type, p);
    case Kernel::kDecode:
      return Launch<Kernel::kDecode>(type, p);
  }
}

}  // namespace attnserve::kernels::cuda
