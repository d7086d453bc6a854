// Loading the reference cases of tests/data/seed-vectors (computed by the PyTorch module).
#ifndef ATTNSERVE_TESTS_TESTING_SEED_VECTORS_H_
#define ATTNSERVE_TESTS_TESTING_SEED_VECTORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/multi_head.h"

namespace attnserve::testing {

// The directory holding the seed vectors (compiled in by CMake).
std::string SeedVectorsDir();
// The names of the cases: "blocked_rows", "causal", "cross_padding", "seed_demo".
std::vector<std::string> SeedCaseNames();

struct SeedCase {
  std::string name;
  std::string bytes;  // the whole safetensors file, as LoadModule takes it
  kernels::MultiHeadWeights weights;
  int batch = 0, q_len = 0, kv_len = 0;
  bool self_attention = false;  // input.key and input.value equal input.query
  std::vector<float> query, key, value;
  std::vector<uint8_t> mask;        // empty when the case has none
  std::vector<int64_t> mask_shape;  // as stored
  std::vector<int64_t> query_shape, key_shape;
  std::vector<float> expected_output;   // [B, Lq, d_model]
  std::vector<float> expected_weights;  // [B, h, Lq, Lk]
};

absl::StatusOr<SeedCase> LoadSeedCase(const std::string& name);

// MultiHeadParams over a case's buffers, writing into out (and weights when non-null).
// REQUIRES: `c` outlives the params.
kernels::MultiHeadParams SeedParams(const SeedCase& c, float* out, float* weights);

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_SEED_VECTORS_H_
