#include "server/transport/request_builder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"
#include "kernels/mask.h"

namespace attnserve::server {
namespace {

using kernels::DType;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return Elide(absl::StrCat("[", absl::StrJoin(shape, ", "), "]"));
}

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// The wire's element types and the kernels', one to one.
constexpr std::pair<v1::Dtype, DType> kDTypes[] = {{v1::DTYPE_FLOAT32, DType::kFloat32},
                                                   {v1::DTYPE_FLOAT16, DType::kFloat16},
                                                   {v1::DTYPE_BFLOAT16, DType::kBFloat16},
                                                   {v1::DTYPE_BOOL, DType::kBool}};

absl::StatusOr<DType> WireDType(v1::Dtype t) {
  for (const auto& [wire, kernel] : kDTypes) {
    if (wire == t) return kernel;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

v1::Dtype ProtoDType(DType t) {
  for (const auto& [wire, kernel] : kDTypes) {
    if (kernel == t) return wire;
  }
  return v1::DTYPE_UNSPECIFIED;
}

// The enum name, or the number for values this server does not know.
std::string DtypeString(v1::Dtype t) {
  const std::string& name = v1::Dtype_Name(t);
  return name.empty() ? absl::StrCat(static_cast<int>(t)) : name;
}

// Checks a tensor's rank, dims (>= 1, no overflow, element limit) and byte count, and returns
// its element count.
absl::StatusOr<int64_t> CheckTensor(const v1::Tensor& t, absl::string_view field, int rank,
                                    const Limits& limits) {
  if (t.shape_size() != rank) {
    return Invalid(field, ".shape must have ", absl::StrCat(rank), " dimensions; was ",
                   ShapeString(t.shape()));
  }
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = t.shape(i);
    if (d < 1) {
      return Invalid(field, absl::StrCat(".shape[", i, "] must be >= 1; was ", d));
    }
    if (n > limits.max_tensor_elements / d) {
      return absl::ResourceExhaustedError(
          absl::StrCat(field, ".shape ", ShapeString(t.shape()), " has more than the limit of ",
                       limits.max_tensor_elements, " elements (--max_tensor_elements)"));
    }
    n *= d;
  }
  auto dtype = WireDType(t.dtype());
  if (!dtype.ok()) {
    return Invalid(field, ".dtype must be FLOAT32, FLOAT16, BFLOAT16 or BOOL; was ",
                   DtypeString(t.dtype()));
  }
  const int64_t want = n * static_cast<int64_t>(kernels::DTypeSize(*dtype));
  if (static_cast<int64_t>(t.data().size()) != want) {
    return Invalid(field, absl::StrCat(".data must hold ", want, " bytes (shape ",
                                       ShapeString(t.shape()), " of ", kernels::DTypeName(*dtype),
                                       "); was ", t.data().size(), " bytes"));
  }
  return n;
}

absl::Status CheckFloatDType(const v1::Tensor& t, absl::string_view field, const v1::Tensor* like,
                             absl::string_view like_field) {
  if (t.dtype() != v1::DTYPE_FLOAT32 && t.dtype() != v1::DTYPE_FLOAT16 &&
      t.dtype() != v1::DTYPE_BFLOAT16) {
    return Invalid(field, ".dtype must be FLOAT32, FLOAT16 or BFLOAT16; was ",
                   DtypeString(t.dtype()));
  }
  if (like != nullptr && t.dtype() != like->dtype()) {
    return Invalid(field, ".dtype must equal ", like_field, ".dtype (",
                   v1::Dtype_Name(like->dtype()),
                   absl::StrCat("); was ", v1::Dtype_Name(t.dtype())));
  }
  return absl::OkStatus();
}

absl::Status CheckDimEqual(const v1::Tensor& t, absl::string_view field, int dim,
                           const v1::Tensor& ref, absl::string_view ref_field, int ref_dim) {
  if (t.shape(dim) != ref.shape(ref_dim)) {
    return Invalid(
        field, absl::StrCat(".shape[", dim, "] must equal "), ref_field,
        absl::StrCat(".shape[", ref_dim, "] (", ref.shape(ref_dim), "); was ", t.shape(dim)));
  }
  return absl::OkStatus();
}

absl::Status CheckSequence(int64_t len, absl::string_view what, const Limits& limits) {
  if (len > limits.max_sequence_length) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " is ", len, "; the server's limit (--max_sequence_length) is ",
                     limits.max_sequence_length));
  }
  return absl::OkStatus();
}

absl::Status CheckHeadDim(int64_t d, absl::string_view what, const Limits& limits) {
  if (d > limits.max_head_dim) {
    return Invalid(what, absl::StrCat(" is ", d, "; the kernels support head dimensions up to ",
                                      limits.max_head_dim));
  }
  return absl::OkStatus();
}

// A feature map of linear attention (FeatureMap; unset: ELU_PLUS_ONE), named `field` in errors.
absl::Status BuildFeatureMap(v1::FeatureMap map, absl::string_view field,
                             kernels::FeatureMap* out) {
  switch (map) {
    case v1::FEATURE_MAP_UNSPECIFIED:
    case v1::FEATURE_MAP_ELU_PLUS_ONE:
      *out = kernels::FeatureMap::kEluPlusOne;
      return absl::OkStatus();
    case v1::FEATURE_MAP_RELU:
      *out = kernels::FeatureMap::kRelu;
      return absl::OkStatus();
    case v1::FEATURE_MAP_IDENTITY:
      *out = kernels::FeatureMap::kIdentity;
      return absl::OkStatus();
    default:
      return Invalid(absl::StrCat(field,
                                  " must be one of FEATURE_MAP_ELU_PLUS_ONE, FEATURE_MAP_RELU, "
                                  "FEATURE_MAP_IDENTITY; was ",
                                  static_cast<int>(map)));
  }
}

