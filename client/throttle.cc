#include "client/throttle.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

// The shortest text that reads back as x, as JavaScript's String(x) and the Python client's
// messages write it: 2 -> "2", 1.5 -> "1.5".
std::string Number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), x);
  return std::string(buffer, result.ptr);
}

constexpr char kAdvice[] = "; retry later or disable with ClientOptions::throttle.enabled = false";
// How a rejection during a server's pushback begins (IsHeldByPushback).
constexpr char kHeldPrefix[] = "throttled by the client: the server asked for no calls for ";

}  // namespace

absl::Status ValidateThrottleOptions(const ThrottleOptions& options) {
  if (!(options.k >= 1)) {  // NaN too
    return absl::InvalidArgumentError(
        absl::StrCat("throttle.k must be >= 1; was ", Number(options.k)));
  }
  if (std::isinf(options.k)) {
    // inf * 0 accepts is NaN: a throttle that never rejects is enabled = false.
    return absl::InvalidArgumentError(
        absl::StrCat("throttle.k must be finite; was ", Number(options.k)));
  }
  if (options.window_seconds < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "throttle.window_seconds must be an integer >= 1; was ", options.window_seconds));
  }
  if (!(options.max_probability > 0 && options.max_probability <= 1)) {  // NaN too
    return absl::InvalidArgumentError(
        absl::StrCat("throttle.max_probability must be above 0 and at most 1; was ",
                     Number(options.max_probability)));
  }
  return absl::OkStatus();
}

bool IsThrottledByClient(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StartsWith(status.message(), "throttled by the client:");
}

bool IsHeldByPushback(const absl::Status& status) {
  return IsThrottledByClient(status) && absl::StartsWith(status.message(), kHeldPrefix);
}

bool IsAccept(absl::StatusCode code) {
  return code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded;
}

std::optional<int64_t> ParsePushback(std::string_view value) {
  if (value.empty()) return std::nullopt;
  int64_t ms = 0;
  const auto result = std::from_chars(value.data(), value.data() + value.size(), ms);
  // Digits only (from_chars takes a leading '-'), all of them, and no overflow.
  if (value[0] == '-' || result.ec != std::errc() || result.ptr != value.data() + value.size()) {
    return std::nullopt;
  }
  return ms;
}

absl::StatusOr<std::unique_ptr<Throttle>> Throttle::Create(const ThrottleOptions& options,
                                                           std::function<double()> clock,
                                                           std::function<double()> rand) {
  if (absl::Status s = ValidateThrottleOptions(options); !s.ok()) return s;
  if (!clock) {
    clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  if (!rand) {
    auto engine = std::make_shared<std::mt19937_64>(std::random_device()());
    rand = [engine] { return std::uniform_real_distribution<double>(0.0, 1.0)(*engine); };
  }
  return std::unique_ptr<Throttle>(new Throttle(options, std::move(clock), std::move(rand)));
}

Throttle::Throttle(const ThrottleOptions& options, std::function<double()> clock,
                   std::function<double()> rand)
    : options_(options),
      clock_(std::move(clock)),
      rand_(std::move(rand)),
      seconds_(static_cast<size_t>(options.window_seconds), std::numeric_limits<int64_t>::min()),
      requests_(static_cast<size_t>(options.window_seconds), 0),
      accepts_(static_cast<size_t>(options.window_seconds), 0),
      pushback_until_(-std::numeric_limits<double>::infinity()) {}

void Throttle::Add(int64_t second, bool accepted) {
  const int64_t n = options_.window_seconds;
  const size_t i = static_cast<size_t>(((second % n) + n) % n);
  if (seconds_[i] != second) {
    seconds_[i] = second;
    requests_[i] = accepts_[i] = 0;
  }
  ++requests_[i];
  if (accepted) ++accepts_[i];
}

std::pair<int64_t, int64_t> Throttle::CountsAt(int64_t second) const {
  const int64_t first = second - options_.window_seconds;
  int64_t requests = 0, accepts = 0;
  for (size_t i = 0; i < seconds_.size(); ++i) {
    if (first < seconds_[i] && seconds_[i] <= second) {
      requests += requests_[i];
      accepts += accepts_[i];
    }
  }
  return {requests, accepts};
}

double Throttle::P(int64_t requests, int64_t accepts) const {
  const double p = (static_cast<double>(requests) - options_.k * static_cast<double>(accepts)) /
                   static_cast<double>(requests + 1);
  return std::clamp(p, 0.0, options_.max_probability);
}

std::pair<int64_t, int64_t> Throttle::Counts() const {
  MutexLock lock(&mu_);
  return CountsAt(static_cast<int64_t>(std::floor(clock_())));
}

double Throttle::Probability() const {
  MutexLock lock(&mu_);
  const auto [requests, accepts] = CountsAt(static_cast<int64_t>(std::floor(clock_())));
  return P(requests, accepts);
}

std::optional<std::string> Throttle::Check() {
  if (!options_.enabled) return std::nullopt;
  MutexLock lock(&mu_);
  const double now = clock_();
  const int64_t second = static_cast<int64_t>(std::floor(now));
  if (now < pushback_until_) {  // not counted (throttle.h)
    return absl::StrCat(kHeldPrefix, pushback_ms_, " ms (", kPushbackKey, ")", kAdvice);
  }
  const auto [requests, accepts] = CountsAt(second);
  const double p = P(requests, accepts);
  if (p > 0 && rand_() < p) {
    Add(second, /*accepted=*/false);
    return absl::StrCat("throttled by the client: the server accepted ", accepts, " of the last ",
                        requests, " calls in ", options_.window_seconds,
                        " s (adaptive throttling, k=", Number(options_.k), ")", kAdvice);
  }
  return std::nullopt;
}

void Throttle::Record(absl::StatusCode code, std::string_view pushback) {
  if (!options_.enabled) return;
  MutexLock lock(&mu_);
  const double now = clock_();
  Add(static_cast<int64_t>(std::floor(now)), IsAccept(code));
  if (code == absl::StatusCode::kOk) return;
  const std::optional<int64_t> ms = ParsePushback(pushback);
  // A later, shorter pushback (a call that was already in flight) does not shorten the one in
  // force.
  if (ms.has_value() && now + static_cast<double>(*ms) / 1000 > pushback_until_) {
    pushback_until_ = now + static_cast<double>(*ms) / 1000;
    pushback_ms_ = *ms;
  }
}

}  // namespace attnserve
