#include "tests/testing/requests.h"

#include <cmath>
#include <random>

#include "client/client.h"

namespace attnserve::testing {

std::vector<float> RandomNormal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

AttendCase MakeAttendCase(v1::Dtype dtype, const AttendShape& s, bool causal, bool return_weights,
                          uint32_t seed) {
  AttendCase c;
  *c.request.mutable_query() = MakeTensor(dtype, {s.b, s.hq, s.lq, s.d},
                                          RandomNormal(size_t(s.b) * s.hq * s.lq * s.d, 3 * seed));
  *c.request.mutable_key() = MakeTensor(
      dtype, {s.b, s.hkv, s.lk, s.d}, RandomNormal(size_t(s.b) * s.hkv * s.lk * s.d, 3 * seed + 1));
  *c.request.mutable_value() =
      MakeTensor(dtype, {s.b, s.hkv, s.lk, s.dv},
                 RandomNormal(size_t(s.b) * s.hkv * s.lk * s.dv, 3 * seed + 2));
  c.request.mutable_options()->set_causal(causal);
  c.request.mutable_options()->set_return_weights(return_weights);
  // The server computes on the values as the wire carries them (rounded to dtype).
  const std::vector<float> q = TensorToFloats(c.request.query()).value();
  const std::vector<float> k = TensorToFloats(c.request.key()).value();
  const std::vector<float> v = TensorToFloats(c.request.value()).value();
  kernels::AttentionParams p;
  p.batch = s.b;
  p.num_heads = s.hq;
  p.num_kv_heads = s.hkv;
  p.q_len = s.lq;
  p.kv_len = s.lk;
  p.head_dim = s.d;
  p.v_head_dim = s.dv;
  p.q = {q.data(), int64_t(s.hq) * s.lq * s.d, int64_t(s.lq) * s.d, s.d};
  p.k = {k.data(), int64_t(s.hkv) * s.lk * s.d, int64_t(s.lk) * s.d, s.d};
  p.v = {v.data(), int64_t(s.hkv) * s.lk * s.dv, int64_t(s.lk) * s.dv, s.dv};
  p.causal = causal;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  c.expected = kernels::ReferenceAttention64(p);
  return c;
}

double MaxAbsError(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    m = std::max(m, std::fabs(got[i] - want[i]));
  }
  return m;
}

}  // namespace attnserve::testing