// The name of a feature map that has one, else its number (for messages).
std::string FeatureMapName(v1::FeatureMap map) {
  const std::string& name = v1::FeatureMap_Name(map);
  return name.empty() ? absl::StrCat(static_cast<int>(map)) : name;
}

// A kind of attention and its feature map (AttentionOptions and CreateSessionRequest:
// attention.proto), each field named `prefix` + its name in errors: *linear when LINEAR, whose
// feature map goes to *feature_map, and which refuses every option `not_linear` names as set.
absl::Status BuildAttentionKind(v1::AttentionKind kind, v1::FeatureMap map,
                                absl::string_view prefix,
                                std::initializer_list<std::pair<bool, const char*>> not_linear,
                                bool* linear, kernels::FeatureMap* feature_map) {
  *linear = false;
  switch (kind) {
    case v1::ATTENTION_KIND_UNSPECIFIED:
    case v1::ATTENTION_KIND_SOFTMAX:
      if (map != v1::FEATURE_MAP_UNSPECIFIED) {
        return Invalid(absl::StrCat(prefix,
                                    "feature_map applies to kind ATTENTION_KIND_LINEAR only; was ",
                                    FeatureMapName(map), " with softmax attention"));
      }
      return absl::OkStatus();
    case v1::ATTENTION_KIND_LINEAR:
      break;
    default:
      return Invalid(absl::StrCat(
          prefix, "kind must be ATTENTION_KIND_SOFTMAX or ATTENTION_KIND_LINEAR (or unset); was ",
          static_cast<int>(kind)));
  }
  for (const auto& [set, name] : not_linear) {
    if (set) {
      return Invalid(absl::StrCat(prefix, name,
                                  " does not apply to kind ATTENTION_KIND_LINEAR (linear "
                                  "attention has no softmax over scores)"));
    }
  }
  if (absl::Status s = BuildFeatureMap(map, absl::StrCat(prefix, "feature_map"), feature_map);
      !s.ok()) {
    return s;
  }
  *linear = true;
  return absl::OkStatus();
}

// AttentionOptions.kind LINEAR and what it does not take (attention.proto).
absl::Status BuildKind(const v1::AttentionOptions& options, const Limits& limits,
                       kernels::AttentionOptions* f) {
  bool linear = false;
  if (absl::Status s = BuildAttentionKind(options.kind(), options.feature_map(), "options.",
                                          {{options.has_mask(), "mask"},
                                           {options.has_window(), "window"},
                                           {options.softcap() != 0, "softcap"},
                                           {options.has_alibi(), "alibi"},
                                           {options.has_scale(), "scale"},
                                           {options.return_weights(), "return_weights"}},
                                          &linear, &f->feature_map);
      !s.ok() || !linear) {
    return s;
  }
  const std::string kind = v1::AttentionKind_Name(options.kind());
  if (!limits.linear_attention) {
    return absl::UnimplementedError(
        absl::StrCat("options.kind ", kind,
                     " is not implemented by this server's backend yet (the cuda backend lacks it; "
                     "--backend=cpu computes it)"));
  }
  f->kind = kernels::AttentionKind::kLinear;
  return absl::OkStatus();
}

// The standard ALiBi slopes for `heads` heads (attention.proto, Alibi.standard), as BLOOM
// computes them: 2^(-8h/n) for h = 1..n with n the largest power of two <= heads, then every
// other slope of 2n for the heads left over.
std::vector<float> StandardAlibiSlopes(int64_t heads) {
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<float> slopes;
  for (int64_t h = 1; h <= n; ++h) slopes.push_back(static_cast<float>(std::exp2(-8.0 * h / n)));
  for (int64_t h = 1; static_cast<int64_t>(slopes.size()) < heads; h += 2) {
    slopes.push_back(static_cast<float>(std::exp2(-8.0 * h / (2 * n))));
  }
  return slopes;
}

// A soft-cap (attention.proto, AttentionOptions.softcap and CreateSessionRequest.softcap) named
// `field` in errors.
absl::Status CheckSoftcap(float softcap, absl::string_view field) {
  if (!std::isfinite(softcap) || softcap < 0) {
    return Invalid(absl::StrCat(field, " must be finite and >= 0; was ", softcap));
  }
  return absl::OkStatus();
}

// ALiBi slopes for `heads` query heads from `alibi` (slopes or standard), named `field` in
// errors.
absl::Status BuildAlibi(const v1::Alibi& alibi, int64_t heads, absl::string_view field,
                        std::vector<float>* slopes) {
  if (alibi.standard() == (alibi.slopes_size() != 0)) {
    return Invalid(absl::StrCat(field, " must hold either slopes (H = ", heads,
                                " entries) or standard: true; had ", alibi.slopes_size(),
                                " slopes and standard ", alibi.standard() ? "true" : "false"));
  }
  if (alibi.standard()) {
    *slopes = StandardAlibiSlopes(heads);
    return absl::OkStatus();
  }
  if (alibi.slopes_size() != heads) {
    return Invalid(absl::StrCat(field, ".slopes must hold H (", heads, ") entries; had ",
                                alibi.slopes_size()));
  }
  for (int i = 0; i < alibi.slopes_size(); ++i) {
    if (!std::isfinite(alibi.slopes(i))) {
      return Invalid(absl::StrCat(field, ".slopes[", i, "] must be finite; was ", alibi.slopes(i)));
    }
  }
  slopes->assign(alibi.slopes().begin(), alibi.slopes().end());
  return absl::OkStatus();
}

