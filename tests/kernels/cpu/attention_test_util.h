// Test helpers for the CPU backend: random attention problems that own their buffers, a plain
// float32 implementation (the "naive" side of the FlashAttention error bound) and error
// measures against the float64 reference.
#ifndef ATTNSERVE_TESTS_KERNELS_CPU_ATTENTION_TEST_UTIL_H_
#define ATTNSERVE_TESTS_KERNELS_CPU_ATTENTION_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::testing {

enum class MaskKind {
  kNone,
  kKeyPadding,    // [B, 1, 1, Lk]
  kFull,          // [B, H, Lq, Lk], dense random
  kBlockedRows,   // [B, 1, Lq, Lk], random, with some rows fully blocked
  kRowBroadcast,  // [B, 1, Lq, 1]: whole rows allowed or blocked (col stride 0)
};

struct AttentionSpec {
  int batch = 1;
  int num_heads = 1;
  int num_kv_heads = 1;
  int q_len = 1;
  int kv_len = 1;
  int head_dim = 8;
  int v_head_dim = 8;
  MaskKind mask = MaskKind::kNone;
  bool causal = false;
  std::vector<int32_t> key_lengths;  // empty: none
  DType dtype = DType::kFloat32;     // the inputs' element type (values drawn, then rounded)
  bool interleaved = false;          // q/k/v/out as [B, L, H, D] instead of [B, H, L, D]
  float input_scale = 1.0f;          // q is drawn from N(0, input_scale²)
  uint32_t seed = 1;

  std::string DebugString() const;
};

// A problem with its own buffers; params() points into them.
class AttentionCase {
 public:
  explicit AttentionCase(const AttentionSpec& spec);
  AttentionCase(const AttentionCase&) = delete;
  AttentionCase& operator=(const AttentionCase&) = delete;

  const AttentionSpec& spec() const { return spec_; }
  // The parameters, writing to out() (and weights() when with_weights). The inputs are views of
  // spec().dtype elements (16-bit encodings for FLOAT16 / BFLOAT16).
  AttentionParams params(bool with_weights = false);
  // The same problem over float32 copies of the same input values (input_dtype kFloat32).
  AttentionParams float32_params(bool with_weights = false);
  // The output, as a dense [B, H, Lq, Dv] copy.
  std::vector<float> DenseOut() const;
  std::vector<float>& weights() { return weights_; }
  // Fills out and weights with NaN (so unwritten elements show).
  void PoisonOutputs();

 private:
  AttentionSpec spec_;
  AttentionParams Params(bool with_weights, bool as_float32);

  std::vector<float> q_, k_, v_, out_, weights_;
  std::vector<uint16_t> q16_, k16_, v16_;  // encodings of q_, k_, v_ when dtype is 16-bit
  std::vector<uint8_t> mask_;
  MaskView mask_view_;
};

// Plain float32 attention: scores materialised per row, float accumulation, std::exp (inputs of
// any dtype, widened first). Returns dense out [B, H, Lq, Dv] and weights [B, H, Lq, Lk].
void NaiveAttention32(const AttentionParams& p, std::vector<float>* out,
                      std::vector<float>* weights);

// Plain float32 multi-head module (float accumulation throughout). Returns dense out
// [B, Lq, d_model] and weights [B, h, Lq, Lk].
void NaiveMultiHead32(const MultiHeadParams& p, std::vector<float>* out,
                      std::vector<float>* weights);

// max_n |a[n] - ref[n]|; infinity if any a[n] is not finite or the sizes differ.
double MaxAbsError(const std::vector<float>& a, const std::vector<double>& ref);
// True when every element is finite.
bool AllFinite(const std::vector<float>& a);

// Random module weights (d_model, num_heads), entries ~ U(-1/sqrt(d), 1/sqrt(d)) like
// nn.Linear's initialisation.
MultiHeadWeights RandomWeights(int d_model, int num_heads, uint32_t seed);
// n values ~ N(0, 1), rounded through dtype.
std::vector<float> RandomVector(int64_t n, uint32_t seed, DType dtype = DType::kFloat32);
// The encodings of `values` in the 16-bit `dtype` (values must be representable, e.g. from
// RandomVector with that dtype).
std::vector<uint16_t> Encode16(DType dtype, const std::vector<float>& values);
// A pointer to `values` as elements of dtype: values itself for kFloat32, else *storage filled
// with their 16-bit encodings.
const void* InputData(DType dtype, const std::vector<float>& values,
                      std::vector<uint16_t>* storage);

}  // namespace attnserve::kernels::testing

#endif  // ATTNSERVE_TESTS_KERNELS_CPU_ATTENTION_TEST_UTIL_H_
