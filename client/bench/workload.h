// What attnserve-bench sends: a mix of request shapes, drawn per request, with the work each
// request represents (tokens and FLOPs) for the throughput report.
#ifndef ATTNSERVE_CLIENT_BENCH_WORKLOAD_H_
#define ATTNSERVE_CLIENT_BENCH_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::bench {

namespace v1 = ::attnserve::v1;

// kDecode: decode steps of sessions prefilled before the run (ExtendSession, one token each).
enum class Rpc { kAttend, kMultiHead, kStream, kDecode };

// One entry of --shapes: Attend "B,H,L,D" (query heads H, key/value heads kv_heads or H,
// Lq = Lk = L, Dv = D) or MultiHeadAttention "B,L"; "@W" appends a relative weight (default 1).
struct ShapeSpec {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t seq_len = 1;
  int64_t head_dim = 1;
  double weight = 1;
};

// Parses "1,8,128,64@3;1,8,512,64" (`rank` 4, Attend) or "4,128;1,1024@0.5" (`rank` 2,
// MultiHeadAttention). INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<ShapeSpec>> ParseShapes(const std::string& text, int rank);

// How sequence lengths are drawn (--seq_len): "" keeps each shape's L; "uniform:MIN:MAX",
// "lognormal:MEDIAN:SIGMA:MAX" (rounded, clamped to [1, MAX]) or "choice:64,128,512" replace it.
struct SeqLenDist {
  enum Kind { kFixed, kUniform, kLogNormal, kChoice } kind = kFixed;
  double a = 0, b = 0, max = 0;
  std::vector<int64_t> choices;
  // A length for base length `base` (returned as is when kFixed).
  int64_t Draw(int64_t base, std::mt19937_64& rng) const;
};
absl::StatusOr<SeqLenDist> ParseSeqLen(const std::string& text);

// One prepared request and what it is worth.
struct Prepared {
  std::shared_ptr<const v1::AttendRequest> attend;           // set for Rpc::kAttend
  std::shared_ptr<const v1::MultiHeadAttentionRequest> mha;  // set for kMultiHead
  // Set for kDecode: one token's q [1, H, D], k and v [1, Hkv, D]; session_id and
  // expected_length are filled in per session when sent.
  std::shared_ptr<const v1::ExtendSessionRequest> extend;
  int64_t tokens = 0;  // query rows: B * Lq
  double flops = 0;    // dense multiply-add count x2 (causal masking, windows not discounted)
  int64_t bytes = 0;   // serialised request size
  std::string label;   // e.g. "1x8x128x64"
};

struct WorkloadOptions {
  // False: Attend requests; true: MultiHeadAttention requests (whichever rpc carries them).
  bool multi_head = false;
  // Decode steps of raw sessions (shapes give H and D; B and L are ignored): one token each,
  // worth the FLOPs of attending over decode_context tokens.
  bool decode = false;
  int64_t decode_context = 0;
  std::vector<ShapeSpec> shapes;
  SeqLenDist seq_len;
  int64_t kv_heads = 0;  // Attend: key/value heads; 0 = H
  v1::Dtype dtype = v1::DTYPE_FLOAT32;
  bool causal = false;
  // The attention kind and FlashAttention's options (attention.proto, AttentionOptions), on
  // Attend and MultiHeadAttention requests alike.
  v1::AttentionKind kind = v1::ATTENTION_KIND_UNSPECIFIED;
  v1::FeatureMap feature_map = v1::FEATURE_MAP_UNSPECIFIED;  // kind linear only
  int window_left = -1, window_right = -1;                   // both -1: no window
  float softcap = 0;
  bool alibi = false;  // the standard slopes
  std::string module = "demo";
  int64_t d_model = 0;  // MultiHeadAttention: the module's width (from ListModules)
  int pool_size = 32;   // prepared requests when lengths are drawn from a distribution
  uint64_t seed = 1;
};

// A fixed set of prepared requests and the weights to draw them with. Immutable once made:
// thread-safe to share.
class Workload {
 public:
  static absl::StatusOr<Workload> Create(const WorkloadOptions& options);
  // Index of the next request to send (weighted draw).
  size_t Draw(std::mt19937_64& rng) const { return pick_(rng); }
  const Prepared& at(size_t i) const { return items_[i]; }
  size_t size() const { return items_.size(); }
  // Expected tokens, FLOPs and bytes per request under the weights.
  double mean_tokens() const;
  double mean_flops() const;
  double mean_bytes() const;

 private:
  std::vector<Prepared> items_;
  std::vector<double> weights_;
  mutable std::discrete_distribution<size_t> pick_;
};

// FLOPs of one Attend of these sizes (QK^T and PV): 2*B*Hq*Lq*Lk*(D + Dv).
double AttendFlops(int64_t b, int64_t hq, int64_t lq, int64_t lk, int64_t d, int64_t dv);
// FLOPs of one MultiHeadAttention: four projections plus attention over all heads.
double MultiHeadFlops(int64_t b, int64_t lq, int64_t lk, int64_t d_model);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_CLIENT_BENCH_WORKLOAD_H_
