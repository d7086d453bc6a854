// The paged attention and scatter kernels paged_attention_emu_test.cc runs, launched on the
// emulator (paged_emu_kernels.cc) behind plain functions: the test's cases include no kernel
// body, so that each mutant (make_mutant.sh) links them as they are and compiles only
// paged_emu_kernels.cc against its copy of kernels/cuda/.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_PAGED_EMU_KERNELS_H_
#define ATTNSERVE_TESTS_CUDA_EMU_PAGED_EMU_KERNELS_H_

#include <cstdint>

#include "kernels/paged_attention_params.h"

namespace attnserve::kernels::cuda {

// Paged attention over `p` as paged_attention.cu launches it (its split and combine kernels, the
// grid and shared memory from paged_attention_shape.h), with an exact-size, NaN-filled workspace.
// max_q, max_kv: the batch's largest q_len and kv_len.
void LaunchPaged(const PagedAttentionParams& p, int max_q, int max_kv);

// The scatter of n new rows (k [n, D], v [n, Dv] of Word, 2 or 4 bytes) to their places `rows`
// in the pages, on `blocks` blocks of PagedScatterThreads() threads.
template <typename Word>
void LaunchPagedScatter(const Word* k_src, const Word* v_src, const int64_t* rows, int64_t n, int D,
                        int Dv, Word* k_pages, Word* v_pages, unsigned blocks);
int PagedScatterThreads();

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_TESTS_CUDA_EMU_PAGED_EMU_KERNELS_H_
