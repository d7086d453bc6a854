// The one parameter struct every attention kernel takes (reference, CPU, CUDA).
//
// It describes a dense attention problem over buffers the caller owns: inputs q, k, v of one
// element type (FLOAT32, FLOAT16 or BFLOAT16, `input_dtype`), outputs in float32:
//
//   out[b, h, i, :] = sum_j softmax_j(s[b, h, i, j]) * v[b, h / group, j, :]
//   s[b, h, i, j]   = scale * dot(q[b, h, i, :], k[b, h / group, j, :])   if allowed(b, h, i, j)
//                   = -1e9                                                  otherwise
//
// where group = num_heads / num_kv_heads (grouped-query attention) and
//
//   allowed(b, h, i, j) = mask(b, h, i, j) != 0            (if a mask is given)
//                         && j <= i + kv_len - q_len        (if causal; bottom-right aligned)
//                         && j <  key_lengths[b]           (if key lengths are given)
//                         && inside the sliding window      (if one is given: ScoreMods)
//
// and the score itself may be soft-capped and biased by ALiBi first (ScoreMods, below).
//
// The -1e9 fill mirrors the reference PyTorch module: a blocked weight is exactly 0 whenever a
// row has at least one allowed key, and a row whose keys are all blocked attends uniformly
// (every weight 1 / kv_len), never NaN. Kernels implement that as "softmax over the allowed
// keys, or the uniform average when there are none", which equals the -1e9 fill in float32 and
// float64 for every score magnitude a real request produces (|s| far below 1e9).
//
// Non-finite inputs (the NaN rule; every backend follows it: NanRuleTest in
// tests/kernels/cpu/cpu_backend_test.cc checks the reference and the CPU backend,
// tests/cuda_emu/flash_emu_test.cc the CUDA kernels). IEEE/PyTorch semantics where they are
// well defined:
//   1. A row with a NaN or +Inf among its ALLOWED scores (from a NaN or infinity in q or in an
//      allowed key's k, or float overflow of q.k in the backend's precision) is NaN in every
//      output column, and every one of its weights is NaN (PyTorch: softmax of a row holding
//      NaN, or +Inf - +Inf, is NaN).
//   2. An allowed score of -Inf gets weight exactly 0, like a blocked key (exp(-inf) = 0); a row
//      whose allowed scores are all -Inf is treated as fully blocked (uniform average).
//   3. Blocked keys are never consulted: a NaN or infinity in the k of a blocked key, or in the q
//      of a row with no allowed key, has no effect.
//   4. A NaN or infinity in v reaches the output as IEEE arithmetic does: column c of a row is
//      non-finite when a key with nonzero weight has a non-finite v[c] (and for a fully blocked
//      row, the uniform average over all keys, when any v[c] is non-finite). Whether a key with
//      zero weight (blocked, -Inf, or underflowed) poisons column c (0 * Inf = NaN) is
//      unspecified.
// A row that does not meet rule 1 or 4 has finite outputs. Scores are finite for inputs of
// magnitude below about 1e18 (float32 q.k cannot overflow); larger inputs may hit rule 1 or 2
// in one precision and not in another.
//
// All strides are in elements (of the view's element type), not bytes. A stride of 0 broadcasts
// (used for masks). The inputs are views: the server hands over the request's bytes as they
// arrived, and each backend converts where it computes (the reference up front, the CPU backend
// per tile on its pool, CUDA on the device), so a 16-bit tensor is never widened to a float32
// copy of its own.
// Filled in exactly one place per caller (server/transport/request_builder.cc for the service, the
// test helpers for tests), so every backend sees the same layout conventions.
#ifndef ATTNSERVE_KERNELS_ATTENTION_PARAMS_H_
#define ATTNSERVE_KERNELS_ATTENTION_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace attnserve::kernels {

// A boolean mask broadcast to [batch, num_heads, q_len, kv_len]; 0 = blocked, nonzero = allowed.
// Broadcast dimensions have stride 0.
struct MaskView {
  const uint8_t* data = nullptr;  // nullptr: no mask
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;  // per query position
  int64_t col_stride = 0;  // per key position

  bool present() const { return data != nullptr; }
  uint8_t at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return data[b * batch_stride + h * head_stride + i * row_stride + j * col_stride];
  }
};

// FlashAttention's other kinds of softmax attention (its softcap, alibi_slopes and window_size),
// applied to s = scale · q·k in this order, before blocked scores are filled:
//   soft-capping   s <- softcap · tanh(s / softcap)                       (softcap > 0; 0: none)
//   ALiBi          s <- s - alibi_slopes[h] · |j - i'|                     (nullptr: none)
//   window         key j is blocked unless i' - window_left <= j <= i' + window_right
// with i' = i + kv_len - q_len, the query's position aligned as causality aligns it. A negative
// window bound leaves that side open (-1, -1: no window); the window combines with the mask,
// causality and key lengths by AND, and a row it leaves without keys is fully blocked (uniform,
// as above). For causal rows ALiBi's bias is slope · (j - i'): FlashAttention's slope · j up to a
// constant per row, which the softmax cancels (BLOOM's and MPT's form too). Soft-capping maps an
// infinite score to ±softcap: NaN rule 1 then holds for NaN scores only, and rule 2 never applies.
struct ScoreMods {
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  const float* alibi_slopes = nullptr;  // [num_heads] (query heads), or nullptr

  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  bool any() const { return windowed() || softcap != 0.0f || alibi_slopes != nullptr; }
};

// Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), the other kind:
//   out[b, h, i, :] = φ(q_i)ᵀ S_i / (φ(q_i) · z_i),  S_i = sum_j φ(k_j) v_jᵀ,  z_i = sum_j φ(k_j)
// over the allowed keys j (causality bottom-right aligned and key lengths, as above; no mask,
// window, soft-cap, ALiBi or scale), φ applied to each element. A row whose normaliser
// φ(q_i) · z_i is exactly 0 (no allowed key, or φ(q_i) = 0, or features that cancel) is all
// zeros. Its cost is O((Lq + Lk) · D · Dv): the sums are running state, never an Lq x Lk matrix.
enum class AttentionKind { kSoftmax, kLinear };
enum class FeatureMap {
  kEluPlusOne,  // elu(x) + 1: x + 1 for x > 0, exp(x) otherwise (always > 0; the paper's)
  kRelu,        // max(x, 0)
  kIdentity,    // x (normalisers may be 0 or negative)
};

// A [batch, heads, rows, cols]-indexed strided view of input elements whose type is given
// elsewhere (AttentionParams::input_dtype). Strides count elements; the last dimension is
// contiguous.
struct InputView {
  const void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;

  int64_t offset(int64_t b, int64_t h, int64_t i) const {
    return b * batch_stride + h * head_stride + i * row_stride;
  }
  // The row (b, h, i) as elements of T (float for FLOAT32, uint16_t for FLOAT16 / BFLOAT16).
  // REQUIRES: T matches the view's element type.
  template <typename T>
  const T* row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(data) + offset(b, h, i);
  }
};

// A [batch, heads, rows, cols]-indexed strided float32 tensor view (outputs).
template <typename T>
struct StridedView {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;  // the last dimension is always contiguous (stride 1)

  T* row(int64_t b, int64_t h, int64_t i) const {
    return data + b * batch_stride + h * head_stride + i * row_stride;
  }
};

// The options of one attention problem, combined with AND: the part of AttentionParams that
// MultiHeadParams shares (and the request builder fills for both), so that a caller copies them
// as one (`static_cast<AttentionOptions&>(params) = options`).
struct AttentionOptions {
  MaskView mask;
  bool causal = false;
  const int32_t* key_lengths = nullptr;  // [B] or nullptr; REQUIRES 0 <= key_lengths[b] <= Lk
  float scale = 1.0f;                    // multiplies q.k before masking
  ScoreMods mods;                        // window, soft-cap, ALiBi (above)
  AttentionKind kind = AttentionKind::kSoftmax;
  FeatureMap feature_map = FeatureMap::kEluPlusOne;  // kLinear only
};

// The dimensions of one attention problem (shared with the CUDA linear-attention launch's
// params). REQUIRES: all >= 1, num_heads % num_kv_heads == 0.
struct AttentionShape {
  int batch = 0;
  int num_heads = 0;     // query heads (Hq)
  int num_kv_heads = 0;  // key/value heads (Hkv)
  int q_len = 0;         // Lq
  int kv_len = 0;        // Lk
  int head_dim = 0;      // D, of q and k
  int v_head_dim = 0;    // Dv, of v and out
};

// The dimensions and the options (bases, so that every kernel reads p.batch, p.causal, p.scale,
// ...), and the problem's buffers.
struct AttentionParams : AttentionShape, AttentionOptions {
  // Inputs: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (strided), all three of
  // element type input_dtype.
  InputView q;
  InputView k;
  InputView v;
  // The element type of q, k and v: kFloat32, kFloat16 or kBFloat16 (never kBool). It is also
  // the request's type on the wire, which a backend may use to choose its arithmetic (CUDA
  // computes FLOAT16 in float16 and BFLOAT16 in bfloat16; the CPU backend's choice is in
  // cpu_backend.h). Outputs are float32 whatever it is.
  DType input_dtype = DType::kFloat32;

  // Output [B, Hq, Lq, Dv] (strided).
  StridedView<float> out;

  // Optional attention weights, [B, Hq, Lq, Lk] dense row-major; nullptr when not asked for.
  float* weights = nullptr;

  int group_size() const { return num_heads / num_kv_heads; }

  // Number of key positions that can be allowed for (b, i) before the mask is consulted:
  // keys at j >= limit are blocked by causality, key length or the window's right side.
  // Out of line (attention_params.cc, compiled without ISA flags), so that the per-ISA kernels
  // can call it: an inline copy compiled with AVX-512 could be the one the linker keeps.
  int key_limit(int b, int i) const;
  // The first key position that can be allowed for row i: keys at j < start are blocked by the
  // window's left side (0 without one).
  int key_start(int i) const;
};

// Floating-point operations of the attention part (4 * B * Hq * Lq * Lk * D, the figure every
// benchmark in this project reports, as FlashAttention does).
inline double AttentionFlops(const AttentionParams& p) {
  return 2.0 * p.batch * p.num_heads * static_cast<double>(p.q_len) * p.kv_len *
         (p.head_dim + p.v_head_dim);
}

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_ATTENTION_PARAMS_H_
