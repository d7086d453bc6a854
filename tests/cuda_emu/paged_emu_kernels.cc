// The launches of paged_emu_kernels.h: the kernel headers' bodies compiled as host C++ and run by
// the emulator (emu.h), as paged_attention.cu launches them.
#include "tests/cuda_emu/paged_emu_kernels.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include "kernels/cuda/paged_attention_kernel.h"
#include "kernels/cuda/paged_attention_shape.h"
#include "kernels/cuda/paged_scatter_kernel.h"
#include "tests/cuda_emu/emu.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename Element, int kOut>
void LaunchPagedT(const PagedAttentionParams& p, int max_q, int max_kv) {
  const int max_splits = PagedSplits(max_kv);
  const int row_blocks = PagedRowBlocks(max_q, p.num_heads / p.num_kv_heads);
  const int64_t combine_blocks = int64_t{p.num_seqs} * p.num_kv_heads * row_blocks;
  const size_t ws_floats =
      static_cast<size_t>(PagedWorkspaceBytes(p.total_q, p.num_heads, max_kv, p.v_head_dim) / 4);
  std::unique_ptr<float[]> ws(new float[ws_floats]);
  std::fill(ws.get(), ws.get() + ws_floats, kNaN);
  emu::Launch(dim3(static_cast<unsigned>(combine_blocks * max_splits)), dim3(kPagedWarps * 32),
              PagedSplitSmemBytes(p.head_dim, p.v_head_dim), [&] {
                PagedAttentionSplitKernel<Element, kOut>(p, row_blocks, max_splits, ws.get());
              });
  emu::Launch(dim3(static_cast<unsigned>(combine_blocks)), dim3(kPagedWarps * 32), 0, [&] {
    PagedAttentionCombineKernel<Element>(p, p.window_left, row_blocks, max_splits, ws.get());
  });
}

template <typename Element>
void LaunchPagedWidth(const PagedAttentionParams& p, int max_q, int max_kv) {
  if (PagedOutPerLane(p.v_head_dim) == 4) return LaunchPagedT<Element, 4>(p, max_q, max_kv);
  LaunchPagedT<Element, 8>(p, max_q, max_kv);
}

}  // namespace

void LaunchPaged(const PagedAttentionParams& p, int max_q, int max_kv) {
  switch (p.dtype) {
    case DType::kFloat16:
      return LaunchPagedWidth<__half>(p, max_q, max_kv);
    case DType::kBFloat16:
      return LaunchPagedWidth<__nv_bfloat16>(p, max_q, max_kv);
    default:
      return LaunchPagedWidth<float>(p, max_q, max_kv);
  }
}

template <typename Word>
void LaunchPagedScatter(const Word* k_src, const Word* v_src, const int64_t* rows, int64_t n, int D,
                        int Dv, Word* k_pages, Word* v_pages, unsigned blocks) {
  emu::Launch(dim3(blocks), dim3(kPagedScatterThreads), 0, [&] {
    PagedScatterRowsKernel<Word>(k_src, v_src, rows, n, D, Dv, k_pages, v_pages);
  });
}
template void LaunchPagedScatter<uint16_t>(const uint16_t*, const uint16_t*, const int64_t*,
                                           int64_t, int, int, uint16_t*, uint16_t*, unsigned);
template void LaunchPagedScatter<uint32_t>(const uint32_t*, const uint32_t*, const int64_t*,
                                           int64_t, int, int, uint32_t*, uint32_t*, unsigned);

int PagedScatterThreads() { return kPagedScatterThreads; }

}  // namespace attnserve::kernels::cuda
