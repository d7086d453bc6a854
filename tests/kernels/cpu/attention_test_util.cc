#include "tests/kernels/cpu/attention_test_util.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/reference.h"

namespace attnserve::kernels::testing {
namespace {

float RoundThrough(DType dtype, float x) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(x));
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(x));
    default:
      return x;
  }
}

// y[rows, n] = x[rows, k] · wᵀ + bias, float accumulation.
std::vector<float> Linear32(const float* x, int64_t rows, int k, const float* w, const float* bias,
                            int n) {
  std::vector<float> y(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int o = 0; o < n; ++o) {
      float acc = 0.0f;
      for (int c = 0; c < k; ++c) acc += x[r * k + c] * w[int64_t{o} * k + c];
      y[r * n + o] = acc + bias[o];
    }
  }
  return y;
}

}  // namespace

std::string AttentionSpec::DebugString() const {
  std::string lengths;
  for (int32_t l : key_lengths) absl::StrAppend(&lengths, l, ",");
  return absl::StrCat("B=", batch, " Hq=", num_heads, " Hkv=", num_kv_heads, " Lq=", q_len,
                      " Lk=", kv_len, " D=", head_dim, " Dv=", v_head_dim,
                      " mask=", static_cast<int>(mask), " causal=", causal, " key_lengths=[",
                      lengths, "] dtype=", DTypeName(dtype), " interleaved=", interleaved,
                      " input_scale=", input_scale, " seed=", seed);
}

std::vector<float> RandomVector(int64_t n, uint32_t seed, DType dtype) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = RoundThrough(dtype, dist(rng));
  return v;
}

std::vector<uint16_t> Encode16(DType dtype, const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  FromFloat32(dtype, values.data(), values.size(), out.data());
  return out;
}

const void* InputData(DType dtype, const std::vector<float>& values,
                      std::vector<uint16_t>* storage) {
  if (dtype == DType::kFloat32) return values.data();
  *storage = Encode16(dtype, values);
  return storage->data();
}

AttentionCase::AttentionCase(const AttentionSpec& spec) : spec_(spec) {
  const AttentionSpec& s = spec_;
  q_ = RandomVector(int64_t{s.batch} * s.num_heads * s.q_len * s.head_dim, s.seed, s.dtype);
  for (float& x : q_) x = RoundThrough(s.dtype, x * s.input_scale);
  k_ = RandomVector(int64_t{s.batch} * s.num_kv_heads * s.kv_len * s.head_dim, s.seed + 1, s.dtype);
  v_ = RandomVector(int64_t{s.batch} * s.num_kv_heads * s.kv_len * s.v_head_dim, s.seed + 2,
                    s.dtype);
  if (s.dtype != DType::kFloat32) {
    q16_ = Encode16(s.dtype, q_);
    k16_ = Encode16(s.dtype, k_);
    v16_ = Encode16(s.dtype, v_);
  }
  out_.assign(int64_t{s.batch} * s.num_heads * s.q_len * s.v_head_dim, 0.0f);
  weights_.assign(int64_t{s.batch} * s.num_heads * s.q_len * s.kv_len, 0.0f);

  std::mt19937 rng(s.seed + 3);
  std::bernoulli_distribution keep(0.7);
  switch (s.mask) {
    case MaskKind::kNone:
      break;
    case MaskKind::kKeyPadding:
      mask_.resize(int64_t{s.batch} * s.kv_len);
      for (int b = 0; b < s.batch; ++b) {
        // A padded tail of random length, plus random holes.
        const int valid = static_cast<int>(rng() % (s.kv_len + 1));
        for (int j = 0; j < s.kv_len; ++j)
          mask_[int64_t{b} * s.kv_len + j] = j < valid && keep(rng);
      }
      mask_view_ = MaskView{mask_.data(), s.kv_len, 0, 0, 1};
      break;
    case MaskKind::kFull:
      mask_.resize(int64_t{s.batch} * s.num_heads * s.q_len * s.kv_len);
      for (auto& m : mask_) m = keep(rng);
      mask_view_ = MaskView{mask_.data(), int64_t{s.num_heads} * s.q_len * s.kv_len,
                            int64_t{s.q_len} * s.kv_len, s.kv_len, 1};
      break;
    case MaskKind::kBlockedRows:
      mask_.resize(int64_t{s.batch} * s.q_len * s.kv_len);
      for (auto& m : mask_) m = keep(rng);
      for (int b = 0; b < s.batch; ++b) {
        for (int i = 0; i < s.q_len; i += 3) {  // every third row fully blocked
          for (int j = 0; j < s.kv_len; ++j) mask_[(int64_t{b} * s.q_len + i) * s.kv_len + j] = 0;
        }
      }
      mask_view_ = MaskView{mask_.data(), int64_t{s.q_len} * s.kv_len, 0, s.kv_len, 1};
      break;
    case MaskKind::kRowBroadcast:
      mask_.resize(int64_t{s.batch} * s.q_len);
      for (auto& m : mask_) m = keep(rng);
      mask_view_ = MaskView{mask_.data(), s.q_len, 0, 1, 0};
      break;
  }
}

