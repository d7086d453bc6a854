// The fast CPU backend: fused FlashAttention-style attention (attention_kernel.h), vectorised
// for AVX-512 and AVX2 with a portable fallback chosen at run time, on a thread pool of its own;
// multi-head projections through single-threaded OpenBLAS sgemm on the same pool.
//
// 16-bit compute: on CPUs with AVX512_BF16 (and AMX), BFLOAT16 requests (and, opted in,
// FLOAT32/FLOAT16 ones) compute with bfloat16 operands and float32 accumulation: projections
// through oneDNN's matmul, attention through attention_bf16.cc (the fused path; requests asking
// for the weights, or with head dims above kMaxBf16HeadDim, take the float32 kernel on the
// bfloat16-rounded operands). FLOAT16 inputs keep float32 arithmetic by default: rounding them to
// bfloat16 would drop 3 of the 10 mantissa bits the caller sent, and this CPU generation has no
// float16 product with float32 accumulation (AVX512_FP16 accumulates in float16; AMX has only
// BF16 and INT8), so exactness wins unless float32_as_bf16 asks for speed.
// Memory of the 16-bit path: K and V of a call packed once in bfloat16 (the size of K and V in
// bfloat16); up to 64 MiB of that buffer stays with the calling thread for its next call.
//
// Work is split into tasks whose arithmetic depends only on their own request:
//   attention   one task per (item, batch entry, query head, block of kQueryBlock query rows);
//   projections one task per block of rows of one request's GEMM, the block size a function of
//               that GEMM's row count only (GemmRowChunk in cpu_backend.cc).
//   paged       one task per (sequence, kv head, split of kPagedSplitKeys keys) for decode steps,
//               or per (sequence, kv head, block of 16 query rows) for prefill chunks, folded in
//               key order (paged_attention_kernel.h, paged_attention.cc).
// Hence batch invariance (backend.h): a request's output bits do not depend on the other items
// of the call, their order, or num_threads. They do depend on the instruction set (the kernel
// chosen at Create), which is fixed for the life of the backend.
//
// Thread-safety: thread-safe; Attend and MultiHead may run concurrently (they share the pool).
// Note: Create sets OpenBLAS to one thread for the whole process (OpenBLAS has no per-call
// thread count in Debian 12's 0.3.21); the backend's pool supplies the parallelism.
#ifndef ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace attnserve::kernels::cpu {

struct CpuBackendOptions {
  // Affects performance only.
  // Threads computing a call, the calling thread included. 0 = one per core this process may
  // use (available_cores.h: its affinity mask within its cgroup's CPU limit).
  // Default: 0. REQUIRES: 0 <= num_threads <= 1024.
  int num_threads = 0;

  // Affects performance only.
  // A parallel step (an attention, a set of projections, a paged attention) is given one thread
  // per this many floating-point operations, at least 1 and at most num_threads: waking a worker
  // costs CPU on both sides and time before it helps, which a smaller share of work does not pay
  // back (tests/bench/RESULTS.md, "Small steps on one thread"), so a tiny call runs on its
  // calling thread alone (a paged attention counts its reads of the cache as work too:
  // paged_attention.cc). 0 = every step on all threads (tests use it to run tiny steps in
  // parallel). Default: 4e6 (30-60 µs of float32 attention for one AVX-512 core).
  // REQUIRES: >= 0.
  double min_flops_per_thread = 4e6;

  // Affects results (the last bits) and performance.
  // The attention kernel's instruction set. kAuto = the widest this CPU supports; the others
  // force one (tests compare them; kGeneric is the plain portable path). Default: kAuto.
  // REQUIRES: the CPU supports it.
  Isa isa = Isa::kAuto;

  // Affects results and performance.
  // The 16-bit path: bfloat16 operands with float32 accumulation (attention_bf16.cc, oneDNN
  // projections). kAuto = the best this CPU has (AMX, then AVX512_BF16); kNone computes every
  // request in float32 (what a CPU without AVX512_BF16 does); the others force one (tests use
  // them to cover each path). Default: kAuto. REQUIRES: the CPU supports it.
  Bf16Isa bf16_isa = Bf16Isa::kAuto;

