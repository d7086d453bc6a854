// A log line per key at most once per period, and a count of the lines left out, so that a
// caller who can make an event happen at will (a tenant probing other tenants' session ids)
// cannot grow the log at the rate of its calls. The metric that counts the events stays the
// rate-safe signal; the line says who, and how many more since the last one.
//
// Not thread-safe: the caller holds the lock of the state it logs about. Times come from the
// caller (its Clock), so tests drive it with a fake one.
#ifndef ATTNSERVE_BASE_LOG_THROTTLE_H_
#define ATTNSERVE_BASE_LOG_THROTTLE_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve {

class LogThrottle {
 public:
  // At most one line per key per `period` (zero or less: every line).
  explicit LogThrottle(absl::Duration period) : period_(period) {}

  // Whether the event of `key` at `now` gets its line. When it does, *left_out is how many of
  // the key's events got none since its last line (0 when none did); when it does not, the
  // event is counted for the next line. The keys are the callers' (a bounded set, such as the
  // tenants of a file): one entry each is kept for the process's life.
  bool Admit(absl::string_view key, absl::Time now, int64_t* left_out) {
    auto [it, first] = keys_.try_emplace(key);
    State& s = it->second;
    if (!first && now - s.last_line < period_) {
      ++s.left_out;
      return false;
    }
    *left_out = s.left_out;
    s = {now, 0};
    return true;
  }

 private:
  struct State {
    absl::Time last_line = absl::InfinitePast();
    int64_t left_out = 0;
  };
  const absl::Duration period_;
  absl::flat_hash_map<std::string, State> keys_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_LOG_THROTTLE_H_
