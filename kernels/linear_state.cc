#include "kernels/linear_state.h"

#include <cstdint>

#include "kernels/feature_map.h"

namespace attnserve::kernels {

// The three functions below, compiled for AVX-512, AVX2 and the baseline, picked at load time
// by the CPU (GCC's target_clones): wider vectors, the same bits. Each output element is still
// computed as the scalar loops would, by one multiply and one add in the same order (no
// reassociation, and -ffp-contract=off, kernels/CMakeLists.txt: no fused multiply-add), so every
// clone, the sessions' steps and the CUDA kernel agree bit for bit
// (tests/cuda_emu/linear_attention_emu_test). Not under the sanitizers: the clones' resolver runs
// while the dynamic loader relocates the binary, before the sanitizer's runtime exists, and its
// instrumented entry crashed every ThreadSanitizer test binary at start.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define ATTNSERVE_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATTNSERVE_ISA_CLONES
#endif

// The feature maps' loops vectorise too (feature_map.h: FeatureExp is branch-free, and the
// CUDA kernel calls the same function for each element).
ATTNSERVE_ISA_CLONES
void ApplyFeatureMap(FeatureMap map, float* x, int n) {
  switch (map) {
    case FeatureMap::kEluPlusOne:
      for (int d = 0; d < n; ++d) x[d] = feature_map::EluPlusOne(x[d]);
      break;
    case FeatureMap::kRelu:
      for (int d = 0; d < n; ++d) x[d] = x[d] > 0 ? x[d] : 0.0f;
      break;
    case FeatureMap::kIdentity:
      break;
  }
}

// Sixteen floats: one register in the AVX-512 clone, two or four in the others (GCC's vector
// extensions, which clang has too; aligned to a float and may_alias, as the intrinsics' __m512_u,
// so that any float's address may be read and written as one). Only element-wise multiplies and
// adds, so every clone computes what the scalar loops would, element for element.
namespace {

typedef float Floats16 __attribute__((vector_size(64), aligned(4), may_alias));

Floats16* At(float* p) { return reinterpret_cast<Floats16*>(p); }
const Floats16* At(const float* p) { return reinterpret_cast<const Floats16*>(p); }

// 1 / (φ(q) · z), the sum in index order; 0 when the normaliser is exactly 0 (no key, φ(q) = 0,
// or features that cancel), so that the row is zeros, as defined.
float InverseNormaliser(const float* feature, const float* z, int d) {
  float norm = 0.0f;
  for (int i = 0; i < d; ++i) norm += feature[i] * z[i];
  return norm != 0.0f ? 1.0f / norm : 0.0f;
}

// out[0, 64) = (a0, a1, a2, a3) · inv.
inline __attribute__((always_inline)) void StoreScaled(float* out, const Floats16& a0,
                                                       const Floats16& a1, const Floats16& a2,
                                                       const Floats16& a3, float inv) {
  Floats16* o = At(out);
  o[0] = a0 * inv;
  o[1] = a1 * inv;
  o[2] = a2 * inv;
  o[3] = a3 * inv;
}

}  // namespace

// S's rows are updated 64 columns at a time (then 16, then one), v's columns held in registers
// across the d rows; each element is still s + f · v, one multiply and one add.
ATTNSERVE_ISA_CLONES
void LinearAddKey(const float* feature, const float* value, int d, int dv, float* s, float* z) {
  for (int i = 0; i < d; ++i) z[i] += feature[i];
  int c = 0;
  for (; c + 64 <= dv; c += 64) {
    const Floats16* v = At(value + c);
    const Floats16 v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
    for (int i = 0; i < d; ++i) {
      const float f = feature[i];
      Floats16* row = At(s + static_cast<int64_t>(i) * dv + c);
      row[0] += f * v0;
      row[1] += f * v1;
      row[2] += f * v2;
      row[3] += f * v3;
    }
  }
  for (; c + 16 <= dv; c += 16) {
    const Floats16 v0 = *At(value + c);
    for (int i = 0; i < d; ++i) *At(s + static_cast<int64_t>(i) * dv + c) += feature[i] * v0;
  }
  for (; c < dv; ++c) {
    for (int i = 0; i < d; ++i) s[static_cast<int64_t>(i) * dv + c] += feature[i] * value[c];
  }
}

// The output's columns are summed 64 at a time (then 16, then one) in registers, over the d rows
// of S in index order: each element is still ((0 + f₀ s₀) + f₁ s₁) + ..., then times 1 / norm.
ATTNSERVE_ISA_CLONES
void LinearReadQuery(const float* feature, const float* s, const float* z, int d, int dv,
                     float* out) {
  const float inv = InverseNormaliser(feature, z, d);
  int c = 0;
  for (; c + 64 <= dv; c += 64) {
    Floats16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int i = 0; i < d; ++i) {
      const float f = feature[i];
      const Floats16* row = At(s + static_cast<int64_t>(i) * dv + c);
      a0 += f * row[0];
      a1 += f * row[1];
      a2 += f * row[2];
      a3 += f * row[3];
    }
    StoreScaled(out + c, a0, a1, a2, a3, inv);
  }
  for (; c + 16 <= dv; c += 16) {
    Floats16 a0 = {};
    for (int i = 0; i < d; ++i) a0 += feature[i] * *At(s + static_cast<int64_t>(i) * dv + c);
    *At(out + c) = a0 * inv;
  }
  for (; c < dv; ++c) {
    float a = 0.0f;
    for (int i = 0; i < d; ++i) a += feature[i] * s[static_cast<int64_t>(i) * dv + c];
    out[c] = a * inv;
  }
}

