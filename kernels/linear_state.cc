#include "kernels/linear_state.h"

#include <cmath>
#include <cstdint>

namespace attnserve::kernels {

void ApplyFeatureMap(FeatureMap map, float* x, int n) {
  switch (map) {
    case FeatureMap::kEluPlusOne:
      for (int d = 0; d < n; ++d) x[d] = x[d] > 0 ? x[d] + 1.0f : std::exp(x[d]);
      break;
    case FeatureMap::kRelu:
      for (int d = 0; d < n; ++d) x[d] = x[d] > 0 ? x[d] : 0.0f;
      break;
    case FeatureMap::kIdentity:
      break;
  }
}

// The two loops over Dv below, compiled for AVX-512, AVX2 and the baseline, picked at load time
// by the CPU (GCC's target_clones): wider vectors, the same bits. Each output element is still
// computed as written, by one multiply and one add in the same order (no reassociation, and
// -ffp-contract=off, kernels/CMakeLists.txt: no fused multiply-add), so every clone, the
// sessions' steps and the CUDA kernel agree bit for bit (tests/cuda_emu/linear_attention_emu_test).
// Not under the sanitizers: the clones' resolver runs while the dynamic loader relocates the
// binary, before the sanitizer's runtime exists, and its instrumented entry crashed every
// ThreadSanitizer test binary at start.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define ATTNSERVE_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATTNSERVE_ISA_CLONES
#endif

ATTNSERVE_ISA_CLONES
void LinearAddKey(const float* feature, const float* value, int d, int dv, float* s, float* z) {
  for (int i = 0; i < d; ++i) {
    const float f = feature[i];
    z[i] += f;
    float* row = s + static_cast<int64_t>(i) * dv;
    for (int c = 0; c < dv; ++c) row[c] += f * value[c];
  }
}

ATTNSERVE_ISA_CLONES
void LinearReadQuery(const float* feature, const float* s, const float* z, int d, int dv,
                     float* acc, float* out) {
  float norm = 0.0f;
  for (int i = 0; i < d; ++i) norm += feature[i] * z[i];
  for (int c = 0; c < dv; ++c) acc[c] = 0.0f;
  for (int i = 0; i < d; ++i) {
    const float f = feature[i];
    const float* row = s + static_cast<int64_t>(i) * dv;
    for (int c = 0; c < dv; ++c) acc[c] += f * row[c];
  }
  // A zero normaliser (no key, φ(q) = 0, or features that cancel): zeros, as defined.
  const float inv = norm != 0.0f ? 1.0f / norm : 0.0f;
  for (int c = 0; c < dv; ++c) out[c] = acc[c] * inv;
}

}  // namespace attnserve::kernels
