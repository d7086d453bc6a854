#include "server/batching/batcher_options.h"

#include "absl/strings/str_cat.h"

namespace attnserve::batching {

absl::Status ValidateBatcherOptions(const BatcherOptions& options) {
  if (options.max_batch_requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_requests must be positive; was ", options.max_batch_requests));
  }
  if (options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens must be positive; was ", options.max_batch_tokens));
  }
  if (options.max_queue_delay < absl::ZeroDuration() ||
      options.max_queue_delay == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue_delay must be >= 0 and finite; was ",
                                                   absl::FormatDuration(options.max_queue_delay)));
  }
  if (options.max_queued_requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_requests must be positive; was ", options.max_queued_requests));
  }
  if (options.max_queued_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_bytes must be positive; was ", options.max_queued_bytes));
  }
  if (options.num_batch_threads <= 0 || options.num_batch_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_batch_threads must be in [1, 1024]; was ", options.num_batch_threads));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::batching
