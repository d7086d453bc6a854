// How long a batch will take to compute: the estimate behind deadline-driven dispatch.
//
// A batch normally waits up to max_queue_delay for more work. It leaves earlier when waiting
// longer would make one of its tasks miss its deadline, that is at
//
//     min over its tasks of (deadline - Estimate(batch tokens)).
//
// The batcher learns from what it measures: after every batch it reports the tokens and the
// time process_batch took (on the batcher's clock) through Record().
//
// Thread-safety: NOT thread-safe. The batcher calls Estimate() and Record() only while holding
// its own lock, so one model must not be shared by two batchers. Both must be cheap and must
// not call back into the batcher.
#ifndef ATTNSERVE_SERVER_BATCHING_COST_MODEL_H_
#define ATTNSERVE_SERVER_BATCHING_COST_MODEL_H_

#include <cstdint>

#include "absl/time/time.h"

namespace attnserve::batching {

class BatchCostModel {
 public:
  virtual ~BatchCostModel() = default;

  // The expected time to compute a batch of `tokens` tokens (>= 0). Returns >= 0.
  virtual absl::Duration Estimate(int64_t tokens) const = 0;

  // A measurement: a batch of `tokens` tokens took `elapsed`.
  virtual void Record(int64_t tokens, absl::Duration elapsed) = 0;
};

// The default: margin + tokens * (time per token), the time per token an exponentially
// weighted moving average of the measured (elapsed / tokens) of past batches:
//
//     per_token <- per_token + kAlpha * (sample - per_token),   the first sample taken as is.
//
// The margin covers what the average does not: waking a batch thread, handing the results
// back, and a per-batch overhead that makes small batches cost more per token. It is a
// constant rather than a learned term because one average cannot separate the two, and an
// estimate that is a little high only makes a batch leave a little early.
class EwmaCostModel final : public BatchCostModel {
 public:
  // Weight of the newest sample. 0.2: a change in load is followed within ~10 batches while
  // one slow batch (a page fault, a preempted thread) moves the estimate by a fifth.
  static constexpr double kAlpha = 0.2;

  // `initial_time_per_token` is used until the first measurement (0 = no estimate beyond the
  // margin). REQUIRES: both >= 0.
  explicit EwmaCostModel(absl::Duration margin = absl::Milliseconds(1),
                         absl::Duration initial_time_per_token = absl::ZeroDuration());

  absl::Duration Estimate(int64_t tokens) const override;
  // Batches of 0 tokens, and negative durations, are ignored.
  void Record(int64_t tokens, absl::Duration elapsed) override;

  absl::Duration time_per_token() const { return absl::Seconds(seconds_per_token_); }

 private:
  const absl::Duration margin_;
  double seconds_per_token_;
  bool measured_ = false;
};

// A fixed model, per_batch + tokens * per_token, that learns nothing. For tests, and for
// deployments that prefer a measured constant to a moving average.
class FixedCostModel final : public BatchCostModel {
 public:
  FixedCostModel(absl::Duration per_batch, absl::Duration per_token)
      : per_batch_(per_batch), per_token_(per_token) {}

  absl::Duration Estimate(int64_t tokens) const override {
    return per_batch_ + tokens * per_token_;
  }
  void Record(int64_t, absl::Duration) override {}

 private:
  const absl::Duration per_batch_;
  const absl::Duration per_token_;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_COST_MODEL_H_
