// The running state of causal linear attention (attention_params.h, AttentionKind::kLinear),
// stepped one key and one query row at a time: for one kv head, S = sum_j φ(k_j) v_jᵀ [D][Dv]
// and z = sum_j φ(k_j) [D], in float32, keys taken in order.
//
// Two callers step it with these functions, so their rows agree bit for bit: the CPU backend's
// linear Attend (kernels/cpu/linear_attention.cc, the recurrent form over a request's keys) and
// linear decode sessions (server/sessions/linear_extend.cc, the state kept between extends), so
// a session's rows are those of a causal Attend over all its tokens on the CPU backend. The CUDA
// kernel (kernels/cuda/linear_attention.h) repeats their roundings, so its rows have the same
// bits too. Vectorised for the CPU's widest instruction set (picked at load time), with no
// reassociation and no fused multiply-add: the same bits on every CPU, whatever the backend.
//
// Thread-safety: pure functions of their arguments.
#ifndef ATTNSERVE_KERNELS_LINEAR_STATE_H_
#define ATTNSERVE_KERNELS_LINEAR_STATE_H_

#include "kernels/attention_params.h"

namespace attnserve::kernels {

// x[0..n) = φ(x[0..n)): kernels/feature_map.h's Feature for each element.
void ApplyFeatureMap(FeatureMap map, float* x, int n);

// Takes one key into the state: z += φ(k), S += φ(k) vᵀ. `feature` is φ(k) [d], `value` v [dv];
// `s` is S [d][dv] row-major, `z` [d].
void LinearAddKey(const float* feature, const float* value, int d, int dv, float* s, float* z);

// One query row against the state: out = φ(q)ᵀ S / (φ(q) · z), all zeros when the normaliser is
// exactly 0 (the kind's definition). `feature` is φ(q) [d]; out [dv]. Each sum runs over d in
// index order, each product and sum rounded on its own: the order the CUDA kernel repeats.
void LinearReadQuery(const float* feature, const float* s, const float* z, int d, int dv,
                     float* out);

// LinearAddKey(key_feature, value, ...) then LinearReadQuery(query_feature, ...), with the same
// bits, in one pass over S (a causal row that brings exactly one new key: self-attention's).
void LinearAddKeyReadQuery(const float* key_feature, const float* value, const float* query_feature,
                           int d, int dv, float* s, float* z, float* out);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_LINEAR_STATE_H_
