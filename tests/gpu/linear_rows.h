// Linear attention's rows as the CPU backend computes them (kernels/cpu/linear_attention.cc):
// kernels/linear_state.h's functions, in its order, over an AttentionParams' float32 inputs. The
// CUDA kernel (kernels/cuda/linear_attention.h) rounds alike and takes the same features
// (kernels/feature_map.h), so its rows have exactly these bits with every feature map; the tests of
// that kernel on a device (cuda_backend_test.cc) and on the host emulation (tests/cuda_emu/)
// compare against them.
#ifndef ATTNSERVE_TESTS_GPU_LINEAR_ROWS_H_
#define ATTNSERVE_TESTS_GPU_LINEAR_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/linear_state.h"

namespace attnserve::kernels::cuda {

// [batch, num_heads, q_len, v_head_dim], packed. REQUIRES: p.input_dtype is FLOAT32, p.kind is
// kLinear.
inline std::vector<float> LinearRowsOnHost(const AttentionParams& p) {
  const int d = p.head_dim, dv = p.v_head_dim;
  std::vector<float> rows(size_t(p.batch) * p.num_heads * p.q_len * dv);
  std::vector<float> s(size_t(d) * dv), z(d), f(d);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      const int kvh = h / p.group_size();
      std::fill(s.begin(), s.end(), 0.0f);
      std::fill(z.begin(), z.end(), 0.0f);
      int added = 0;
      for (int i = 0; i < p.q_len; ++i) {
        for (const int limit = p.key_limit(b, i); added < limit; ++added) {
          const float* k = p.k.row<float>(b, kvh, added);
          std::copy_n(k, d, f.begin());
          ApplyFeatureMap(p.feature_map, f.data(), d);
          LinearAddKey(f.data(), p.v.row<float>(b, kvh, added), d, dv, s.data(), z.data());
        }
        std::copy_n(p.q.row<float>(b, h, i), d, f.begin());
        ApplyFeatureMap(p.feature_map, f.data(), d);
        const size_t row = (size_t(b) * p.num_heads + h) * p.q_len + i;
        LinearReadQuery(f.data(), s.data(), z.data(), d, dv, &rows[row * dv]);
      }
    }
  }
  return rows;
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_TESTS_GPU_LINEAR_ROWS_H_