AttentionParams AttentionCase::params(bool with_weights) {
  return Params(with_weights, /*as_float32=*/false);
}

AttentionParams AttentionCase::float32_params(bool with_weights) {
  return Params(with_weights, /*as_float32=*/true);
}

AttentionParams AttentionCase::Params(bool with_weights, bool as_float32) {
  const AttentionSpec& s = spec_;
  const bool wide = as_float32 || s.dtype == DType::kFloat32;
  AttentionParams p;
  p.input_dtype = wide ? DType::kFloat32 : s.dtype;
  p.batch = s.batch;
  p.num_heads = s.num_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.q_len = s.q_len;
  p.kv_len = s.kv_len;
  p.head_dim = s.head_dim;
  p.v_head_dim = s.v_head_dim;
  // Dense [B, H, L, D], or interleaved [B, L, H, D] (the projected layout of the module).
  auto layout = [&](auto* data, int heads, int len, int dim) {
    using View =
        std::conditional_t<std::is_same_v<decltype(data), float*>, StridedView<float>, InputView>;
    if (s.interleaved) {
      return View{data, int64_t{len} * heads * dim, dim, int64_t{heads} * dim};
    }
    return View{data, int64_t{heads} * len * dim, int64_t{len} * dim, dim};
  };
  auto input = [&](const std::vector<float>& f, const std::vector<uint16_t>& h) {
    return wide ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
  };
  p.q = layout(input(q_, q16_), s.num_heads, s.q_len, s.head_dim);
  p.k = layout(input(k_, k16_), s.num_kv_heads, s.kv_len, s.head_dim);
  p.v = layout(input(v_, v16_), s.num_kv_heads, s.kv_len, s.v_head_dim);
  p.out = layout(out_.data(), s.num_heads, s.q_len, s.v_head_dim);
  p.weights = with_weights ? weights_.data() : nullptr;
  p.mask = mask_view_;
  p.causal = s.causal;
  p.key_lengths = s.key_lengths.empty() ? nullptr : s.key_lengths.data();
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  return p;
}

std::vector<float> AttentionCase::DenseOut() const {
  const AttentionSpec& s = spec_;
  if (!s.interleaved) return out_;
  std::vector<float> dense(out_.size());
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.num_heads; ++h) {
      for (int i = 0; i < s.q_len; ++i) {
        for (int c = 0; c < s.v_head_dim; ++c) {
          dense[((int64_t{b} * s.num_heads + h) * s.q_len + i) * s.v_head_dim + c] =
              out_[((int64_t{b} * s.q_len + i) * s.num_heads + h) * s.v_head_dim + c];
        }
      }
    }
  }
  return dense;
}

void AttentionCase::PoisonOutputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(out_.begin(), out_.end(), nan);
  std::fill(weights_.begin(), weights_.end(), nan);
}

