// The reference path: a plain, obviously correct implementation of attention and of the
// multi-head module, accumulating in float64. Every faster path is tested against it, and the
// server can be forced onto it (--backend=reference).
//
// It is deliberately simple (no tiling, no vectorisation): loops in the order of the formula
// in attention_params.h, scores materialised per row, softmax over the allowed keys.
#ifndef ATTNSERVE_KERNELS_REFERENCE_H_
#define ATTNSERVE_KERNELS_REFERENCE_H_

#include <vector>

#include "kernels/attention_params.h"
#include "kernels/backend.h"
#include "kernels/multi_head.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels {

// Float64 results, for tests that measure the error of faster paths.
struct Reference64 {
  std::vector<double> out;      // dense [B, Hq, Lq, Dv] (Attend) or [B, Lq, d_model] (MultiHead)
  std::vector<double> weights;  // dense [B, Hq, Lq, Lk]
};

// Float32 copies of 16-bit inputs, for the paths that widen up front (the reference, tests).
struct Float32Inputs {
  std::vector<float> q, k, v;  // dense; empty when the inputs are float32 already
};
// p with its inputs as float32 (input_dtype kFloat32): p itself when they are float32 already;
// otherwise views of dense copies (exact: every FLOAT16 and BFLOAT16 value is a float32) held by
// *storage, which must outlive the result.
AttentionParams WithFloat32Inputs(const AttentionParams& p, Float32Inputs* storage);
MultiHeadParams WithFloat32Inputs(const MultiHeadParams& p, Float32Inputs* storage);

// Computes p in float64 and returns dense float64 results; p.out and p.weights are not touched.
// Inputs of any input_dtype (widened up front).
Reference64 ReferenceAttention64(const AttentionParams& p);
Reference64 ReferenceMultiHead64(const MultiHeadParams& p);

// Computes p in float64 and writes p.out (and p.weights when non-null), rounded to float32.
void ReferenceAttention(const AttentionParams& p);
void ReferenceMultiHead(const MultiHeadParams& p);

// Computes p (paged_attention_params.h) in float64: ReferencePagedAttention64 returns out
// [total_q, Hq, Dv] and, in `weights`, the log-sum-exp [total_q, Hq]; ReferencePagedAttention
// writes p.out (and p.lse when non-null), rounded to float32. The latter is also the default of
// Backend::PagedAttention.
Reference64 ReferencePagedAttention64(const PagedAttentionParams& p);
void ReferencePagedAttention(const PagedAttentionParams& p);

// The reference path as a Backend (single-threaded; batch items computed in order).
class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  std::vector<DeviceInfo> devices() const override;
  std::string float32_precision() const override {
    return "fp64: float64 arithmetic on float32 inputs, rounded to float32 once";
  }
  absl::Status Attend(absl::Span<const AttentionParams> batch) override;
  absl::Status MultiHead(absl::Span<const MultiHeadParams> batch) override;
};

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_REFERENCE_H_