// Validates and decodes the options shared by both rpcs into the kernels' form (AttentionParams
// and MultiHeadParams derive from it; what the options own, such as the ALiBi slopes, goes into
// `job`). `b`, `h`, `lq`, `lk`, `head_dim` are the problem's sizes.
absl::StatusOr<kernels::AttentionOptions> BuildOptions(const v1::AttentionOptions& options,
                                                       int64_t b, int64_t h, int64_t lq, int64_t lk,
                                                       int64_t head_dim, const Limits& limits,
                                                       Job* job) {
  kernels::AttentionOptions f;
  f.causal = options.causal();
  if (absl::Status s = BuildKind(options, limits, &f); !s.ok()) return s;

  if (options.has_mask()) {
    const v1::Tensor& m = options.mask();
    if (m.dtype() != v1::DTYPE_BOOL) {
      return Invalid("options.mask.dtype must be BOOL; was ", DtypeString(m.dtype()));
    }
    auto n = CheckTensor(m, "options.mask", m.shape_size() == 0 ? 1 : m.shape_size(), limits);
    if (!n.ok()) return n.status();
    job->mask.assign(m.data().begin(), m.data().end());
    for (size_t i = 0; i < job->mask.size(); ++i) {
      if (job->mask[i] > 1) {
        return Invalid("options.mask.data must hold 0 or 1 per element; element ",
                       absl::StrCat(i, " was ", job->mask[i]));
      }
    }
    auto view = kernels::BroadcastMask(
        job->mask.data(), absl::MakeConstSpan(m.shape().data(), m.shape_size()), b, h, lq, lk);
    if (!view.ok()) return Invalid("options.", view.status().message());
    f.mask = *view;
  }

  if (options.key_lengths_size() != 0) {
    if (options.key_lengths_size() != b) {
      return Invalid(absl::StrCat("options.key_lengths must be empty or hold B (", b,
                                  ") entries; had ", options.key_lengths_size()));
    }
    for (int i = 0; i < options.key_lengths_size(); ++i) {
      const int32_t len = options.key_lengths(i);
      if (len < 0 || len > lk) {
        return Invalid(
            absl::StrCat("options.key_lengths[", i, "] must be in [0, Lk = ", lk, "]; was ", len));
      }
    }
    job->key_lengths.assign(options.key_lengths().begin(), options.key_lengths().end());
    f.key_lengths = job->key_lengths.data();
  }

  f.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (options.has_scale()) {
    if (!std::isfinite(options.scale())) {
      return Invalid(absl::StrCat("options.scale must be finite; was ", options.scale()));
    }
    f.scale = options.scale();
  }

  if (options.has_window()) {
    for (const auto& [name, bound] :
         {std::pair<const char*, int32_t>{"left", options.window().left()},
          {"right", options.window().right()}}) {
      if (bound < -1) {
        return Invalid(
            absl::StrCat("options.window.", name, " must be >= -1 (-1: open); was ", bound));
      }
    }
    f.mods.window_left = options.window().left();
    f.mods.window_right = options.window().right();
  }
  if (absl::Status s = CheckSoftcap(options.softcap(), "options.softcap"); !s.ok()) return s;
  f.mods.softcap = options.softcap();
  if (options.has_alibi()) {
    if (absl::Status s = BuildAlibi(options.alibi(), h, "options.alibi", &job->alibi_slopes);
        !s.ok()) {
      return s;
    }
    f.mods.alibi_slopes = job->alibi_slopes.data();
  }

  if (options.return_weights()) {
    const int64_t n = b * h * lq * lk;  // each factor is bounded, so no overflow
    if (n > limits.max_tensor_elements) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "options.return_weights: the weights [", b, ", ", h, ", ", lq, ", ", lk, "] would hold ",
          n, " elements; the server's limit (--max_tensor_elements) is ",
          limits.max_tensor_elements));
    }
    job->weights.resize(n);
    job->weights_shape = {b, h, lq, lk};
  }
  return f;
}

// Fills what AttentionParams and MultiHeadParams share: the weights output, the options and the
// inputs' element type.
template <typename Params>
void FillShared(const kernels::AttentionOptions& opts, Job* job, Params* p) {
  p->weights = job->weights.empty() ? nullptr : job->weights.data();
  static_cast<kernels::AttentionOptions&>(*p) = opts;
  // The inputs are views of the request's bytes, in the dtype they came in.
  p->input_dtype = job->dtype;
}

// The sizes the batcher and the metrics read: tokens (query rows), bytes held while queued
// (inputs and outputs), floating-point operations.
void SetSizes(int64_t tokens, double flops, Job* job) {
  job->tokens = tokens;
  job->bytes = job->input_bytes + static_cast<int64_t>(sizeof(float)) *
                                      static_cast<int64_t>(job->out.size() + job->weights.size());
  job->flops = flops;
}

// The signature: what must be equal for jobs to share a kernel launch.
// Linear attention is a signature of its own: a batch is of one kind, computed by one backend
// (the executor's fallback when the backend lacks it).
std::string Signature(const Job& job, absl::string_view extra) {
  return absl::StrCat(job.kind == JobKind::kAttend ? "attend" : "mha", "/",
                      kernels::DTypeName(job.dtype), "/", extra, "/w",
                      job.weights_shape.empty() ? 0 : 1,
                      job.attention_kind() == kernels::AttentionKind::kLinear ? "/linear" : "");
}

