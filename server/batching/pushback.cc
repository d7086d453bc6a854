#include "server/batching/pushback.h"

#include <algorithm>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace attnserve::batching {

absl::Status WithPushback(absl::Status status, absl::Duration wait) {
  if (status.ok()) return status;
  const int64_t ms =
      std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))));
  status.SetPayload(kPushbackPayload, absl::Cord(std::to_string(ms)));
  return status;
}

std::optional<int64_t> PushbackMs(const absl::Status& status) {
  const auto payload = status.GetPayload(kPushbackPayload);  // absl::optional<absl::Cord>
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) {
    return std::nullopt;
  }
  return ms;
}

}  // namespace attnserve::batching
