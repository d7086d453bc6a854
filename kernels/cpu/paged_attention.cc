// CpuBackend::PagedAttention: the tasks of a paged attention call on the backend's pool
// (paged_attention_kernel.h has the arithmetic).
//
// Scheduling, per sequence, from its own q_len and kv_len only:
//   q_len <= kSplitRowsMax and more than one split: decode. Each split of kPagedSplitKeys keys
//     of each kv head gets its own state for all q_len rows x group heads, computed by tasks of
//     a few consecutive splits; then one task per kv head folds the splits in order. A decode
//     step has no other parallelism: at 64 sequences x 8 kv heads x 4096 keys that is 8192
//     splits, in 512 tasks of 16 splits on 2 threads.
//   otherwise: one task per (kv head, block of kRowBlock rows) folding its splits itself; each
//     K/V page is read once per block of rows, every head of the GQA group at once.
// Both give the same bits (paged_attention_kernel.h), so the choice is about speed only.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/scratch.h"

namespace attnserve::kernels::cpu {
namespace {

// Query rows per prefill task. 16 rows x a GQA group of 4 = 64 row-heads share each page read;
// their scores (64 x kPagedSplitKeys floats, 64 KiB) stay in L2.
constexpr int kRowBlock = 16;
// Sequences with at most this many new rows (decode steps, short speculative chunks) split their
// keys over tasks.
constexpr int kSplitRowsMax = kRowBlock;

// At most this many splits per decode task: 16 x 256 keys = one (sequence, kv head) of 4096.
constexpr int64_t kMaxSplitsPerTask = 16;

// A fold of every split of (seq, kv head).
struct CombineTask {
  int seq;
  int kv_head;
  const float* partials;
};

// A cached byte read counts as this many floating-point operations of work (ThreadsFor): one
// thread read a decode step's cache at 31-36 GB/s (steps over 1,024-2,524 float32 keys, 8 heads
// of 64: 4-10 MiB in 200-237 µs, in L3) and computes attention at 65-125 GFLOP/s, so a byte takes
// as long as 2-4 FLOP; with 4, a step reading 2 MiB or more (about 60 µs on one thread) is split
// (2-vCPU Zen 5 VM; tests/bench/RESULTS.md, "Small steps on one thread").
constexpr double kPagedFlopsPerByte = 4;

}  // namespace

absl::Status CpuBackend::PagedAttention(const PagedAttentionParams& p) {
  if (p.store != nullptr && p.store->on_device()) return Backend::PagedAttention(p);  // refuses
  const PagedAttentionKernel& k = paged_kernel_;
  auto splits_of = [&](int s) { return (p.kv_lens[s] + kPagedSplitKeys - 1) / kPagedSplitKeys; };
  auto split_parallel = [&](int s) { return p.q_lens[s] <= kSplitRowsMax && splits_of(s) > 1; };

  int64_t partial_floats = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    if (split_parallel(s)) {
      partial_floats += int64_t{p.num_kv_heads} * splits_of(s) * k.partial_floats(p, p.q_lens[s]);
    }
  }
  // Left uninitialised: every split state is written before it is folded. Kept by the calling
  // thread for its next call: a fresh buffer (18 MB at 64 sequences x 4096 keys x 8 kv heads)
  // would be mapped, faulted in and zeroed by the kernel at every decode step.
  thread_local std::unique_ptr<float[]> kept;
  thread_local int64_t kept_floats = 0;
  if (kept_floats < partial_floats) {
    kept = std::make_unique_for_overwrite<float[]>(partial_floats);
    kept_floats = partial_floats;
  }
  float* const partials = kept.get();

  // Consecutive splits of one (sequence, kv head) per decode task, so that a thread streams a
  // long run of pages with its prefetches running ahead across split boundaries (with one
  // split per task, every 256 keys started cold: a stall on memory latency for the first page
  // of K, another for V). As many as keep 16 tasks per thread for the dynamic scheduling to
  // even out, at most kMaxSplitsPerTask; results do not depend on it.
  int64_t total_splits = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    if (split_parallel(s)) total_splits += int64_t{p.num_kv_heads} * splits_of(s);
  }
  const int splits_per_task = static_cast<int>(std::clamp<int64_t>(
      total_splits / (16 * int64_t{pool_.num_threads()}), 1, kMaxSplitsPerTask));
  std::vector<PagedTask> tasks;
  std::vector<CombineTask> combines;
  float* next = partials;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = p.q_lens[s];
    if (split_parallel(s)) {
      const int64_t stride = k.partial_floats(p, q_len);
      for (int h = 0; h < p.num_kv_heads; ++h) {
        combines.push_back(CombineTask{s, h, next});
        for (int split = 0; split < splits_of(s); split += splits_per_task) {
          const int n = std::min(splits_per_task, splits_of(s) - split);
          tasks.push_back(PagedTask{s, h, 0, q_len, split, n, next});
          next += n * stride;
        }
      }
      continue;
    }
    // Later blocks see more keys: queue them first so the pool's dynamic scheduling ends evenly
    // (order only; results do not depend on it).
    const int blocks = (q_len + kRowBlock - 1) / kRowBlock;
    for (int b = blocks - 1; b >= 0; --b) {
      const int row0 = b * kRowBlock;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        tasks.push_back(PagedTask{s, h, row0, std::min(kRowBlock, q_len - row0), 0, 0, nullptr});
      }
    }
  }

  // The step's work for ThreadsFor, every cached key counted (a window ignored): its arithmetic,
  // and its reads of the cache at kPagedFlopsPerByte, for a decode step is bound by memory, not
  // arithmetic (a step over 1,024 float32 keys of 8 heads of 64 reads 4 MiB for 2.1 MFLOP). A
  // decode step over a short cache stays on the calling thread.
  const double widths = p.head_dim + p.v_head_dim;
  double work = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    work += 2.0 * p.num_heads * p.q_lens[s] * p.kv_lens[s] * widths;
    work += kPagedFlopsPerByte * p.num_kv_heads * p.kv_lens[s] * widths *
            static_cast<double>(DTypeSize(p.dtype));
  }
  const int threads = ThreadsFor(work);
  pool_.ParallelFor(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t) {
    const PagedTask& task = tasks[t];
    ScratchBuffer scratch(ScratchUse::kTask, k.scratch_floats(p, task.rows) * int64_t{4});
    k.run(p, task, scratch.floats());
  });
  if (!combines.empty()) {
    pool_.ParallelFor(static_cast<int64_t>(combines.size()), threads, [&](int64_t t) {
      const CombineTask& c = combines[t];
      ScratchBuffer scratch(ScratchUse::kTask, k.scratch_floats(p, p.q_lens[c.seq]) * int64_t{4});
      k.combine(p, c.seq, c.kv_head, c.partials, scratch.floats());
    });
  }
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cpu
