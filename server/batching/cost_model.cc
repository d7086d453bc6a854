#include "server/batching/cost_model.h"

namespace attnserve::batching {

EwmaCostModel::EwmaCostModel(absl::Duration margin, absl::Duration initial_time_per_token)
    : margin_(margin), seconds_per_token_(absl::ToDoubleSeconds(initial_time_per_token)) {}

absl::Duration EwmaCostModel::Estimate(int64_t tokens) const {
  return margin_ + absl::Seconds(seconds_per_token_ * static_cast<double>(tokens));
}

void EwmaCostModel::Record(int64_t tokens, absl::Duration elapsed) {
  if (tokens <= 0 || elapsed < absl::ZeroDuration()) return;
  const double sample = absl::ToDoubleSeconds(elapsed) / static_cast<double>(tokens);
  if (!measured_) {
    seconds_per_token_ = sample;
    measured_ = true;
  } else {
    seconds_per_token_ += kAlpha * (sample - seconds_per_token_);
  }
}

}  // namespace attnserve::batching