  // Affects results and performance.
  // How FLOAT32 and FLOAT16 requests compute: false = exact float32 arithmetic (default); true =
  // like BFLOAT16 requests, with bfloat16 operands and float32 accumulation (when a 16-bit path
  // exists). BFLOAT16 requests always take the 16-bit path when there is one.
  bool float32_as_bf16 = false;
};

class CpuBackend final : public Backend {
 public:
  // Validates `options` (INVALID_ARGUMENT for a bad num_threads, FAILED_PRECONDITION for an
  // instruction set this CPU lacks) and starts the pool.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const CpuBackendOptions& options);
  // For tests: like Create, with `bf16_kernel` as the 16-bit attention kernel instead of the one
  // of options.bf16_isa. Tests pass the AMX kernel with its tile instructions emulated
  // (tests/kernels/cpu/amx_emu.h) to run the AMX path on CPUs without AMX. options.bf16_isa must
  // be kAuto or bf16_kernel.isa (INVALID_ARGUMENT otherwise); the CPU must have AVX512_BF16, which
  // the kernel's other instructions and the oneDNN projections use (FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> CreateWithBf16Kernel(
      const CpuBackendOptions& options, const Bf16AttentionKernel& bf16_kernel);

  // See Backend.
  std::string name() const override { return "cpu"; }
  std::vector<DeviceInfo> devices() const override;
  absl::Status Attend(absl::Span<const AttentionParams> batch) override;
  absl::Status MultiHead(absl::Span<const MultiHeadParams> batch) override;
  // On the pool, in chunks of rows fixed by each item's row count, as MultiHead's projections.
  absl::Status Project(absl::Span<const ProjectionParams> batch) override;
  // Float32 arithmetic on the widened cache, vectorised for the backend's Isa
  // (paged_attention_kernel.h says how a row's bits are fixed), on the pool. With a 16-bit path
  // (bf16_isa not kNone) and Isa kAvx512, the scores of BFLOAT16 caches are AVX512_BF16 dot
  // products of the bfloat16 values (exact products, float32 sums); probabilities and P·V stay
  // float32, so the accuracy is that of the float32 path.
  absl::Status PagedAttention(const PagedAttentionParams& p) override;

  std::string float32_precision() const override;
  // The threads' kept scratch (scratch.h: packed K and V, multi-head intermediates, task
  // buffers).
  int64_t ReleaseIdleMemory() override;

  int num_threads() const { return pool_.num_threads(); }
  // The threads a parallel step of `flops` floating-point operations in all is given
  // (CpuBackendOptions::min_flops_per_thread). Which thread runs a task never changes its bits
  // (above).
  int ThreadsFor(double flops) const;
  Isa isa() const { return kernel_.isa; }
  // The paged attention kernel in use ("avx512_bf16", "avx512", "avx2" or "generic").
  const char* paged_kernel_name() const { return paged_kernel_.name; }
  // The 16-bit path in use (kNone when there is none).
  Bf16Isa bf16_isa() const { return bf16_isa_; }
  // True when requests with inputs of `dtype` compute with bfloat16 operands.
  bool ComputesInBf16(DType dtype) const;

 private:
  // bf16_kernel: nullptr when bf16_isa is kNone.
  CpuBackend(const CpuBackendOptions& options, const AttentionKernel& kernel, Bf16Isa bf16_isa,
             const Bf16AttentionKernel* bf16_kernel);

  // Runs the attention of every item of `batch` on the pool.
  void RunAttention(absl::Span<const AttentionParams> batch);

  const AttentionKernel& kernel_;
  const PagedAttentionKernel& paged_kernel_;  // of kernel_'s Isa
  const Bf16Isa bf16_isa_;
  const Bf16AttentionKernel* const bf16_kernel_;  // nullptr when bf16_isa_ is kNone
  const bool float32_as_bf16_;
  const double min_flops_per_thread_;
  ThreadPool pool_;
};

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_
