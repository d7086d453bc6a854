// kernels/linear_state.h: LinearAddKeyReadQuery has, bit for bit, the state and the row of
// LinearAddKey followed by LinearReadQuery (the CPU backend's causal rows take the first, the
// sessions' steps and the CUDA kernel's reference the second), at widths that take every path:
// 64-column blocks, 16-column blocks and single columns, over a run of keys with features of
// both signs, a zero query, and a state whose normaliser is 0.
#include "kernels/linear_state.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::kernels {
namespace {

TEST(LinearStateTest, OnePassHasTheBitsOfAddKeyThenReadQuery) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int d : {1, 16, 64}) {
    for (const int dv : {8, 16, 40, 64, 72, 130, 192}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << " dv " << dv);
      std::vector<float> s1(size_t(d) * dv, 0.0f), z1(d, 0.0f), s2 = s1, z2 = z1;
      std::vector<float> k(d), q(d), v(dv), out1(dv), out2(dv);
      for (int step = 0; step < 20; ++step) {
        for (float& x : k) x = normal(rng);
        for (float& x : v) x = normal(rng);
        for (float& x : q) x = normal(rng);
        if (step == 4) std::fill(q.begin(), q.end(), 0.0f);  // identity features: normaliser 0
        ApplyFeatureMap(step % 2 ? FeatureMap::kEluPlusOne : FeatureMap::kIdentity, k.data(), d);
        ApplyFeatureMap(step % 2 ? FeatureMap::kEluPlusOne : FeatureMap::kIdentity, q.data(), d);
        LinearAddKey(k.data(), v.data(), d, dv, s1.data(), z1.data());
        LinearReadQuery(q.data(), s1.data(), z1.data(), d, dv, out1.data());
        LinearAddKeyReadQuery(k.data(), v.data(), q.data(), d, dv, s2.data(), z2.data(),
                              out2.data());
        ASSERT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)), 0) << step;
        ASSERT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)), 0) << step;
        ASSERT_EQ(std::memcmp(z1.data(), z2.data(), z1.size() * sizeof(float)), 0) << step;
        if (step == 4) {
          for (float x : out2) ASSERT_EQ(x, 0.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnserve::kernels
