#include "kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"

namespace attnserve::kernels {
namespace {

// One row of attention in float64: scores over the allowed keys, softmax, weighted sum of v.
// `p` gives the shape and options; q_row[D] is the query and k_row(j)/v_row(j) the key and value
// rows of the row's kv head (float or double, so the multi-head path can keep its float64
// projections). Writes dense out_row[Dv] and weight_row[Lk].
// φ of linear attention (attention_params.h), in float64.
double Feature(FeatureMap map, double x) {
  switch (map) {
    case FeatureMap::kEluPlusOne:
      return x > 0 ? x + 1 : std::exp(x);
    case FeatureMap::kRelu:
      return x > 0 ? x : 0;
    case FeatureMap::kIdentity:
      return x;
  }
  return x;
}

// One row of linear attention by its definition: sum over the allowed keys of
// (φ(q)·φ(k_j)) v_j over sum of φ(q)·φ(k_j); weights as those terms over the normaliser.
template <typename T, typename KRow, typename VRow>
void LinearAttendRow(const AttentionParams& p, int b, int i, const T* q_row, KRow k_row, VRow v_row,
                     double* out_row, double* weight_row) {
  const int limit = p.key_limit(b, i);
  std::vector<double> fq(p.head_dim);
  for (int d = 0; d < p.head_dim; ++d) fq[d] = Feature(p.feature_map, q_row[d]);
  std::vector<double> w(p.kv_len, 0.0);
  double norm = 0;
  for (int j = 0; j < limit; ++j) {
    const auto* k = k_row(j);
    for (int d = 0; d < p.head_dim; ++d) w[j] += fq[d] * Feature(p.feature_map, k[d]);
    norm += w[j];
  }
  std::fill(out_row, out_row + p.v_head_dim, 0.0);
  for (int j = 0; j < p.kv_len; ++j) {
    weight_row[j] = norm != 0 ? w[j] / norm : 0.0;
    if (j >= limit || norm == 0) continue;
    const auto* v = v_row(j);
    for (int d = 0; d < p.v_head_dim; ++d) out_row[d] += weight_row[j] * v[d];
  }
}

template <typename T, typename KRow, typename VRow>
void AttendRow(const AttentionParams& p, int b, int h, int i, const T* q_row, KRow k_row,
               VRow v_row, double* out_row, double* weight_row) {
  if (p.kind == AttentionKind::kLinear) {
    return LinearAttendRow(p, b, i, q_row, k_row, v_row, out_row, weight_row);
  }
  const int limit = p.key_limit(b, i);
  const int start = p.key_start(i);
  const ScoreMods& mods = p.mods;
  const double aligned = static_cast<double>(i) + p.kv_len - p.q_len;  // i'
  std::vector<double> score(p.kv_len);
  std::vector<bool> allowed(p.kv_len);
  bool any_allowed = false;
  double max_score = -INFINITY;
  for (int j = 0; j < p.kv_len; ++j) {
    allowed[j] = j >= start && j < limit && (!p.mask.present() || p.mask.at(b, h, i, j) != 0);
    if (!allowed[j]) continue;
    const auto* k = k_row(j);
    double dot = 0;
    for (int d = 0; d < p.head_dim; ++d) dot += static_cast<double>(q_row[d]) * k[d];
    score[j] = dot * static_cast<double>(p.scale);
    if (mods.softcap != 0.0f) {
      const double cap = mods.softcap;
      score[j] = cap * std::tanh(score[j] / cap);
    }
    if (mods.alibi_slopes != nullptr) {
      score[j] -= static_cast<double>(mods.alibi_slopes[h]) * std::abs(j - aligned);
    }
    max_score = std::max(max_score, score[j]);
    any_allowed = true;
  }

  // The NaN rule (attention_params.h): a NaN or +Inf among the allowed scores makes the row
  // NaN; allowed scores of -Inf weigh 0, and a row of only -Inf is treated as fully blocked.
  bool poisoned = false;
  for (int j = 0; j < p.kv_len; ++j) {
    if (allowed[j] && (std::isnan(score[j]) || score[j] == INFINITY)) poisoned = true;
  }
  if (poisoned) {
    std::fill(weight_row, weight_row + p.kv_len, NAN);
    std::fill(out_row, out_row + p.v_head_dim, NAN);
    return;
  }
  if (max_score == -INFINITY) any_allowed = false;

  // Softmax over the allowed keys; with none allowed, every score is the same -1e9 fill, so
  // the reference softmax is uniform over all keys.
  double sum = 0;
  for (int j = 0; j < p.kv_len; ++j) {
    weight_row[j] =
        !any_allowed ? 1.0
                     : (allowed[j] && score[j] != -INFINITY ? std::exp(score[j] - max_score) : 0.0);
    sum += weight_row[j];
  }
  std::fill(out_row, out_row + p.v_head_dim, 0.0);
  for (int j = 0; j < p.kv_len; ++j) {
    weight_row[j] /= sum;
    if (weight_row[j] == 0.0) continue;  // blocked keys are never consulted (rule 3)
    const auto* v = v_row(j);
    for (int d = 0; d < p.v_head_dim; ++d) out_row[d] += weight_row[j] * v[d];
  }
}

// y[rows, n] = x[rows, n_in] · wᵀ + bias, float64 accumulation; w is [n, n_in].
template <typename In>
std::vector<double> Linear(const In* x, int64_t rows, int n_in, const float* w, const float* bias,
                           int n) {
  std::vector<double> y(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int o = 0; o < n; ++o) {
      double acc = bias[o];
      const float* wr = w + int64_t{o} * n_in;
      for (int c = 0; c < n_in; ++c) acc += static_cast<double>(x[r * n_in + c]) * wr[c];
      y[r * n + o] = acc;
    }
  }
  return y;
}

// Attention over float64 projected inputs laid out [B, L, h, d_k] (the layout the Linear
// produces), returning the concatenated heads [B, Lq, d_model] and weights [B, h, Lq, Lk].
void MultiHeadAttention64(const MultiHeadParams& p, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          std::vector<double>* concat, std::vector<double>* weights) {
  const int dm = p.module->d_model;
  const int h = p.module->num_heads;
  const int dk = p.module->head_dim();
  concat->assign(int64_t{p.batch} * p.q_len * dm, 0.0);
  weights->assign(int64_t{p.batch} * h * p.q_len * p.kv_len, 0.0);

  // Shape and options only; the rows come from the float64 buffers.
  const AttentionParams shape = HeadAttentionParams(p, ProjectedQkv{}, nullptr, dm);
  for (int b = 0; b < p.batch; ++b) {
    for (int t = 0; t < h; ++t) {
      auto k_row = [&](int j) { return &k[(int64_t{b} * p.kv_len + j) * dm + t * dk]; };
      auto v_row = [&](int j) { return &v[(int64_t{b} * p.kv_len + j) * dm + t * dk]; };
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t q_off = (int64_t{b} * p.q_len + i) * dm + t * dk;
        AttendRow(shape, b, t, i, &q[q_off], k_row, v_row, &(*concat)[q_off],
                  &(*weights)[((int64_t{b} * h + t) * p.q_len + i) * p.kv_len]);
      }
    }
  }
}