// Key and value beside a checked query: of the query's dtype, valid tensors of `rank`
// dimensions, with the query's batch dimension 0 (the value's as well: the rank-3 callers
// compare the rest of the value with the key).
absl::Status CheckKeyAndValue(const v1::Tensor& k, const v1::Tensor& v, const v1::Tensor& q,
                              int rank, const Limits& limits) {
  if (auto s = CheckFloatDType(k, "key", &q, "query"); !s.ok()) return s;
  if (auto s = CheckFloatDType(v, "value", &q, "query"); !s.ok()) return s;
  if (auto n = CheckTensor(k, "key", rank, limits); !n.ok()) return n.status();
  if (auto n = CheckTensor(v, "value", rank, limits); !n.ok()) return n.status();
  if (auto s = CheckDimEqual(k, "key", 0, q, "query", 0); !s.ok()) return s;
  return CheckDimEqual(v, "value", 0, q, "query", 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> BuildAttendJob(const v1::AttendRequest& request,
                                                    const Limits& limits) {
  const v1::Tensor& q = request.query();
  const v1::Tensor& k = request.key();
  const v1::Tensor& v = request.value();
  if (!request.has_query()) return Invalid("query is required");
  if (!request.has_key()) return Invalid("key is required");
  if (!request.has_value()) return Invalid("value is required");
  if (auto s = CheckFloatDType(q, "query", nullptr, ""); !s.ok()) return s;
  auto nq = CheckTensor(q, "query", 4, limits);
  if (!nq.ok()) return nq.status();
  // q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]
  if (auto s = CheckKeyAndValue(k, v, q, 4, limits); !s.ok()) return s;
  if (auto s = CheckDimEqual(k, "key", 3, q, "query", 3); !s.ok()) return s;
  if (auto s = CheckDimEqual(v, "value", 1, k, "key", 1); !s.ok()) return s;
  if (auto s = CheckDimEqual(v, "value", 2, k, "key", 2); !s.ok()) return s;
  const int64_t b = q.shape(0), hq = q.shape(1), lq = q.shape(2), d = q.shape(3);
  const int64_t hkv = k.shape(1), lk = k.shape(2), dv = v.shape(3);
  if (hq % hkv != 0) {
    return Invalid(absl::StrCat("query.shape[1] (Hq = ", hq,
                                ") must be a multiple of key.shape[1] (Hkv = ", hkv, ")"));
  }
  if (auto s = CheckHeadDim(d, "query.shape[3] (head dim D)", limits); !s.ok()) return s;
  if (auto s = CheckHeadDim(dv, "value.shape[3] (head dim Dv)", limits); !s.ok()) return s;
  if (auto s = CheckSequence(lq, "query.shape[2] (Lq)", limits); !s.ok()) return s;
  if (auto s = CheckSequence(lk, "key.shape[2] (Lk)", limits); !s.ok()) return s;
  const int64_t n_out = b * hq * lq * dv;
  if (n_out > limits.max_tensor_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the output [", b, ", ", hq, ", ", lq, ", ", dv, "] would hold ", n_out,
        " elements; the server's limit (--max_tensor_elements) is ", limits.max_tensor_elements));
  }

  auto job = std::make_unique<Job>();
  job->kind = JobKind::kAttend;
  job->dtype = WireDType(q.dtype()).value();
  auto opts = BuildOptions(request.options(), b, hq, lq, lk, d, limits, job.get());
  if (!opts.ok()) return opts.status();

  job->input_bytes = static_cast<int64_t>(q.data().size() + k.data().size() + v.data().size());
  job->out.resize(n_out);
  job->out_shape = {b, hq, lq, dv};

  kernels::AttentionParams& p = job->attend;
  p.batch = static_cast<int>(b);
  p.num_heads = static_cast<int>(hq);
  p.num_kv_heads = static_cast<int>(hkv);
  p.q_len = static_cast<int>(lq);
  p.kv_len = static_cast<int>(lk);
  p.head_dim = static_cast<int>(d);
  p.v_head_dim = static_cast<int>(dv);
  p.q = {q.data().data(), hq * lq * d, lq * d, d};
  p.k = {k.data().data(), hkv * lk * d, lk * d, d};
  p.v = {v.data().data(), hkv * lk * dv, lk * dv, dv};
  p.out = {job->out.data(), hq * lq * dv, lq * dv, dv};
  FillShared(*opts, job.get(), &p);
  SetSizes(b * lq, kernels::AttentionFlops(p), job.get());
  job->signature = Signature(*job, absl::StrCat("h", hq, "/kv", hkv, "/d", d, "/dv", dv));
  return job;
}

absl::StatusOr<std::unique_ptr<Job>> BuildMultiHeadJob(const v1::MultiHeadAttentionRequest& request,
                                                       const ModuleRegistry& modules,
                                                       const Limits& limits) {
  if (auto s = ModuleRegistry::ValidateName(request.module(), "module"); !s.ok()) return s;
  auto module = modules.Get(request.module());
  if (!module.ok()) return module.status();
  const kernels::MultiHeadWeights& w = (*module)->weights;
  const int64_t dm = w.d_model;

  const v1::Tensor& q = request.query();
  if (!request.has_query()) return Invalid("query is required");
  if (request.has_key() != request.has_value()) {
    return Invalid(request.has_key() ? "value is required when key is given"
                                     : "key is required when value is given");
  }
  const bool self_attention = !request.has_key();
  const v1::Tensor& k = self_attention ? q : request.key();
  const v1::Tensor& v = self_attention ? q : request.value();
  if (auto s = CheckFloatDType(q, "query", nullptr, ""); !s.ok()) return s;
  auto nq = CheckTensor(q, "query", 3, limits);
  if (!nq.ok()) return nq.status();
  if (q.shape(2) != dm) {
    return Invalid(absl::StrCat("query.shape[2] must equal the d_model of module '",
                                request.module(), "' (", dm, "); was ", q.shape(2)));
  }
  if (!self_attention) {
    if (auto s = CheckKeyAndValue(k, v, q, 3, limits); !s.ok()) return s;
    if (auto s = CheckDimEqual(k, "key", 2, q, "query", 2); !s.ok()) return s;
    for (int i = 1; i < 3; ++i) {  // dimension 0: both the query's (CheckKeyAndValue)
      if (auto s = CheckDimEqual(v, "value", i, k, "key", i); !s.ok()) return s;
    }
  }
  const int64_t b = q.shape(0), lq = q.shape(1), lk = k.shape(1), h = w.num_heads;
  if (auto s = CheckSequence(lq, "query.shape[1] (Lq)", limits); !s.ok()) return s;
  if (auto s = CheckSequence(lk, "key.shape[1] (Lk)", limits); !s.ok()) return s;

  auto job = std::make_unique<Job>();
  job->kind = JobKind::kMultiHead;
  job->dtype = WireDType(q.dtype()).value();
  job->module = *module;
  auto opts = BuildOptions(request.options(), b, h, lq, lk, w.head_dim(), limits, job.get());
  if (!opts.ok()) return opts.status();

  job->input_bytes = static_cast<int64_t>(q.data().size() +
                                          (self_attention ? 0 : k.data().size() + v.data().size()));
  job->out.resize(*nq);
  job->out_shape = {b, lq, dm};

  kernels::MultiHeadParams& p = job->multi_head;
  p.module = &job->module->weights;
  p.batch = static_cast<int>(b);
  p.q_len = static_cast<int>(lq);
  p.kv_len = static_cast<int>(lk);
  p.query = q.data().data();
  p.key = k.data().data();  // the query's bytes for self-attention
  p.value = v.data().data();
  p.self_attention = self_attention;
  p.out = job->out.data();
  FillShared(*opts, job.get(), &p);
  SetSizes(b * lq, kernels::MultiHeadFlops(p), job.get());
  job->signature =
      Signature(*job, absl::StrCat("m:", request.module(), self_attention ? "/self" : "/cross"));
  return job;
}

