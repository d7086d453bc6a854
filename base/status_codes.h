// The canonical names of the gRPC status codes ("OK", "INVALID_ARGUMENT", ...), which
// grpc::StatusCode and absl::StatusCode number alike (0..16). One table for the server's metrics
// labels and the load client's error counts.
#ifndef ATTNSERVE_BASE_STATUS_CODES_H_
#define ATTNSERVE_BASE_STATUS_CODES_H_

#include <array>
#include <string_view>

namespace attnserve {

inline constexpr int kNumStatusCodes = 17;

inline constexpr std::array<std::string_view, kNumStatusCodes> kStatusCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

// The code's name, or an empty view for a number outside 0..16 (each caller says what such a
// number reads as: the metrics "UNKNOWN", as gRPC treats it; the load client "CODE_<n>").
constexpr std::string_view StatusCodeName(int code) {
  return code >= 0 && code < kNumStatusCodes ? kStatusCodeNames[code] : std::string_view();
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_STATUS_CODES_H_
