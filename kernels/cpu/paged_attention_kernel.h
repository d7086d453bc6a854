// The ISA-neutral interface of the CPU paged attention kernel (decode sessions;
// kernels/paged_attention_params.h). The body is paged_attention_impl.h, compiled once per
// instruction set in its own translation unit (paged_attention_avx512.cc, paged_attention_avx2.cc,
// paged_attention_generic.cc); CpuBackend::PagedAttention (paged_attention.cc) picks the table of
// the backend's Isa and schedules the tasks.
//
// The arithmetic. A task works on one (sequence, kv head) and a block of that sequence's query
// rows, together with every query head of the GQA group (rows x group "row-heads"), so each K/V
// page is read once per block. Keys are cut at fixed multiples of kPagedSplitKeys; for each split
// the task computes the split-local softmax state of every row-head (max m, sum l of
// exp(s - m), unnormalised output o = sum exp(s - m) v), vectorised over D, float32
// throughout. The splits are then folded in key order, from the empty state:
//
//   M' = max(M, m);  a = exp(M - M'), b = exp(m - M');  L' = L a + l b;  O' = O a + o b
//
// and out = O / L, lse = M + log L. A row's split-local state depends only on its own query, the
// split's keys and the ISA (keys past the row's causal limit add exact zeros), and the fold runs
// in the same order whoever runs it, so a row's bits depend neither on the other sequences of the
// call, nor on the thread count, nor on how its own sequence's rows are blocked (a decode step
// gives the bits the same row gets inside a longer prefill). They do depend on the ISA.
//
// Two ways to run the splits, same bits:
//   in one task   Run with `partial` == nullptr folds the splits in order itself and writes out
//                 (and lse): prefill chunks, cut into blocks of rows, and short sequences;
//   in parallel   Run with `partial` != nullptr computes the states of a few consecutive splits
//                 into `partial`, one after another, and Combine folds a sequence's partials in
//                 split order and writes out (decode, where the keys are the only parallelism a
//                 sequence has).
#ifndef ATTNSERVE_KERNELS_CPU_PAGED_ATTENTION_KERNEL_H_
#define ATTNSERVE_KERNELS_CPU_PAGED_ATTENTION_KERNEL_H_

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels::cpu {

// One task: query rows [row0, row0 + rows) of sequence `seq` (rows counted within the sequence,
// 0..q_lens[seq]), every query head of kv head `kv_head`.
struct PagedTask {
  int seq;
  int kv_head;
  int row0;
  int rows;
  // When partial != nullptr: the splits to compute, [split, split + splits) (split x covers keys
  // [x·kPagedSplitKeys, +kPagedSplitKeys)). A task of several consecutive splits streams its
  // pages without a break (the next split's keys are prefetched while the current one's values
  // are summed); each split's state is the same whoever computes it.
  int split;
  int splits;
  // nullptr: fold every split and write out; else `splits` states of partial_floats(p, rows)
  // floats each, one after another, for splits split, split + 1, ...
  float* partial;
};

struct PagedAttentionKernel {
  Isa isa;
  const char* name;  // "avx512", "avx2", "generic"
  // Floats of scratch a task of `rows` query rows (Run) or a Combine of them needs; 64-byte
  // aligned buffers.
  int64_t (*scratch_floats)(const PagedAttentionParams& p, int rows);
  // Floats of one split's state for `rows` query rows.
  int64_t (*partial_floats)(const PagedAttentionParams& p, int rows);
  void (*run)(const PagedAttentionParams& p, const PagedTask& task, float* scratch);
  // Folds the states of every split of (seq, kv_head) for all the sequence's rows, `partials`
  // holding them one after another (split 0 first, partial_floats(p, q_lens[seq]) apart), and
  // writes out (and lse).
  void (*combine)(const PagedAttentionParams& p, int seq, int kv_head, const float* partials,
                  float* scratch);
};

// The per-ISA tables (see attention_kernel.h on why they are data). Check cpu_features.h before
// using one.
extern const PagedAttentionKernel kGenericPagedAttentionKernel;
extern const PagedAttentionKernel kAvx2PagedAttentionKernel;
extern const PagedAttentionKernel kAvx512PagedAttentionKernel;
// kAvx512's, with the scores of BFLOAT16 caches over bfloat16 queries (q_dtype BFLOAT16) by
// AVX512_BF16's VDPBF16PS (float32 queries, and other cache types: the same bits as
// kAvx512PagedAttentionKernel). Also REQUIRES CpuSupports(Bf16Isa::kAvx512Bf16).
extern const PagedAttentionKernel kAvx512Bf16PagedAttentionKernel;

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_PAGED_ATTENTION_KERNEL_H_
