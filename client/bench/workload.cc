#include "client/bench/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"

namespace attnserve::bench {
namespace {

// The options every Attend and MultiHeadAttention request of the workload carries.
void SetOptions(const WorkloadOptions& o, v1::AttentionOptions* options) {
  options->set_causal(o.causal);
  options->set_kind(o.kind);
  options->set_feature_map(o.feature_map);
  if (o.window_left >= 0 || o.window_right >= 0) {
    options->mutable_window()->set_left(o.window_left);
    options->mutable_window()->set_right(o.window_right);
  }
  options->set_softcap(o.softcap);
  if (o.alibi) options->mutable_alibi()->set_standard(true);
}

absl::StatusOr<double> Number(absl::string_view s, absl::string_view what) {
  double v;
  if (!absl::SimpleAtod(s, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", s, "' is not a number"));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::vector<ShapeSpec>> ParseShapes(const std::string& text, int rank) {
  std::vector<ShapeSpec> out;
  for (absl::string_view entry : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    ShapeSpec spec;
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '@');
    if (parts.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat("--shapes: '", entry, "' has two '@'"));
    }
    if (parts.size() == 2) {
      auto w = Number(parts[1], "--shapes weight");
      if (!w.ok()) return w.status();
      if (*w <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--shapes: weight of '", entry, "' must be positive"));
      }
      spec.weight = *w;
    }
    std::vector<int64_t> dims;
    for (absl::string_view d : absl::StrSplit(parts[0], ',')) {
      int64_t v;
      if (!absl::SimpleAtoi(d, &v) || v < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--shapes: '", d, "' in '", entry, "' is not a positive integer"));
      }
      dims.push_back(v);
    }
    if (static_cast<int>(dims.size()) != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shapes: '", entry, "' needs ", rank,
                       rank == 4 ? " numbers B,H,L,D (attend)" : " numbers B,L (mha)"));
    }
    spec.batch = dims[0];
    if (rank == 4) {
      spec.heads = dims[1];
      spec.seq_len = dims[2];
      spec.head_dim = dims[3];
    } else {
      spec.seq_len = dims[1];
    }
    out.push_back(spec);
  }
  if (out.empty()) return absl::InvalidArgumentError("--shapes must name at least one shape");
  return out;
}

absl::StatusOr<SeqLenDist> ParseSeqLen(const std::string& text) {
  SeqLenDist d;
  if (text.empty() || text == "fixed") return d;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len must be fixed, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX or "
                     "choice:L1,L2,...; was '",
                     text, "'"));
  };
  if (parts[0] == "choice" && parts.size() == 2) {
    d.kind = SeqLenDist::kChoice;
    for (absl::string_view c : absl::StrSplit(parts[1], ',')) {
      int64_t v;
      if (!absl::SimpleAtoi(c, &v) || v < 1) return bad();
      d.choices.push_back(v);
    }
    return d;
  }
  std::vector<double> v;
  for (size_t i = 1; i < parts.size(); ++i) {
    auto n = Number(parts[i], "--seq_len");
    if (!n.ok()) return n.status();
    v.push_back(*n);
  }
  if (parts[0] == "uniform" && v.size() == 2 && v[0] >= 1 && v[1] >= v[0]) {
    d.kind = SeqLenDist::kUniform;
    d.a = v[0];
    d.b = v[1];
    return d;
  }
  if (parts[0] == "lognormal" && v.size() == 3 && v[0] >= 1 && v[1] >= 0 && v[2] >= 1) {
    d.kind = SeqLenDist::kLogNormal;
    d.a = v[0];
    d.b = v[1];
    d.max = v[2];
    return d;
  }
  return bad();
}

int64_t SeqLenDist::Draw(int64_t base, std::mt19937_64& rng) const {
  switch (kind) {
    case kFixed:
      return base;
    case kUniform:
      return std::uniform_int_distribution<int64_t>(static_cast<int64_t>(a),
                                                    static_cast<int64_t>(b))(rng);
    case kLogNormal: {
      const double x = std::lognormal_distribution<double>(std::log(a), b)(rng);
      return std::clamp<int64_t>(std::llround(x), 1, static_cast<int64_t>(max));
    }
    case kChoice:
      return choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)];
  }
  return base;
}

double AttendFlops(int64_t b, int64_t hq, int64_t lq, int64_t lk, int64_t d, int64_t dv) {
  return 2.0 * b * hq * lq * lk * static_cast<double>(d + dv);
}

