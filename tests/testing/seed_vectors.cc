#include "tests/testing/seed_vectors.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "kernels/mask.h"
#include "model/module_weights.h"
#include "model/safetensors.h"

namespace attnserve::testing {

std::string SeedVectorsDir() { return ATTNSERVE_SEED_VECTORS_DIR; }

std::vector<std::string> SeedCaseNames() {
  return {"blocked_rows", "causal", "cross_padding", "seed_demo"};
}

absl::StatusOr<SeedCase> LoadSeedCase(const std::string& name) {
  SeedCase c;
  c.name = name;
  auto bytes = ReadFileToString(absl::StrCat(SeedVectorsDir(), "/", name, ".safetensors"));
  if (!bytes.ok()) return bytes.status();
  c.bytes = *std::move(bytes);
  auto file = model::ParseSafetensors(c.bytes);
  if (!file.ok()) return file.status();
  auto weights = model::WeightsFromSafetensors(*file, 0);
  if (!weights.ok()) return weights.status();
  c.weights = *std::move(weights);

  auto floats = [&](const char* tensor,
                    std::vector<int64_t>* shape) -> absl::StatusOr<std::vector<float>> {
    auto t = file->Find(tensor);
    if (!t.ok()) return t.status();
    if (shape != nullptr) *shape = (*t)->shape;
    return (*t)->ToFloat32(tensor);
  };
  std::vector<int64_t> ignored;
  auto q = floats("input.query", &c.query_shape);
  auto k = floats("input.key", &c.key_shape);
  auto v = floats("input.value", &ignored);
  auto out = floats("expected.output", &ignored);
  auto w = floats("expected.weights", &ignored);
  for (const auto* s : {&q, &k, &v, &out, &w}) {
    if (!s->ok()) return s->status();
  }
  c.query = *q;
  c.key = *k;
  c.value = *v;
  c.expected_output = *out;
  c.expected_weights = *w;
  c.batch = static_cast<int>(c.query_shape[0]);
  c.q_len = static_cast<int>(c.query_shape[1]);
  c.kv_len = static_cast<int>(c.key_shape[1]);
  c.self_attention = c.query == c.key && c.query == c.value;

  if (auto m = file->Find("input.mask"); m.ok()) {
    auto values = (*m)->ToFloat32("input.mask");  // the cases store masks as F32 0/1
    if (!values.ok()) return values.status();
    for (float x : *values) c.mask.push_back(x != 0.0f ? 1 : 0);
    c.mask_shape = (*m)->shape;
  }
  return c;
}

kernels::MultiHeadParams SeedParams(const SeedCase& c, float* out, float* weights) {
  kernels::MultiHeadParams p;
  p.module = &c.weights;
  p.batch = c.batch;
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.query = c.query.data();
  p.key = c.self_attention ? c.query.data() : c.key.data();
  p.value = c.self_attention ? c.query.data() : c.value.data();
  p.self_attention = c.self_attention;
  p.out = out;
  p.weights = weights;
  if (!c.mask.empty()) {
    p.mask = kernels::BroadcastMask(c.mask.data(), c.mask_shape, c.batch, c.weights.num_heads,
                                    c.q_len, c.kv_len)
                 .value();
  }
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.weights.head_dim()));
  return p;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace attnserve::testing
