#include "server/transport/limits.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

int GrpcReceiveLimit(const Limits& limits) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  // Clamped before doubling, so that a flag value near INT64_MAX cannot overflow.
  const int64_t bytes = std::clamp<int64_t>(limits.max_message_bytes, 0, kMax);
  return static_cast<int>(std::min(kMax, 2 * bytes));
}

absl::Status CheckMessageSize(const Limits& limits, int64_t bytes, absl::string_view what) {
  if (bytes <= limits.max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " is ", bytes, " bytes, over the server's limit of ",
                   limits.max_message_bytes, " (--max_message_bytes)"));
}

}  // namespace attnserve::server