namespace {

// The window, soft-cap and ALiBi slopes of a session with `heads` query heads (attention.proto,
// CreateSessionRequest).
absl::Status BuildSessionMods(const v1::CreateSessionRequest& request, int64_t heads,
                              const Limits& limits, sessions::SessionMods* mods) {
  if (request.has_window()) {
    if (request.window().left() < 0) {
      return Invalid(absl::StrCat("window.left must be >= 0 (the keys before each token's ",
                                  "position a session attends); was ", request.window().left()));
    }
    if (request.window().right() != 0 && request.window().right() != -1) {
      return Invalid(absl::StrCat("window.right must be 0 or -1 (a session is causal); was ",
                                  request.window().right()));
    }
    mods->window_left = request.window().left();
  }
  if (absl::Status s = CheckSoftcap(request.softcap(), "softcap"); !s.ok()) return s;
  mods->softcap = request.softcap();
  if (request.has_alibi()) {
    if (absl::Status s = BuildAlibi(request.alibi(), heads, "alibi", &mods->alibi_slopes);
        !s.ok()) {
      return s;
    }
  }
  if (mods->any() && !limits.session_score_mods) {
    return absl::UnimplementedError(
        "sessions with a window, softcap or alibi are not implemented by this server's backend "
        "(--backend=cpu and --backend=cuda compute them)");
  }
  return absl::OkStatus();
}

// CreateSessionRequest.kind and feature_map, and what LINEAR does not take (attention.proto).
absl::Status BuildSessionKind(const v1::CreateSessionRequest& request,
                              sessions::SessionSpec* spec) {
  bool linear = false;
  if (absl::Status s = BuildAttentionKind(request.kind(), request.feature_map(), "",
                                          {{request.has_window(), "window"},
                                           {request.softcap() != 0, "softcap"},
                                           {request.has_alibi(), "alibi"},
                                           {request.has_scale(), "scale"}},
                                          &linear, &spec->feature_map);
      !s.ok()) {
    return s;
  }
  if (linear) spec->kind = kernels::AttentionKind::kLinear;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<sessions::SessionSpec> BuildSessionSpec(const v1::CreateSessionRequest& request,
                                                       const ModuleRegistry& modules,
                                                       const Limits& limits) {
  sessions::SessionSpec spec;
  switch (request.binding_case()) {
    case v1::CreateSessionRequest::kModule: {
      if (auto s = ModuleRegistry::ValidateName(request.module(), "module"); !s.ok()) return s;
      auto module = modules.Get(request.module());
      if (!module.ok()) return module.status();
      spec.module_name = request.module();
      // Shares the registry entry's lifetime: an unloaded module lives on in its sessions.
      spec.module = std::shared_ptr<const kernels::MultiHeadWeights>(*module, &(*module)->weights);
      if (auto s = CheckHeadDim(spec.module->head_dim(), "the module's head dimension", limits);
          !s.ok()) {
        return s;
      }
      break;
    }
    case v1::CreateSessionRequest::kLayout: {
      const v1::HeadLayout& l = request.layout();
      const auto positive = [](int64_t v, absl::string_view field) {
        return v >= 1 ? absl::OkStatus()
                      : Invalid("layout.", field, absl::StrCat(" must be >= 1; was ", v));
      };
      if (auto s = positive(l.num_heads(), "num_heads"); !s.ok()) return s;
      if (auto s = positive(l.num_kv_heads(), "num_kv_heads"); !s.ok()) return s;
      if (auto s = positive(l.head_dim(), "head_dim"); !s.ok()) return s;
      if (l.v_head_dim() < 0) {
        return Invalid(absl::StrCat("layout.v_head_dim must be >= 0; was ", l.v_head_dim()));
      }
      if (l.num_heads() % l.num_kv_heads() != 0) {
        return Invalid(absl::StrCat("layout.num_heads (", l.num_heads(),
                                    ") must be a multiple of layout.num_kv_heads (",
                                    l.num_kv_heads(), ")"));
      }
      spec.num_heads = l.num_heads();
      spec.num_kv_heads = l.num_kv_heads();
      spec.head_dim = l.head_dim();
      spec.v_head_dim = l.v_head_dim() == 0 ? l.head_dim() : l.v_head_dim();
      if (auto s = CheckHeadDim(spec.head_dim, "layout.head_dim", limits); !s.ok()) return s;
      if (auto s = CheckHeadDim(spec.v_head_dim, "layout.v_head_dim", limits); !s.ok()) return s;
      break;
    }
    default:
      return Invalid("module or layout must be set; neither was");
  }
  const v1::Dtype t = request.cache_dtype();
  if (t != v1::DTYPE_FLOAT32 && t != v1::DTYPE_FLOAT16 && t != v1::DTYPE_BFLOAT16) {
    return Invalid("cache_dtype must be FLOAT32, FLOAT16 or BFLOAT16; was ", DtypeString(t));
  }
  spec.cache_dtype = WireDType(t).value();
  if (request.has_scale()) {
    if (!std::isfinite(request.scale())) {
      return Invalid(absl::StrCat("scale must be finite; was ", request.scale()));
    }
    spec.scale = request.scale();
  }
  if (request.idle_ttl_us() < 0) {
    return Invalid(absl::StrCat("idle_ttl_us must be >= 0; was ", request.idle_ttl_us()));
  }
  spec.pinned = request.pinned();
  spec.idle_ttl = absl::Microseconds(request.idle_ttl_us());
  if (absl::Status s = BuildSessionMods(
          request, spec.module != nullptr ? spec.module->num_heads : spec.num_heads, limits,
          &spec.mods);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = BuildSessionKind(request, &spec); !s.ok()) return s;
  return spec;
}

namespace {

// Validates one extend against its session and takes the session's lease.
// The index of the first NaN or infinity among the `n` elements of a float tensor's bytes, or
// -1. Blocks of 256 elements are tested without a branch (vectorised), and only a block that
// holds one is searched.
int64_t FirstNonFinite(kernels::DType dtype, const std::string& bytes, int64_t n) {
  const char* data = bytes.data();
  const auto scan = [&](auto zero, uint32_t exponent) -> int64_t {
    using Bits = decltype(zero);
    const auto bad = [&](int64_t i) {
      Bits b;
      std::memcpy(&b, data + i * sizeof(Bits), sizeof(Bits));
      return (b & exponent) == exponent;
    };
    constexpr int64_t kBlock = 256;
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t end = std::min(n, begin + kBlock);
      bool any = false;
      for (int64_t i = begin; i < end; ++i) any |= bad(i);
      if (!any) continue;
      for (int64_t i = begin; i < end; ++i) {
        if (bad(i)) return i;
      }
    }
    return -1;
  };
  switch (dtype) {
    case kernels::DType::kFloat32:
      return scan(uint32_t{0}, 0x7f800000u);
    case kernels::DType::kFloat16:
      return scan(uint16_t{0}, 0x7c00u);
    case kernels::DType::kBFloat16:
      return scan(uint16_t{0}, 0x7f80u);
    case kernels::DType::kBool:
      break;
  }
  return -1;
}

// Keys and values (or a module session's inputs, whose projections they become) stay in the
// cache: a NaN or an infinity there would make every later step of the session NaN. Refused,
// naming the element. `dims` names the tensor's dimensions, for the message.
absl::Status CheckCacheable(const v1::Tensor& t, absl::string_view field,
                            std::initializer_list<absl::string_view> dims) {
  const kernels::DType dtype = WireDType(t.dtype()).value();
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= d;
  const int64_t at = FirstNonFinite(dtype, t.data(), n);
  if (at < 0) return absl::OkStatus();
  float value;
  kernels::ToFloat32(dtype, t.data().data() + at * kernels::DTypeSize(dtype), 1, &value);
  std::string where;
  int64_t rest = at;
  std::vector<int64_t> index(t.shape_size());
  for (int i = t.shape_size() - 1; i >= 0; --i) {
    index[i] = rest % t.shape(i);
    rest /= t.shape(i);
  }
  int i = 0;
  for (absl::string_view d : dims) {
    absl::StrAppend(&where, i == 0 ? "" : ", ", d, " ", index[i]);
    ++i;
  }
  return Invalid(field, " must be finite: it is cached, and would make every later step of the ",
                 "session NaN; was ", value, " at element ", at, " (", where, ")");
}

absl::Status FillExtendItem(const v1::ExtendSessionRequest& r, const std::string& tenant,
                            sessions::SessionManager& manager, const Limits& limits,
                            sessions::ExtendItem* item) {
  if (r.session_id().empty()) return Invalid("session_id is required");
  if (r.has_expected_length() && r.expected_length() < 0) {
    return Invalid(absl::StrCat("expected_length must be >= 0; was ", r.expected_length()));
  }
  // The token count first (for the lease), then the shapes against the session's layout.
  const bool module = r.has_input();
  const v1::Tensor& first = module ? r.input() : r.query();
  if (!module && !r.has_query()) {
    return Invalid("input (module sessions) or query, key and value (raw sessions) are required");
  }
  if (auto s = CheckFloatDType(first, module ? "input" : "query", nullptr, ""); !s.ok()) return s;
  auto n = CheckTensor(first, module ? "input" : "query", module ? 2 : 3, limits);
  if (!n.ok()) return n.status();
  const int64_t L = first.shape(0);
  if (auto s = CheckSequence(L, module ? "input.shape[0] (L)" : "query.shape[0] (L)", limits);
      !s.ok()) {
    return s;
  }
  const std::optional<int64_t> expected =
      r.has_expected_length() ? std::optional<int64_t>(r.expected_length()) : std::nullopt;
  if (auto s = manager.BeginExtend(tenant, r.session_id(), expected, L, item); !s.ok()) return s;
  item->wire_dtype = WireDType(first.dtype()).value();
  item->return_lse = r.return_lse();
  if (item->return_lse && item->kind == kernels::AttentionKind::kLinear) {
    return Invalid("return_lse does not apply to session '", r.session_id(),
                   "': it computes linear attention, which has no scores to sum");
  }
  if (item->module != nullptr) {
    if (!module) {
      return Invalid("session '", r.session_id(), "' is bound to module '", item->module_name,
                     "': send input [L, d_model], not query, key and value");
    }
    if (r.has_query() || r.has_key() || r.has_value()) {
      return Invalid(
          "query, key and value must be unset for a module session; input carries "
          "the new tokens");
    }
    if (first.shape(1) != item->module->d_model) {
      return Invalid(absl::StrCat("input.shape[1] must equal the d_model of module '",
                                  item->module_name, "' (", item->module->d_model, "); was ",
                                  first.shape(1)));
    }
    if (auto s = CheckCacheable(first, "input", {"token", "column"}); !s.ok()) return s;
    item->input = first.data().data();
    return absl::OkStatus();
  }
  if (module) {
    return Invalid("session '", r.session_id(),
                   "' has a raw head layout: send query, key and value, not input");
  }
  if (!r.has_key()) return Invalid("key is required");
  if (!r.has_value()) return Invalid("value is required");
  const v1::Tensor& q = r.query();
  const v1::Tensor& k = r.key();
  const v1::Tensor& v = r.value();
  if (auto s = CheckFloatDType(k, "key", &q, "query"); !s.ok()) return s;
  if (auto s = CheckFloatDType(v, "value", &q, "query"); !s.ok()) return s;
  if (auto s = CheckTensor(k, "key", 3, limits); !s.ok()) return s.status();
  if (auto s = CheckTensor(v, "value", 3, limits); !s.ok()) return s.status();
  const auto dim = [&](const v1::Tensor& t, absl::string_view field, int i, int64_t want,
                       absl::string_view what) {
    return t.shape(i) == want
               ? absl::OkStatus()
               : Invalid(field, absl::StrCat(".shape[", i, "] must equal the session's "), what,
                         absl::StrCat(" (", want, "); was ", t.shape(i)));
  };
  if (auto s = dim(q, "query", 1, item->num_heads, "num_heads"); !s.ok()) return s;
  if (auto s = dim(q, "query", 2, item->head_dim, "head_dim"); !s.ok()) return s;
  if (auto s = dim(k, "key", 0, L, "new tokens, query.shape[0],"); !s.ok()) return s;
  if (auto s = dim(k, "key", 1, item->num_kv_heads, "num_kv_heads"); !s.ok()) return s;
  if (auto s = dim(k, "key", 2, item->head_dim, "head_dim"); !s.ok()) return s;
  if (auto s = dim(v, "value", 0, L, "new tokens, query.shape[0],"); !s.ok()) return s;
  if (auto s = dim(v, "value", 1, item->num_kv_heads, "num_kv_heads"); !s.ok()) return s;
  if (auto s = dim(v, "value", 2, item->v_head_dim, "v_head_dim"); !s.ok()) return s;
  if (auto s = CheckCacheable(k, "key", {"token", "kv head", "column"}); !s.ok()) return s;
  if (auto s = CheckCacheable(v, "value", {"token", "kv head", "column"}); !s.ok()) return s;
  item->q = q.data().data();
  item->k = k.data().data();
  item->v = v.data().data();
  return absl::OkStatus();
}

std::unique_ptr<sessions::ExtendItem> BuildExtendItem(const v1::ExtendSessionRequest& r,
                                                      const std::string& tenant,
                                                      sessions::SessionManager& manager,
                                                      const Limits& limits) {
  auto item = std::make_unique<sessions::ExtendItem>();
  item->status = FillExtendItem(r, tenant, manager, limits, item.get());
  if (!item->status.ok()) item->lease.End(false);
  return item;
}

std::unique_ptr<Job> SessionJob(sessions::SessionManager& manager) {
  auto job = std::make_unique<Job>();
  job->kind = JobKind::kSessionExtend;
  job->session_manager = &manager;
  return job;
}

// Sizes and signature: decode steps (every item one token) and prefills queue apart, so that
// neither waits behind the other's batches (the batcher serves the queue whose batch is due
// first); max_batch_tokens caps a prefill batch.
void SetSessionSizes(Job* job) {
  bool decode = true;
  for (const auto& item : job->session_items) {
    if (!item->status.ok()) continue;
    job->tokens += std::min(item->new_tokens, job->session_manager->options().prefill_chunk_tokens);
    decode = decode && item->new_tokens == 1;
    const int64_t in_elements =
        item->new_tokens * (item->module != nullptr
                                ? item->module->d_model
                                : item->num_heads * item->head_dim +
                                      item->num_kv_heads * (item->head_dim + item->v_head_dim));
    const int64_t out_elements =
        item->new_tokens *
        (item->module != nullptr ? item->module->d_model : item->num_heads * item->v_head_dim);
    job->input_bytes += in_elements * static_cast<int64_t>(kernels::DTypeSize(item->wire_dtype));
    job->bytes += job->input_bytes + out_elements * static_cast<int64_t>(sizeof(float));
  }
  job->signature = decode ? "session/decode" : "session/prefill";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> BuildExtendJob(const v1::ExtendSessionRequest& request,
                                                    const std::string& tenant,
                                                    sessions::SessionManager& manager,
                                                    const Limits& limits) {
  auto item = BuildExtendItem(request, tenant, manager, limits);
  if (!item->status.ok()) return item->status;
  auto job = SessionJob(manager);
  job->dtype = item->wire_dtype;
  job->session_items.push_back(std::move(item));
  SetSessionSizes(job.get());
  return job;
}

absl::StatusOr<std::unique_ptr<Job>> BuildExtendsJob(const v1::ExtendSessionsRequest& request,
                                                     const std::string& tenant,
                                                     sessions::SessionManager& manager,
                                                     const Limits& limits) {
  if (request.steps_size() == 0) return Invalid("steps must hold at least one extend; was empty");
  auto job = SessionJob(manager);
  job->session_batch = true;
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < request.steps_size(); ++i) {
    const v1::ExtendSessionRequest& step = request.steps(i);
    std::unique_ptr<sessions::ExtendItem> item;
    if (!step.session_id().empty() && !seen.insert(step.session_id()).second) {
      item = std::make_unique<sessions::ExtendItem>();
      item->status = Invalid(absl::StrCat("steps[", i, "].session_id '", step.session_id(),
                                          "' appears more than once; a session may appear "
                                          "only once per ExtendSessions"));
    } else {
      item = BuildExtendItem(step, tenant, manager, limits);
      if (!item->status.ok() && item->status.code() == absl::StatusCode::kInvalidArgument) {
        item->status = Invalid(absl::StrCat("steps[", i, "]: ", item->status.message()));
      }
    }
    if (item->status.ok()) job->dtype = item->wire_dtype;
    job->session_items.push_back(std::move(item));
  }
  SetSessionSizes(job.get());
  return job;
}

bool HasWork(const Job& job) {
  if (job.kind != JobKind::kSessionExtend) return true;
  for (const auto& item : job.session_items) {
    if (item->lease.active()) return true;
  }
  return false;
}

namespace {

v1::FeatureMap WireFeatureMap(kernels::FeatureMap map) {
  switch (map) {
    case kernels::FeatureMap::kEluPlusOne:
      return v1::FEATURE_MAP_ELU_PLUS_ONE;
    case kernels::FeatureMap::kRelu:
      return v1::FEATURE_MAP_RELU;
    case kernels::FeatureMap::kIdentity:
      return v1::FEATURE_MAP_IDENTITY;
  }
  return v1::FEATURE_MAP_UNSPECIFIED;
}

}  // namespace

void WriteSessionInfo(const sessions::SessionState& st, v1::SessionInfo* info) {
  info->set_session_id(st.id);
  if (!st.module_name.empty()) {
    info->set_module(st.module_name);
  } else {
    v1::HeadLayout* l = info->mutable_layout();
    l->set_num_heads(st.num_heads);
    l->set_num_kv_heads(st.num_kv_heads);
    l->set_head_dim(st.head_dim);
    l->set_v_head_dim(st.v_head_dim);
  }
  info->set_cache_dtype(ProtoDType(st.cache_dtype));
  info->set_length(st.length);
  info->set_pages(st.pages);
  info->set_shared_pages(st.shared_pages);
  info->set_bytes(st.bytes);
  info->set_pinned(st.pinned);
  info->set_idle_ttl_us(absl::ToInt64Microseconds(st.idle_ttl));
  info->set_idle_us(absl::ToInt64Microseconds(st.idle));
  info->set_parent_id(st.parent_id);
  info->set_scale(st.scale);
  if (st.mods.window_left >= 0) info->set_window_left(st.mods.window_left);
  info->set_softcap(st.mods.softcap);
  for (float slope : st.mods.alibi_slopes) info->add_alibi_slopes(slope);
  if (st.kind == kernels::AttentionKind::kLinear) {
    info->set_kind(v1::ATTENTION_KIND_LINEAR);
    info->set_feature_map(WireFeatureMap(st.feature_map));
  } else {
    info->set_kind(v1::ATTENTION_KIND_SOFTMAX);
  }
}

void WriteExtendResponse(const sessions::ExtendItem& item, const JobTiming& timing, absl::Time now,
                         v1::ExtendSessionResponse* response) {
  const int64_t L = item.new_tokens;
  if (item.module != nullptr) {
    WriteTensor(item.wire_dtype, item.out, {L, item.module->d_model}, response->mutable_output());
  } else {
    WriteTensor(item.wire_dtype, item.out, {L, item.num_heads, item.v_head_dim},
                response->mutable_output());
  }
  if (item.return_lse) {
    WriteTensor(DType::kFloat32, item.lse, {L, item.num_heads}, response->mutable_lse());
  }
  response->set_length(item.length_after);
  response->set_session_id(item.session_id);
  WriteTiming(timing, now, response->mutable_timing());
}

void FillResponse(Job& job, absl::Time now, v1::ExtendSessionResponse* response) {
  WriteExtendResponse(*job.session_items.front(), job.timing, now, response);
}

void FillResponse(Job& job, absl::Time now, v1::ExtendSessionsResponse* response) {
  for (const auto& item : job.session_items) {
    v1::ExtendSessionResult* result = response->add_results();
    result->set_code(static_cast<int>(item->status.code()));
    result->set_message(std::string(item->status.message()));
    result->set_moved_to(sessions::SessionManager::MovedTo(item->status));
    if (item->status.ok()) WriteExtendResponse(*item, job.timing, now, result->mutable_response());
  }
}

void WriteTensor(kernels::DType dtype, absl::Span<const float> values,
                 const std::vector<int64_t>& shape, v1::Tensor* out) {
  out->set_dtype(ProtoDType(dtype));
  for (int64_t d : shape) out->add_shape(d);
  if (dtype == DType::kFloat32) {
    // One copy, without first zero-filling the string as resize() would.
    out->set_data(values.data(), values.size() * sizeof(float));
    return;
  }
  std::string* data = out->mutable_data();
  data->resize(values.size() * kernels::DTypeSize(dtype));
  kernels::FromFloat32(dtype, values.data(), values.size(), data->data());
}

void ReleaseBuffers(Job* job) {
  for (std::vector<float>* v : {&job->out, &job->weights}) std::vector<float>().swap(*v);
  for (auto& item : job->session_items) {
    for (Buffer<float>* v : {&item->out, &item->lse}) Buffer<float>().swap(*v);
  }
  job->request.reset();
}

void WriteTiming(const JobTiming& timing, absl::Time now, v1::Timing* out) {
  out->set_queued_us(absl::ToInt64Microseconds(timing.compute_start - timing.arrival));
  out->set_compute_us(absl::ToInt64Microseconds(timing.compute_end - timing.compute_start));
  out->set_server_us(absl::ToInt64Microseconds(now - timing.arrival));
  out->set_batch_size(timing.batch_size);
  out->set_backend(timing.backend);
}

}  // namespace attnserve::server
