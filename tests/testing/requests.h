// Attend requests with their float64 reference answers, for serving tests.
#ifndef ATTNSERVE_TESTS_TESTING_REQUESTS_H_
#define ATTNSERVE_TESTS_TESTING_REQUESTS_H_

#include <cstdint>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "kernels/reference.h"

namespace attnserve::testing {

// n standard-normal floats from a fixed seed.
std::vector<float> RandomNormal(size_t n, uint32_t seed);

// A request, and the float64 reference of what it should return.
struct AttendCase {
  v1::AttendRequest request;
  kernels::Reference64 expected;
};

struct AttendShape {
  int b = 1, hq = 1, hkv = 1, lq = 1, lk = 1, d = 8, dv = 8;
};

// q [b, hq, lq, d], k [b, hkv, lk, d], v [b, hkv, lk, dv] from seeds derived from `seed`, in
// `dtype`; the reference is computed on the values as the wire carries them.
AttendCase MakeAttendCase(v1::Dtype dtype, const AttendShape& shape, bool causal,
                          bool return_weights, uint32_t seed = 1);

// Largest |got - want|, or infinity on a size mismatch or a NaN.
double MaxAbsError(const std::vector<float>& got, const std::vector<double>& want);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_REQUESTS_H_
