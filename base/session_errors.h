// The two session errors whose text is a contract between the server and the clients (the proto
// documents both, and the clients act on them): FAILED_PRECONDITION
//   "session lost (<reason>): ..."    the session is gone from its replica (expired, evicted,
//                                     closed, or the replica restarted without it)
//   "session moved to '<id>': ..."    the session lives on under a new id, on another replica
// The server writes them (server/sessions/session_ids.cc) and both ends read them here.
//
// Thread-safety: pure functions.
#ifndef ATTNSERVE_BASE_SESSION_ERRORS_H_
#define ATTNSERVE_BASE_SESSION_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace attnserve {

inline constexpr absl::string_view kSessionLostPrefix = "session lost (";
inline constexpr absl::string_view kSessionMovedPrefix = "session moved to '";

// The text between `prefix` and the first `close` after it, when `status` is FAILED_PRECONDITION
// and its message starts with `prefix`; "" otherwise.
inline std::string SessionErrorField(const absl::Status& status, absl::string_view prefix,
                                     char close) {
  if (status.code() != absl::StatusCode::kFailedPrecondition ||
      !absl::StartsWith(status.message(), prefix)) {
    return "";
  }
  const absl::string_view rest = status.message().substr(prefix.size());
  const size_t end = rest.find(close);
  return end == absl::string_view::npos ? "" : std::string(rest.substr(0, end));
}

// The reason of a "session lost" error ("" for any other status).
inline std::string LostSessionReason(const absl::Status& status) {
  return SessionErrorField(status, kSessionLostPrefix, ')');
}

// The new id of a "session moved" error ("" for any other status).
inline std::string MovedSessionId(const absl::Status& status) {
  return SessionErrorField(status, kSessionMovedPrefix, '\'');
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_SESSION_ERRORS_H_
