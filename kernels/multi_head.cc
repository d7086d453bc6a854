#include "kernels/multi_head.h"

#include <mutex>

#include "absl/strings/str_cat.h"

namespace attnserve::kernels {

struct MultiHeadWeights::Bf16Copies {
  std::once_flag once;
  std::vector<uint16_t> w_qkv, w_o;
};

std::shared_ptr<MultiHeadWeights::Bf16Copies> MultiHeadWeights::NewBf16Copies() {
  return std::make_shared<Bf16Copies>();
}

namespace {
MultiHeadWeights::Bf16Copies& Bf16Of(const MultiHeadWeights& w) {
  MultiHeadWeights::Bf16Copies& c = *w.bf16_copies;
  std::call_once(c.once, [&] {
    c.w_qkv.resize(w.w_qkv.size());
    FromFloat32(DType::kBFloat16, w.w_qkv.data(), w.w_qkv.size(), c.w_qkv.data());
    c.w_o.resize(w.w_o.size());
    FromFloat32(DType::kBFloat16, w.w_o.data(), w.w_o.size(), c.w_o.data());
  });
  return c;
}
}  // namespace

const std::vector<uint16_t>& MultiHeadWeights::w_qkv_bf16() const { return Bf16Of(*this).w_qkv; }
const std::vector<uint16_t>& MultiHeadWeights::w_o_bf16() const { return Bf16Of(*this).w_o; }

absl::Status ValidateWeights(const MultiHeadWeights& w) {
  if (w.d_model < 1)
    return absl::InvalidArgumentError(absl::StrCat("d_model must be >= 1; was ", w.d_model));
  if (w.num_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads must be >= 1; was ", w.num_heads));
  }
  if (w.d_model % w.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model (", w.d_model, ") must be divisible by num_heads (", w.num_heads, ")"));
  }
  const size_t d = static_cast<size_t>(w.d_model);
  if (w.w_qkv.size() != 3 * d * d || w.b_qkv.size() != 3 * d || w.w_o.size() != d * d ||
      w.b_o.size() != d) {
    return absl::InvalidArgumentError("module weight sizes do not match d_model");
  }
  return absl::OkStatus();
}

AttentionParams HeadAttentionParams(const MultiHeadParams& p, const ProjectedQkv& qkv,
                                    float* concat, int64_t concat_ld) {
  const int dk = p.module->head_dim();
  AttentionParams a;
  static_cast<AttentionOptions&>(a) = p;  // the mask, causality, lengths, scale, mods and kind
  a.batch = p.batch;
  a.num_heads = a.num_kv_heads = p.module->num_heads;
  a.q_len = p.q_len;
  a.kv_len = p.kv_len;
  a.head_dim = a.v_head_dim = dk;
  // [B, L, h, d_k] through strides: batch entry b at row b·L, head t at column t·d_k.
  a.q = InputView{qkv.q, int64_t{p.q_len} * qkv.q_ld, dk, qkv.q_ld};
  a.k = InputView{qkv.k, int64_t{p.kv_len} * qkv.k_ld, dk, qkv.k_ld};
  a.v = InputView{qkv.v, int64_t{p.kv_len} * qkv.v_ld, dk, qkv.v_ld};
  a.input_dtype = qkv.dtype;
  a.out = StridedView<float>{concat, int64_t{p.q_len} * concat_ld, dk, concat_ld};
  a.weights = p.weights;
  return a;
}

double MultiHeadFlops(const MultiHeadParams& p) {
  const double d = p.module->d_model;
  const double projections =
      2.0 * p.batch * d * d * (2.0 * p.q_len + 2.0 * p.kv_len);  // Q, O over Lq; K, V over Lk
  const double attention = 4.0 * p.batch * static_cast<double>(p.q_len) * p.kv_len * d;
  return projections + attention;
}

}  // namespace attnserve::kernels