void NaiveAttention32(const AttentionParams& p16, std::vector<float>* out,
                      std::vector<float>* weights) {
  Float32Inputs widened;
  const AttentionParams p = WithFloat32Inputs(p16, &widened);
  out->assign(int64_t{p.batch} * p.num_heads * p.q_len * p.v_head_dim, 0.0f);
  weights->assign(int64_t{p.batch} * p.num_heads * p.q_len * p.kv_len, 0.0f);
  std::vector<float> score(p.kv_len);
  std::vector<bool> allowed(p.kv_len);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      const int kvh = h / p.group_size();
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t row = (int64_t{b} * p.num_heads + h) * p.q_len + i;
        const float* q = p.q.row<float>(b, h, i);
        const int limit = p.key_limit(b, i);
        float mx = -INFINITY;
        bool any = false;
        for (int j = 0; j < p.kv_len; ++j) {
          allowed[j] = j < limit && (!p.mask.present() || p.mask.at(b, h, i, j) != 0);
          if (!allowed[j]) continue;
          const float* k = p.k.row<float>(b, kvh, j);
          float dot = 0.0f;
          for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
          score[j] = p.scale * dot;
          mx = std::max(mx, score[j]);
          any = true;
        }
        float* w = &(*weights)[row * p.kv_len];
        float sum = 0.0f;
        for (int j = 0; j < p.kv_len; ++j) {
          w[j] = !any ? 1.0f : (allowed[j] ? std::exp(score[j] - mx) : 0.0f);
          sum += w[j];
        }
        float* o = &(*out)[row * p.v_head_dim];
        for (int j = 0; j < p.kv_len; ++j) {
          w[j] /= sum;
          const float* v = p.v.row<float>(b, kvh, j);
          for (int d = 0; d < p.v_head_dim; ++d) o[d] += w[j] * v[d];
        }
      }
    }
  }
}

void NaiveMultiHead32(const MultiHeadParams& p16, std::vector<float>* out,
                      std::vector<float>* weights) {
  Float32Inputs widened;
  const MultiHeadParams p = WithFloat32Inputs(p16, &widened);
  const MultiHeadWeights& w = *p.module;
  const int dm = w.d_model;
  const int dk = w.head_dim();
  const int64_t q_rows = int64_t{p.batch} * p.q_len;
  const int64_t kv_rows = int64_t{p.batch} * p.kv_len;
  const auto* query = static_cast<const float*>(p.query);
  const auto* key = static_cast<const float*>(p.key);
  const auto* value = static_cast<const float*>(p.value);
  const std::vector<float> q = Linear32(query, q_rows, dm, w.w_q(), w.b_q(), dm);
  const std::vector<float> k = Linear32(key, kv_rows, dm, w.w_k(), w.b_k(), dm);
  const std::vector<float> v = Linear32(value, kv_rows, dm, w.w_v(), w.b_v(), dm);
  std::vector<float> concat(q_rows * dm);
  AttentionParams a;
  a.batch = p.batch;
  a.num_heads = a.num_kv_heads = w.num_heads;
  a.q_len = p.q_len;
  a.kv_len = p.kv_len;
  a.head_dim = a.v_head_dim = dk;
  a.q = {q.data(), int64_t{p.q_len} * dm, dk, dm};
  a.k = {k.data(), int64_t{p.kv_len} * dm, dk, dm};
  a.v = {v.data(), int64_t{p.kv_len} * dm, dk, dm};
  a.mask = p.mask;
  a.causal = p.causal;
  a.key_lengths = p.key_lengths;
  a.scale = p.scale;
  std::vector<float> heads;
  NaiveAttention32(a, &heads, weights);
  for (int b = 0; b < p.batch; ++b) {
    for (int t = 0; t < w.num_heads; ++t) {
      for (int i = 0; i < p.q_len; ++i) {
        for (int c = 0; c < dk; ++c) {
          concat[(int64_t{b} * p.q_len + i) * dm + t * dk + c] =
              heads[((int64_t{b} * w.num_heads + t) * p.q_len + i) * dk + c];
        }
      }
    }
  }
  *out = Linear32(concat.data(), q_rows, dm, w.w_o.data(), w.b_o.data(), dm);
}

double MaxAbsError(const std::vector<float>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double err = 0.0;
  for (size_t n = 0; n < a.size(); ++n) {
    if (!std::isfinite(a[n])) return INFINITY;
    err = std::max(err, std::abs(static_cast<double>(a[n]) - ref[n]));
  }
  return err;
}

bool AllFinite(const std::vector<float>& a) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

MultiHeadWeights RandomWeights(int d_model, int num_heads, uint32_t seed) {
  MultiHeadWeights w;
  w.d_model = d_model;
  w.num_heads = num_heads;
  std::mt19937 rng(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(d_model));
  std::uniform_real_distribution<float> dist(-bound, bound);
  auto fill = [&](std::vector<float>* v, int64_t n) {
    v->resize(n);
    for (float& x : *v) x = dist(rng);
  };
  const int64_t d = d_model;
  fill(&w.w_qkv, 3 * d * d);
  fill(&w.b_qkv, 3 * d);
  fill(&w.w_o, d * d);
  fill(&w.b_o, d);
  return w;
}

}  // namespace attnserve::kernels::testing
