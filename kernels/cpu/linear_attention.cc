#include "kernels/cpu/linear_attention.h"

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/linear_state.h"

namespace attnserve::kernels::cpu {
namespace {

// n elements of a row of `type` at `src`, widened to float32, then φ applied.
void Features(FeatureMap map, DType type, const void* src, int n, float* dst) {
  ToFloat32(type, src, static_cast<size_t>(n), dst);
  ApplyFeatureMap(map, dst, n);
}

const void* Row(const AttentionParams& p, const InputView& view, int b, int h, int i) {
  return static_cast<const char*>(view.data) + view.offset(b, h, i) * DTypeSize(p.input_dtype);
}

}  // namespace

void LinearAttentionHead(const AttentionParams& p, int b, int h) {
  const int dk = p.head_dim, dv = p.v_head_dim;
  const int kvh = h / p.group_size();
  std::vector<float> state(static_cast<size_t>(dk) * dv, 0.0f), z(dk, 0.0f);
  std::vector<float> feature(dk), value(dv), query(dk);
  // φ(k_j) into `feature`, v_j into `value`, in float32.
  auto load_key = [&](int j) {
    Features(p.feature_map, p.input_dtype, Row(p, p.k, b, kvh, j), dk, feature.data());
    ToFloat32(p.input_dtype, Row(p, p.v, b, kvh, j), static_cast<size_t>(dv), value.data());
  };
  int added = 0;  // keys [0, added) are in the state
  for (int i = 0; i < p.q_len; ++i) {
    // Limits never fall as i grows (causality bottom-right aligned; key lengths fixed).
    const int limit = p.key_limit(b, i);
    Features(p.feature_map, p.input_dtype, Row(p, p.q, b, h, i), dk, query.data());
    if (limit == added + 1) {  // one new key (causal self-attention's rows): one pass over S
      load_key(added++);
      LinearAddKeyReadQuery(feature.data(), value.data(), query.data(), dk, dv, state.data(),
                            z.data(), p.out.row(b, h, i));
      continue;
    }
    for (; added < limit; ++added) {
      load_key(added);
      LinearAddKey(feature.data(), value.data(), dk, dv, state.data(), z.data());
    }
    LinearReadQuery(query.data(), state.data(), z.data(), dk, dv, p.out.row(b, h, i));
  }
}

}  // namespace attnserve::kernels::cpu
