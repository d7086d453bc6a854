// Linear attention on the CPU (kernels/attention_params.h, AttentionKind::kLinear): one
// (batch item, query head) at a time, in the recurrent form of Katharopoulos et al. 2020: the
// running state S = sum φ(k_j) v_jᵀ [D][Dv] and z = sum φ(k_j) [D] take each allowed key once,
// in key order, as the rows' limits (causality, key lengths) reach it, and each query row reads
// them: O((Lq + Lk) · D · Dv) time, O(D · Dv) memory, whatever the length. Float32 arithmetic;
// a row's bits depend on its (b, h) alone.
#ifndef ATTNSERVE_KERNELS_CPU_LINEAR_ATTENTION_H_
#define ATTNSERVE_KERNELS_CPU_LINEAR_ATTENTION_H_

#include "kernels/attention_params.h"

namespace attnserve::kernels::cpu {

// Writes out rows (b, h, *) of p. REQUIRES p.kind == kLinear, no mask, mods or weights.
void LinearAttentionHead(const AttentionParams& p, int b, int h);

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_LINEAR_ATTENTION_H_