// A dense float32 copy of the [batch, heads, rows, cols] view `src` of element type `type`.
std::vector<float> Widen(DType type, const InputView& src, int batch, int heads, int rows, int cols,
                         InputView* dense) {
  std::vector<float> out(int64_t{batch} * heads * rows * cols);
  const size_t esize = DTypeSize(type);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < rows; ++i) {
        const char* row = static_cast<const char*>(src.data) + src.offset(b, h, i) * esize;
        ToFloat32(type, row, cols, &out[((int64_t{b} * heads + h) * rows + i) * cols]);
      }
    }
  }
  *dense = InputView{out.data(), int64_t{heads} * rows * cols, int64_t{rows} * cols, cols};
  return out;
}

// A float64 result rounded into float32 outputs; `weights` (the weights or the lse) may be null.
void ReferenceToFloat(const Reference64& r, float* out, float* weights) {
  for (size_t n = 0; n < r.out.size(); ++n) out[n] = static_cast<float>(r.out[n]);
  if (weights == nullptr) return;
  for (size_t n = 0; n < r.weights.size(); ++n) weights[n] = static_cast<float>(r.weights[n]);
}

}  // namespace

AttentionParams WithFloat32Inputs(const AttentionParams& p, Float32Inputs* storage) {
  if (p.input_dtype == DType::kFloat32) return p;
  AttentionParams f = p;
  f.input_dtype = DType::kFloat32;
  storage->q = Widen(p.input_dtype, p.q, p.batch, p.num_heads, p.q_len, p.head_dim, &f.q);
  storage->k = Widen(p.input_dtype, p.k, p.batch, p.num_kv_heads, p.kv_len, p.head_dim, &f.k);
  storage->v = Widen(p.input_dtype, p.v, p.batch, p.num_kv_heads, p.kv_len, p.v_head_dim, &f.v);
  return f;
}

MultiHeadParams WithFloat32Inputs(const MultiHeadParams& p, Float32Inputs* storage) {
  if (p.input_dtype == DType::kFloat32) return p;
  MultiHeadParams f = p;
  f.input_dtype = DType::kFloat32;
  const int64_t dm = p.module->d_model;
  auto widen = [&](const void* src, int64_t rows, std::vector<float>* dst) {
    dst->resize(rows * dm);
    ToFloat32(p.input_dtype, src, dst->size(), dst->data());
    return dst->data();
  };
  f.query = widen(p.query, int64_t{p.batch} * p.q_len, &storage->q);
  if (p.key == p.query) {
    f.key = f.query;
  } else {
    f.key = widen(p.key, int64_t{p.batch} * p.kv_len, &storage->k);
  }
  if (p.value == p.query) {
    f.value = f.query;
  } else if (p.value == p.key) {
    f.value = f.key;
  } else {
    f.value = widen(p.value, int64_t{p.batch} * p.kv_len, &storage->v);
  }
  return f;
}

