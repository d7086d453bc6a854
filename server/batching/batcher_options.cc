#include "server/batching/batcher_options.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnserve::batching {
namespace {

absl::Status CheckPositive(absl::string_view name, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be positive; was ", value));
}

}  // namespace

absl::Status ValidateBatcherOptions(const BatcherOptions& options) {
  for (const auto& [name, value] :
       {std::pair<absl::string_view, int64_t>{"max_batch_requests", options.max_batch_requests},
        {"max_batch_tokens", options.max_batch_tokens},
        {"max_queued_requests", options.max_queued_requests},
        {"max_queued_bytes", options.max_queued_bytes}}) {
    if (absl::Status s = CheckPositive(name, value); !s.ok()) return s;
  }
  if (options.max_queue_delay < absl::ZeroDuration() ||
      options.max_queue_delay == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue_delay must be >= 0 and finite; was ",
                                                   absl::FormatDuration(options.max_queue_delay)));
  }
  if (options.num_batch_threads <= 0 || options.num_batch_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_batch_threads must be in [1, 1024]; was ", options.num_batch_threads));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::batching