double MultiHeadFlops(int64_t b, int64_t lq, int64_t lk, int64_t d_model) {
  const double dm2 = static_cast<double>(d_model) * d_model;
  return 2.0 * b * (2.0 * lq + 2.0 * lk) * dm2 + AttendFlops(b, 1, lq, lk, d_model, d_model);
}

absl::StatusOr<Workload> Workload::Create(const WorkloadOptions& o) {
  if (o.multi_head && o.d_model < 1) {
    return absl::InvalidArgumentError("d_model must be known for MultiHeadAttention");
  }
  Workload w;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal;
  auto random = [&](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return MakeTensor(o.dtype, shape, v);
  };
  // With a length distribution the pool holds pool_size draws, spread over the shapes by their
  // weights; without one, one request per shape, drawn with its weight.
  std::vector<std::pair<ShapeSpec, double>> plan;
  if (o.seq_len.kind == SeqLenDist::kFixed) {
    for (const ShapeSpec& s : o.shapes) plan.push_back({s, s.weight});
  } else {
    std::vector<double> weights;
    for (const ShapeSpec& s : o.shapes) weights.push_back(s.weight);
    std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
    for (int i = 0; i < std::max(1, o.pool_size); ++i) {
      ShapeSpec s = o.shapes[pick(rng)];
      s.seq_len = o.seq_len.Draw(s.seq_len, rng);
      plan.push_back({s, 1.0});
    }
  }
  for (const auto& [s, weight] : plan) {
    Prepared p;
    p.tokens = s.batch * s.seq_len;
    if (o.decode) {
      const int64_t kv = o.kv_heads > 0 ? o.kv_heads : s.heads;
      auto r = std::make_shared<v1::ExtendSessionRequest>();
      *r->mutable_query() = random({1, s.heads, s.head_dim});
      *r->mutable_key() = random({1, kv, s.head_dim});
      *r->mutable_value() = random({1, kv, s.head_dim});
      p.tokens = 1;
      p.flops = AttendFlops(1, s.heads, 1, std::max<int64_t>(1, o.decode_context), s.head_dim,
                            s.head_dim);
      p.bytes = static_cast<int64_t>(r->ByteSizeLong());
      p.label = absl::StrCat("step ", s.heads, "x", s.head_dim);
      p.extend = std::move(r);
    } else if (!o.multi_head) {
      const int64_t kv = o.kv_heads > 0 ? o.kv_heads : s.heads;
      auto r = std::make_shared<v1::AttendRequest>();
      *r->mutable_query() = random({s.batch, s.heads, s.seq_len, s.head_dim});
      *r->mutable_key() = random({s.batch, kv, s.seq_len, s.head_dim});
      *r->mutable_value() = random({s.batch, kv, s.seq_len, s.head_dim});
      SetOptions(o, r->mutable_options());
      p.flops = AttendFlops(s.batch, s.heads, s.seq_len, s.seq_len, s.head_dim, s.head_dim);
      p.bytes = static_cast<int64_t>(r->ByteSizeLong());
      p.label = absl::StrCat(s.batch, "x", s.heads, "x", s.seq_len, "x", s.head_dim);
      p.attend = std::move(r);
    } else {
      auto r = std::make_shared<v1::MultiHeadAttentionRequest>();
      r->set_module(o.module);
      *r->mutable_query() = random({s.batch, s.seq_len, o.d_model});
      SetOptions(o, r->mutable_options());
      p.flops = MultiHeadFlops(s.batch, s.seq_len, s.seq_len, o.d_model);
      p.bytes = static_cast<int64_t>(r->ByteSizeLong());
      p.label = absl::StrCat(s.batch, "x", s.seq_len, "x", o.d_model);
      p.mha = std::move(r);
    }
    w.items_.push_back(std::move(p));
    w.weights_.push_back(weight);
  }
  w.pick_ = std::discrete_distribution<size_t>(w.weights_.begin(), w.weights_.end());
  return w;
}

namespace {
template <typename F>
double Mean(const std::vector<Prepared>& items, const std::vector<double>& weights, F f) {
  double sum = 0, total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    sum += weights[i] * f(items[i]);
    total += weights[i];
  }
  return total > 0 ? sum / total : 0;
}
}  // namespace

double Workload::mean_tokens() const {
  return Mean(items_, weights_, [](const Prepared& p) { return double(p.tokens); });
}
double Workload::mean_flops() const {
  return Mean(items_, weights_, [](const Prepared& p) { return p.flops; });
}
double Workload::mean_bytes() const {
  return Mean(items_, weights_, [](const Prepared& p) { return double(p.bytes); });
}

}  // namespace attnserve::bench
