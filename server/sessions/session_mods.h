// A session's score modifications (CreateSessionRequest's window, softcap and alibi): every
// extend applies them as PagedAttentionParams says (kernels/paged_attention_params.h), so that a
// session computes what Attend computes with the same options and causal set.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_MODS_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_MODS_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/attention_params.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::server::sessions {

struct SessionMods {
  int window_left = -1;             // keys before position - window_left blocked; -1: none
  float softcap = 0.0f;             // 0: none
  std::vector<float> alibi_slopes;  // one per query head, or empty: none

  bool any() const { return window_left >= 0 || softcap != 0.0f || !alibi_slopes.empty(); }
  // Equal for equal modifications, bit for bit (sessions with equal keys share a PagedAttention
  // call); empty when there are none.
  std::string Key() const {
    if (!any()) return "";
    std::string key = absl::StrCat(window_left, "/");
    const auto bits = [&key](float f) {
      uint32_t b;
      std::memcpy(&b, &f, sizeof b);
      absl::StrAppend(&key, b, ",");
    };
    bits(softcap);
    for (float s : alibi_slopes) bits(s);
    return key;
  }
  // Into p (which then points at alibi_slopes: this must outlive p's use).
  void ApplyTo(kernels::PagedAttentionParams& p) const {
    p.window_left = window_left;
    p.softcap = softcap;
    p.alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data();
  }
};

// What each step of a session computes beyond its shape: the scale, the score modifications and
// the kind. Session (the table's record) and SessionState (what describing it returns) derive
// from it, so that they copy it as one.
struct SessionScoring {
  float scale = 1.0f;
  SessionMods mods;
  // Linear attention (attention.proto, CreateSessionRequest.kind; no mods, no scale): the
  // session's pages hold its running state (linear_extend.cc), not keys and values.
  kernels::AttentionKind kind = kernels::AttentionKind::kSoftmax;
  kernels::FeatureMap feature_map = kernels::FeatureMap::kEluPlusOne;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_MODS_H_