Reference64 ReferenceAttention64(const AttentionParams& p16) {
  Float32Inputs widened;
  const AttentionParams p = WithFloat32Inputs(p16, &widened);
  Reference64 r;
  r.out.resize(int64_t{p.batch} * p.num_heads * p.q_len * p.v_head_dim);
  r.weights.resize(int64_t{p.batch} * p.num_heads * p.q_len * p.kv_len);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t row = (int64_t{b} * p.num_heads + h) * p.q_len + i;
        const int kvh = h / p.group_size();
        AttendRow(
            p, b, h, i, p.q.row<float>(b, h, i), [&](int j) { return p.k.row<float>(b, kvh, j); },
            [&](int j) { return p.v.row<float>(b, kvh, j); }, &r.out[row * p.v_head_dim],
            &r.weights[row * p.kv_len]);
      }
    }
  }
  return r;
}

void ReferenceAttention(const AttentionParams& p) {
  const Reference64 r = ReferenceAttention64(p);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t row = (int64_t{b} * p.num_heads + h) * p.q_len + i;
        float* o = p.out.row(b, h, i);
        for (int d = 0; d < p.v_head_dim; ++d)
          o[d] = static_cast<float>(r.out[row * p.v_head_dim + d]);
      }
    }
  }
  if (p.weights != nullptr) {
    for (size_t n = 0; n < r.weights.size(); ++n) p.weights[n] = static_cast<float>(r.weights[n]);
  }
}

Reference64 ReferenceMultiHead64(const MultiHeadParams& p16) {
  Float32Inputs widened;
  const MultiHeadParams p = WithFloat32Inputs(p16, &widened);
  const MultiHeadWeights& w = *p.module;
  const int dm = w.d_model;
  const int64_t q_rows = int64_t{p.batch} * p.q_len;
  const int64_t kv_rows = int64_t{p.batch} * p.kv_len;
  const auto* query = static_cast<const float*>(p.query);
  const auto* key = static_cast<const float*>(p.key);
  const auto* value = static_cast<const float*>(p.value);
  const std::vector<double> q = Linear(query, q_rows, dm, w.w_q(), w.b_q(), dm);
  const std::vector<double> k = Linear(key, kv_rows, dm, w.w_k(), w.b_k(), dm);
  const std::vector<double> v = Linear(value, kv_rows, dm, w.w_v(), w.b_v(), dm);
  Reference64 r;
  std::vector<double> concat;
  MultiHeadAttention64(p, q, k, v, &concat, &r.weights);
  r.out = Linear(concat.data(), q_rows, dm, w.w_o.data(), w.b_o.data(), dm);
  return r;
}

void ReferenceMultiHead(const MultiHeadParams& p) {
  ReferenceToFloat(ReferenceMultiHead64(p), p.out, p.weights);
}

std::vector<DeviceInfo> ReferenceBackend::devices() const {
  return {DeviceInfo{"cpu (reference, 1 thread)", 0}};
}

absl::Status ReferenceBackend::Attend(absl::Span<const AttentionParams> batch) {
  for (const AttentionParams& p : batch) ReferenceAttention(p);
  return absl::OkStatus();
}

absl::Status ReferenceBackend::MultiHead(absl::Span<const MultiHeadParams> batch) {
  for (const MultiHeadParams& p : batch) ReferenceMultiHead(p);
  return absl::OkStatus();
}

