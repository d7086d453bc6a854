// Retry pushback: a refusal for overload says how long the caller should wait before its next
// call. The status carries it as a payload from where the refusal is decided (the batcher, the
// admission gate); the transport sends it as gRPC's trailer grpc-retry-pushback-ms (gRFC A6),
// which gRPC's retry policy and the bundled clients' throttles honour (client/throttle.h).
//
// Only refusals a wait can help get one: a full queue, a queue over its byte budget, a fair-share
// shed, a deadline the queue ahead would outlast. A drain (go to another replica), a request too
// large for any queue, a bad request: none.
#ifndef ATTNSERVE_SERVER_BATCHING_PUSHBACK_H_
#define ATTNSERVE_SERVER_BATCHING_PUSHBACK_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace attnserve::batching {

// The payload's type URL (absl::Status::SetPayload).
inline constexpr char kPushbackPayload[] = "type.attnserve/retry-pushback-ms";

// `status` with a pushback of `wait`, rounded up to whole milliseconds and at least 1 ms (a
// pushback of 0 would tell a client nothing). An OK status is returned unchanged.
absl::Status WithPushback(absl::Status status, absl::Duration wait);

// The pushback `status` carries, in milliseconds; nullopt when none.
std::optional<int64_t> PushbackMs(const absl::Status& status);

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_PUSHBACK_H_
