// libFuzzer target: bytes -> AttendRequest (the protobuf parser) -> BuildAttendJob -> the
// reference backend (tests/fuzz/fuzz_requests.h).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::v1::AttendRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  attnserve::fuzz::BuildAndCompute(request);
  return 0;
}