namespace {
// Element i of a cache or query array of type t, widened (exact).
double Element(DType t, const void* data, int64_t i) {
  switch (t) {
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}
}  // namespace

Reference64 ReferencePagedAttention64(const PagedAttentionParams& p) {
  Reference64 r;
  const int64_t rows = int64_t{p.total_q} * p.num_heads;
  r.out.assign(rows * p.v_head_dim, 0.0);
  std::vector<double> lse(rows, 0.0);
  const int group = p.num_heads / p.num_kv_heads;
  std::vector<double> scores, q, k, v;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int32_t* pages = p.page_table + int64_t{s} * p.max_pages_per_seq;
    const int kv_len = p.kv_lens[s];
    for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
      // The sequence's keys and values of this KV head, widened once (exactly) for the query
      // heads of its group: k[j * head_dim + d], v[j * v_head_dim + d]. With a window, only
      // those some row may see: the pages before them may be gone.
      const int first = p.window_left >= 0 ? std::max(0, kv_len - p.q_lens[s] - p.window_left) : 0;
      k.resize(int64_t{kv_len} * p.head_dim);
      v.resize(int64_t{kv_len} * p.v_head_dim);
      for (int j = first; j < kv_len; ++j) {
        const int64_t k0 = p.k_offset(pages[j / p.page_size], kvh, j % p.page_size);
        const int64_t v0 = p.v_offset(pages[j / p.page_size], kvh, j % p.page_size);
        for (int d = 0; d < p.head_dim; ++d) {
          k[int64_t{j} * p.head_dim + d] = Element(p.dtype, p.k_pages, k0 + d);
        }
        for (int d = 0; d < p.v_head_dim; ++d) {
          v[int64_t{j} * p.v_head_dim + d] = Element(p.dtype, p.v_pages, v0 + d);
        }
      }
      for (int i = 0; i < p.q_lens[s]; ++i) {
        const int64_t t = p.q_offsets[s] + i;
        const int pos = kv_len - p.q_lens[s] + i;
        const int keys = pos + 1;  // causal, bottom-right aligned
        // Keys before the window are blocked: the allowed ones are [start, keys).
        const int start = p.window_left >= 0 ? std::max(0, pos - p.window_left) : 0;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          q.resize(p.head_dim);
          for (int d = 0; d < p.head_dim; ++d) {
            q[d] = Element(p.q_dtype, p.q, (t * p.num_heads + h) * p.head_dim + d);
          }
          scores.assign(keys, -INFINITY);
          double max_score = -INFINITY;
          bool any_nan = false;  // std::max skips NaN: a NaN score must not look like -Inf
          for (int j = start; j < keys; ++j) {
            const double* kj = k.data() + int64_t{j} * p.head_dim;
            double dot = 0;
            for (int d = 0; d < p.head_dim; ++d) dot += q[d] * kj[d];
            double score = static_cast<double>(p.scale) * dot;
            if (p.softcap != 0.0f) score = p.softcap * std::tanh(score / p.softcap);
            if (p.alibi_slopes != nullptr) score -= double{p.alibi_slopes[h]} * (pos - j);
            scores[j] = score;
            max_score = std::max(max_score, scores[j]);
            any_nan |= std::isnan(scores[j]);
          }
          double* out = r.out.data() + (t * p.num_heads + h) * p.v_head_dim;
          if (max_score == -INFINITY && !any_nan) {
            // Every allowed score is -Inf: the row is treated as fully blocked and attends
            // uniformly to every key of the sequence, as a dense causal Attend's row does (the
            // NaN rule, attention_params.h), or with a window to every key of its window; its
            // log-sum-exp is -Inf.
            const int from = p.window_left >= 0 ? start : 0;
            const int to = p.window_left >= 0 ? keys : kv_len;
            for (int j = from; j < to; ++j) {
              const double* vj = v.data() + int64_t{j} * p.v_head_dim;
              for (int d = 0; d < p.v_head_dim; ++d) out[d] += vj[d] / (to - from);
            }
            lse[t * p.num_heads + h] = -INFINITY;
            continue;
          }
          double sum = 0;
          for (int j = start; j < keys; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
          for (int j = start; j < keys; ++j) {
            const double* vj = v.data() + int64_t{j} * p.v_head_dim;
            for (int d = 0; d < p.v_head_dim; ++d) out[d] += scores[j] / sum * vj[d];
          }
          lse[t * p.num_heads + h] = max_score + std::log(sum);
        }
      }
    }
  }
  r.weights = std::move(lse);  // [total_q, num_heads]: the log-sum-exp of each row
  return r;
}

void ReferencePagedAttention(const PagedAttentionParams& p) {
  ReferenceToFloat(ReferencePagedAttention64(p), p.out, p.lse);
}

absl::Status Backend::Project(absl::Span<const ProjectionParams> batch) {
  for (const ProjectionParams& p : batch) {
    const int dm = p.module->d_model;
    std::vector<float> x(static_cast<size_t>(p.rows) * dm);
    ToFloat32(p.x_type, p.x, x.size(), x.data());
    const std::vector<double> y = Linear(x.data(), p.rows, dm, p.w(), p.bias(), p.n());
    for (size_t i = 0; i < y.size(); ++i) p.y[i] = static_cast<float>(y[i]);
  }
  return absl::OkStatus();
}

absl::Status Backend::PagedAttention(const PagedAttentionParams& p) {
  if (p.store != nullptr && p.store->on_device()) {
    return absl::InternalError(
        absl::StrCat("backend ", name(), " cannot read KV pages held on a device"));
  }
  ReferencePagedAttention(p);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PageStore>> Backend::NewPageStore(const PageStoreShape& shape) {
  return NewHostPageStore(shape);
}

}  // namespace attnserve::kernels
