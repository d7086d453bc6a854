#include "kernels/attention_params.h"

#include <cstdint>

namespace attnserve::kernels {

int AttentionParams::key_limit(int b, int i) const {
  int limit = kv_len;
  if (causal) {
    const int causal_limit = i + kv_len - q_len + 1;
    if (causal_limit < limit) limit = causal_limit < 0 ? 0 : causal_limit;
  }
  if (mods.window_right >= 0) {
    const int64_t window_limit = int64_t{i} + kv_len - q_len + mods.window_right + 1;
    if (window_limit < limit) limit = window_limit < 0 ? 0 : static_cast<int>(window_limit);
  }
  if (key_lengths != nullptr && key_lengths[b] < limit) limit = key_lengths[b];
  return limit;
}

int AttentionParams::key_start(int i) const {
  if (mods.window_left < 0) return 0;
  const int64_t start = int64_t{i} + kv_len - q_len - mods.window_left;
  return start < 0 ? 0 : start > kv_len ? kv_len : static_cast<int>(start);
}

}  // namespace attnserve::kernels