// LinearAddKey, then LinearReadQuery, in one pass over S: each row of S is read once, updated,
// stored and read back from its register. Every element is computed as the two functions compute
// it, in the same order.
ATTNSERVE_ISA_CLONES
void LinearAddKeyReadQuery(const float* key_feature, const float* value, const float* query_feature,
                           int d, int dv, float* s, float* z, float* out) {
  for (int i = 0; i < d; ++i) z[i] += key_feature[i];
  const float inv = InverseNormaliser(query_feature, z, d);
  int c = 0;
  for (; c + 64 <= dv; c += 64) {
    const Floats16* v = At(value + c);
    const Floats16 v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
    Floats16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int i = 0; i < d; ++i) {
      const float fk = key_feature[i], fq = query_feature[i];
      Floats16* row = At(s + static_cast<int64_t>(i) * dv + c);
      const Floats16 r0 = row[0] + fk * v0, r1 = row[1] + fk * v1, r2 = row[2] + fk * v2,
                     r3 = row[3] + fk * v3;
      row[0] = r0;
      row[1] = r1;
      row[2] = r2;
      row[3] = r3;
      a0 += fq * r0;
      a1 += fq * r1;
      a2 += fq * r2;
      a3 += fq * r3;
    }
    StoreScaled(out + c, a0, a1, a2, a3, inv);
  }
  for (; c + 16 <= dv; c += 16) {
    const Floats16 v0 = *At(value + c);
    Floats16 a0 = {};
    for (int i = 0; i < d; ++i) {
      Floats16* row = At(s + static_cast<int64_t>(i) * dv + c);
      const Floats16 r0 = *row + key_feature[i] * v0;
      *row = r0;
      a0 += query_feature[i] * r0;
    }
    *At(out + c) = a0 * inv;
  }
  for (; c < dv; ++c) {
    float a = 0.0f;
    for (int i = 0; i < d; ++i) {
      float& cell = s[static_cast<int64_t>(i) * dv + c];
      cell += key_feature[i] * value[c];
      a += query_feature[i] * cell;
    }
    out[c] = a * inv;
  }
}

}  // namespace attnserve::kernels
