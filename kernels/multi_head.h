// The multi-head attention module (the reference PyTorch module of DEVELOPERS.md):
//
//   Q = query · W_qᵀ + b_q,  K = key · W_kᵀ + b_k,  V = value · W_vᵀ + b_v     ([B, L, d_model])
//   split each into h heads of d_k = d_model / h      (head t uses columns [t·d_k, (t+1)·d_k))
//   A_t = attention(Q_t, K_t, V_t) with the options of AttentionParams, scale 1/sqrt(d_k) default
//   out = concat_t(A_t) · W_oᵀ + b_o                                            ([B, Lq, d_model])
//
// Weights follow nn.Linear: [out_features, in_features], y = x·Wᵀ + b.
#ifndef ATTNSERVE_KERNELS_MULTI_HEAD_H_
#define ATTNSERVE_KERNELS_MULTI_HEAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention_params.h"

namespace attnserve::kernels {

// Immutable weights of one module. Thread-safe to share once built (all members const in use).
struct MultiHeadWeights {
  int d_model = 0;
  int num_heads = 0;
  // W_q, W_k and W_v stacked into one [3·d_model, d_model] matrix (rows 0..d-1 are W_q, then
  // W_k, then W_v), so self-attention projects Q, K and V with one GEMM; biases stacked alike.
  std::vector<float> w_qkv;
  std::vector<float> b_qkv;
  std::vector<float> w_o;  // [d_model, d_model]
  std::vector<float> b_o;  // [d_model]

  int head_dim() const { return d_model / num_heads; }
  const float* w_q() const { return w_qkv.data(); }
  const float* w_k() const { return w_qkv.data() + int64_t{d_model} * d_model; }
  const float* w_v() const { return w_qkv.data() + 2 * int64_t{d_model} * d_model; }
  const float* b_q() const { return b_qkv.data(); }
  const float* b_k() const { return b_qkv.data() + d_model; }
  const float* b_v() const { return b_qkv.data() + 2 * d_model; }
  // Bytes held by the weights (for metrics and GetServerInfo).
  int64_t bytes() const {
    return static_cast<int64_t>(sizeof(float)) *
           static_cast<int64_t>(w_qkv.size() + b_qkv.size() + w_o.size() + b_o.size());
  }

  // bfloat16 copies of w_qkv and w_o (rounded to nearest even), for backends computing in
  // bfloat16: made on the first call, thread-safe, shared by copies of this struct.
  // REQUIRES: w_qkv and w_o are not changed after the first call.
  const std::vector<uint16_t>& w_qkv_bf16() const;
  const std::vector<uint16_t>& w_o_bf16() const;

  struct Bf16Copies;
  std::shared_ptr<Bf16Copies> bf16_copies = NewBf16Copies();
  static std::shared_ptr<Bf16Copies> NewBf16Copies();
};

// Checks shapes (d_model >= 1, num_heads >= 1, d_model % num_heads == 0) and vector sizes.
// (Weights come from files through model/module_weights.h; the kernels only compute with them.)
absl::Status ValidateWeights(const MultiHeadWeights& w);

// One multi-head request. Buffers belong to the caller and outlive the call.
// Attention options as in AttentionParams (the mask broadcast over [B, h, Lq, Lk]; alibi_slopes
// [h]).
struct MultiHeadParams : AttentionOptions {
  const MultiHeadWeights* module = nullptr;
  int batch = 0;
  int q_len = 0;
  int kv_len = 0;
  // Inputs, dense row-major (row stride d_model elements), of element type input_dtype: views of
  // the caller's bytes, converted by the backend where it computes (see attention_params.h).
  const void* query = nullptr;          // [B, Lq, d_model]
  const void* key = nullptr;            // [B, Lk, d_model]
  const void* value = nullptr;          // [B, Lk, d_model]
  DType input_dtype = DType::kFloat32;  // kFloat32, kFloat16 or kBFloat16, as in AttentionParams
  // True when key and value are the query (self-attention): a backend may project all three
  // with one fused GEMM. REQUIRES key == value == query when set.
  bool self_attention = false;

  float* out = nullptr;      // [B, Lq, d_model]
  float* weights = nullptr;  // [B, h, Lq, Lk] or nullptr when not asked for
};

// One projection with a module's weights (nn.Linear), as decode sessions bound to a module use
// them: y = x · Wᵀ + b for the `rows` rows of x [rows, d_model] (element type x_type, row-major,
// contiguous) into y [rows, n()] float32. kQkv: W_q, W_k and W_v stacked (w_qkv, n = 3·d_model):
// each row of y holds the row's Q, then K, then V, projected by one GEMM. kOut: W_o (n =
// d_model). Buffers belong to the caller and outlive the call.
struct ProjectionParams {
  enum class Weights { kQkv, kOut };
  const MultiHeadWeights* module = nullptr;
  Weights weights = Weights::kQkv;
  const void* x = nullptr;
  DType x_type = DType::kFloat32;  // kFloat32, kFloat16 or kBFloat16
  int64_t rows = 0;
  float* y = nullptr;
  // The dtype of the request the projection serves: the precision is that of a MultiHead
  // request of this input_dtype (a backend may compute BFLOAT16 requests' projections with
  // bfloat16 operands, also the output projection, whose x is float32).
  DType request_dtype = DType::kFloat32;

  int n() const { return weights == Weights::kQkv ? 3 * module->d_model : module->d_model; }
  const float* w() const {
    return weights == Weights::kQkv ? module->w_qkv.data() : module->w_o.data();
  }
  const float* bias() const {
    return weights == Weights::kQkv ? module->b_qkv.data() : module->b_o.data();
  }
};

// Where a backend put the projected Q, K and V of a multi-head request: row-major [B·L, ·]
// buffers of element type `dtype`, head t of a row at columns [t·d_k, (t+1)·d_k), with row
// strides in elements (3·d_model for a fused QKV buffer, d_model or 2·d_model otherwise).
struct ProjectedQkv {
  const void* q = nullptr;
  int64_t q_ld = 0;
  const void* k = nullptr;
  int64_t k_ld = 0;
  const void* v = nullptr;
  int64_t v_ld = 0;
  DType dtype = DType::kFloat32;
};

// The attention part of multi-head request `p` as one AttentionParams over all h heads
// (num_kv_heads = h, D = Dv = d_k): inputs from `qkv`, output the concatenated heads written
// into `concat` [B·Lq, d_model] with row stride concat_ld, and p's weights, mask, causal, key
// lengths and scale. The one place the split into heads is written down: every backend and
// test that runs a module's attention through AttentionParams builds it here.
AttentionParams HeadAttentionParams(const MultiHeadParams& p, const ProjectedQkv& qkv,
                                    float* concat, int64_t concat_ld);

// Floating-point operations of a multi-head request: four projections (2·B·L·d² each, Q and
// the output over Lq rows, K and V over Lk rows) plus the attention (4·B·h·Lq·Lk·d_k).
double MultiHeadFlops(const MultiHeadParams& p);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_MULTI_HEAD_H_
