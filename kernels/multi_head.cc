#include "kernels/multi_head.h"

#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"
#include "kernels/safetensors.h"

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

absl::StatusOr<MultiHeadWeights> WeightsFromSafetensors(const SafetensorsFile& file,
                                                        int num_heads) {
  MultiHeadWeights w;
  if (num_heads > 0) {
    w.num_heads = num_heads;
  } else if (num_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads must be >= 0; was ", num_heads));
  } else {
    auto it = file.metadata.find("num_heads");
    if (it == file.metadata.end()) {
      return absl::InvalidArgumentError(
          "num_heads is 0 and the safetensors metadata has no 'num_heads'");
    }
    if (!absl::SimpleAtoi(it->second, &w.num_heads) || w.num_heads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors metadata 'num_heads' must be a positive integer; was '",
                       Elide(it->second), "'"));
    }
  }

  // W_q.weight fixes d_model; every other tensor must agree with it.
  auto wq = file.Find("W_q.weight");
  if (!wq.ok()) return absl::InvalidArgumentError(wq.status().message());
  if ((*wq)->shape.size() != 2 || (*wq)->shape[0] != (*wq)->shape[1] || (*wq)->shape[0] < 1 ||
      (*wq)->shape[0] > (int64_t{1} << 16)) {
    return absl::InvalidArgumentError(
        "safetensors: 'W_q.weight' must be a square [d_model, d_model] matrix, "
        "1 <= d_model <= 65536");
  }
  w.d_model = static_cast<int>((*wq)->shape[0]);
  const int64_t d = w.d_model;
  w.w_qkv.reserve(3 * d * d);
  w.b_qkv.reserve(3 * d);

  auto append = [&](const std::string& name, std::vector<int64_t> shape,
                    std::vector<float>* dst) -> absl::Status {
    auto t = file.Find(name);
    if (!t.ok()) return absl::InvalidArgumentError(t.status().message());
    if ((*t)->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: '", name, "' has shape ",
                       Elide(absl::StrCat("[", absl::StrJoin((*t)->shape, ", "), "]")),
                       "; expected [", absl::StrJoin(shape, ", "), "]"));
    }
    auto values = (*t)->ToFloat32(name);
    if (!values.ok()) return values.status();
    dst->insert(dst->end(), values->begin(), values->end());
    return absl::OkStatus();
  };
  for (const char* p : {"W_q", "W_k", "W_v"}) {
    if (auto s = append(absl::StrCat(p, ".weight"), {d, d}, &w.w_qkv); !s.ok()) return s;
    if (auto s = append(absl::StrCat(p, ".bias"), {d}, &w.b_qkv); !s.ok()) return s;
  }
  if (auto s = append("W_o.weight", {d, d}, &w.w_o); !s.ok()) return s;
  if (auto s = append("W_o.bias", {d}, &w.b_o); !s.ok()) return s;
  if (auto s = ValidateWeights(w); !s.ok()) return s;
  return w;
}

AttentionParams HeadAttentionParams(const MultiHeadParams& p, const ProjectedQkv& qkv,
                                    float* concat, int64_t concat_ld) {
  const int dk = p.module->head_dim();
  AttentionParams a;
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
  a.mask = p.mask;
  a.causal = p.causal;
  a.key_lengths = p.key_lengths;
  a.scale = p.scale;
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
