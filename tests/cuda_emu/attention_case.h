// The attention cases of the CUDA emulation tests (README.md): a packed batch of sequences
// with every option of the kernels (odd lengths, causal, key lengths, mask layouts, GQA,
// D != Dv, non-finite inputs), built with exact-size buffers, run through a launch function
// and compared with the float64 reference (kernels/reference.h). Shared by flash_emu_test and
// naive_attention_emu_test.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_ATTENTION_CASE_H_
#define ATTNSERVE_TESTS_CUDA_EMU_ATTENTION_CASE_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cuda/flash_params.h"

namespace attnserve::kernels::cuda {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

enum class MaskLayout {
  kNone,
  kPerHead,        // [S, H, Lq, Lk], random, some rows fully blocked
  kBroadcastHead,  // [S, 1, Lq, Lk] broadcast over heads
  kKeyPadding,     // [S, 1, 1, Lk] broadcast over heads and rows
  kBroadcastKeys,  // [S, H, Lq, 1] broadcast over keys (column stride 0): whole rows blocked
  kBlockedTiles,   // whole key tiles blocked for every row, and a fully blocked row
  kAllBlocked,     // nothing allowed: every row attends uniformly
};
// Every layout but kNone, for the tests that sweep them all.
inline constexpr MaskLayout kMaskLayouts[] = {MaskLayout::kPerHead,      MaskLayout::kBroadcastHead,
                                              MaskLayout::kKeyPadding,   MaskLayout::kBroadcastKeys,
                                              MaskLayout::kBlockedTiles, MaskLayout::kAllBlocked};

struct Seq {
  int q_len;
  int kv_len;
};

struct Case {
  std::string name;
  std::vector<Seq> seqs;
  int num_heads = 2;
  int num_kv_heads = 2;
  int head_dim = 64;
  int v_head_dim = 64;
  bool causal = false;
  std::vector<int> key_lengths;  // empty: none
  MaskLayout mask = MaskLayout::kNone;
  // Non-finite inputs (the NaN rule): value written at q[token 0, head 0, col 0] etc.
  float q_poison = 0.0f;  // 0: none
  float k_poison = 0.0f;  // at key poison_key of sequence 0, kv head 0, col 0
  int poison_key = 0;
  float v_poison = 0.0f;  // at key 0 of sequence 0, kv head 0, column 3
  // A sliding window and soft-cap (mods.alibi_slopes is ignored: ALiBi's slopes are `slopes`,
  // one per query head, or none).
  ScoreMods mods;
  std::vector<float> slopes;
};

// 16-bit storage of the kernels' operand type, and the float value each element rounds to.
struct Buffer16 {
  std::unique_ptr<uint16_t[]> bits;  // exact size: ASan sees any overrun
  std::vector<float> values;
};
// n elements uniform in [lo, hi), rounded to `type`.
Buffer16 MakeBuffer(size_t n, ComputeType type, std::mt19937& rng, float lo, float hi);
// Sets element `index` to `value` (rounded to `type`; non-finite values stay what they are).
void Poison(Buffer16& b, size_t index, float value, ComputeType type);

struct Outcome {
  std::vector<float> out;     // [total_q, H, Dv] from the kernel
  std::vector<double> ref;    // same layout, float64 reference (NaN where no row)
  std::vector<int> q_offset;  // cu_seqlens_q
  // The attention weights, sequences one after another, each [H, q_len, kv_len] (sequences
  // with no query have none): from the launch (empty if it returns none) and the reference.
  std::vector<float> weights;
  std::vector<double> ref_weights;
};

// Runs the kernel on p's host buffers (q, k, v in `type`, o float32 filled with -12345, the
// mask, key lengths and v_mean as FlashFwdParams describes them); returns the weights it
// computed, or nothing.
using LaunchFn = std::function<std::vector<float>(const FlashFwdParams& p)>;

// Builds c's inputs from `seed` (one generator per tensor, so a sequence's values depend only
// on its place in the pack), runs `launch` and the reference.
Outcome RunCase(const Case& c, ComputeType type, uint32_t seed, const LaunchFn& launch);

// Every output element within `tol` of the reference (NaN where the reference is NaN, the same
// infinity where it is infinite); `label` names the kernel in failure messages.
void ExpectMatches(const Case& c, const std::string& label, double tol, const Outcome& r);

// r.weights has r.ref_weights' size and every weight is within `tol` of the reference's (NaN
// where it is NaN).
void ExpectWeightsMatch(const Case& c, const std::string& label, double tol, const Outcome& r);

using CaseFn = std::function<Outcome(const Case&)>;

// The NaN rule of attention_params.h, each on one head of one sequence with `base`'s head dims:
// rule 1 (a NaN/+Inf in q: that row NaN in every column, and in every weight), rule 3 (a
// NaN/Inf in a blocked key's k: no effect), rule 2 (an allowed -Inf score weighs 0: key length
// 1 with that key's score -Inf gives the output and weights of key length 0), rule 4 (a NaN in
// v: that column NaN). `check` runs a case and compares it with the reference; `run` only runs
// it. The weights are checked where the path returns them.
void ExpectNaNRule(const Case& base, const CaseFn& check, const CaseFn& run);

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_TESTS_CUDA_EMU_ATTENTION_CASE_H_
