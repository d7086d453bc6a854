// The NaN rule of kernels/attention_params.h on the reference and the CPU backend (every
// instruction set this machine has); the CUDA kernels are checked against it in
// tests/cuda_emu/flash_emu_test.cc (NaNRule).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/reference.h"

namespace attnserve::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kLq = 4, kLk = 6, kD = 8, kDv = 5;

// One head, q [4, 8], k [6, 8], v [6, 5], finite values, and the output.
struct Problem {
  std::vector<float> q, k, v, out;
  std::vector<uint8_t> mask;  // [Lq, Lk], empty: none
  int32_t key_length = kLk;
  bool with_key_length = false;

  Problem() : q(kLq * kD), k(kLk * kD), v(kLk * kDv), out(kLq * kDv, -1.0f) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7f * i);
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.3f * i);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.1f * i + 0.5f);
  }
  AttentionParams Params() {
    AttentionParams p;
    p.batch = p.num_heads = p.num_kv_heads = 1;
    p.q_len = kLq;
    p.kv_len = kLk;
    p.head_dim = kD;
    p.v_head_dim = kDv;
    p.q = {q.data(), 0, 0, kD};
    p.k = {k.data(), 0, 0, kD};
    p.v = {v.data(), 0, 0, kDv};
    p.out = {out.data(), 0, 0, kDv};
    if (!mask.empty()) p.mask = {mask.data(), 0, 0, kLk, 1};
    if (with_key_length) p.key_lengths = &key_length;
    p.scale = 0.25f;
    return p;
  }
  float at(int i, int c) const { return out[i * kDv + c]; }
};

// Every backend under test: the reference and the CPU backend on each instruction set.
std::vector<std::unique_ptr<Backend>> Backends() {
  std::vector<std::unique_ptr<Backend>> all;
  all.push_back(std::make_unique<ReferenceBackend>());
  for (cpu::Isa isa : {cpu::Isa::kGeneric, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    auto b = cpu::CpuBackend::Create(cpu::CpuBackendOptions{1, isa});
    if (b.ok()) all.push_back(*std::move(b));  // an ISA this machine lacks is skipped
  }
  return all;
}

std::string Name(Backend& b) { return b.name(); }

void Attend(Backend& b, Problem& pr) {
  const AttentionParams p = pr.Params();
  ASSERT_TRUE(b.Attend({&p, 1}).ok()) << Name(b);
}

// Rule 1: a NaN or +Inf among a row's allowed scores makes that row NaN in every column.
TEST(NaNRuleTest, NonFiniteQueryMakesItsRowNaN) {
  for (auto& b : Backends()) {
    for (float bad : {kNaN, kInf}) {
      Problem pr;
      pr.q[1 * kD + 2] = bad;  // row 1
      Attend(*b, pr);
      for (int i = 0; i < kLq; ++i) {
        for (int c = 0; c < kDv; ++c) {
          EXPECT_EQ(std::isnan(pr.at(i, c)), i == 1)
              << Name(*b) << " q=" << bad << " row " << i << " col " << c << " " << pr.at(i, c);
          if (i != 1) EXPECT_TRUE(std::isfinite(pr.at(i, c))) << Name(*b);
        }
      }
    }
  }
}

// Rule 2: an allowed score of -Inf weighs 0; a row whose allowed scores are all -Inf is fully
// blocked and attends uniformly to all keys.
TEST(NaNRuleTest, NegativeInfiniteScoresWeighZero) {
  for (auto& b : Backends()) {
    // k[key 2] has -Inf in column 0 and every q[., 0] > 0: score -Inf for key 2 only. The
    // result equals the same problem with key 2 masked.
    Problem pr, masked;
    for (int i = 0; i < kLq; ++i) pr.q[i * kD] = masked.q[i * kD] = 0.5f;
    pr.k[2 * kD] = -kInf;
    masked.mask.assign(kLq * kLk, 1);
    for (int i = 0; i < kLq; ++i) masked.mask[i * kLk + 2] = 0;
    Attend(*b, pr);
    Attend(*b, masked);
    for (int e = 0; e < kLq * kDv; ++e) {
      EXPECT_FLOAT_EQ(pr.out[e], masked.out[e]) << Name(*b) << " element " << e;
    }
    // Key length 1 and that one key's score -Inf for row 0: row 0 attends uniformly.
    Problem all;
    all.q[0] = 0.5f;
    all.k[0] = -kInf;
    all.with_key_length = true;
    all.key_length = 1;
    Attend(*b, all);
    for (int c = 0; c < kDv; ++c) {
      double mean = 0;
      for (int j = 0; j < kLk; ++j) mean += all.v[j * kDv + c];
      EXPECT_NEAR(all.at(0, c), mean / kLk, 1e-6) << Name(*b) << " col " << c;
    }
  }
}

// Rule 3: blocked keys are never consulted.
TEST(NaNRuleTest, NonFiniteBlockedKeyHasNoEffect) {
  for (auto& b : Backends()) {
    for (float bad : {kNaN, kInf, -kInf}) {
      Problem pr, clean;
      pr.with_key_length = clean.with_key_length = true;
      pr.key_length = clean.key_length = 3;
      pr.k[4 * kD + 1] = bad;  // key 4 >= key length
      Attend(*b, pr);
      Attend(*b, clean);
      for (int e = 0; e < kLq * kDv; ++e) {
        EXPECT_EQ(pr.out[e], clean.out[e]) << Name(*b) << " k=" << bad << " element " << e;
      }
    }
  }
}

// Rule 4: a NaN in v at a key every row weighs (no blocking) makes that column NaN, and only it.
TEST(NaNRuleTest, NaNValuePoisonsItsColumn) {
  for (auto& b : Backends()) {
    Problem pr;
    pr.v[2 * kDv + 3] = kNaN;
    Attend(*b, pr);
    for (int i = 0; i < kLq; ++i) {
      for (int c = 0; c < kDv; ++c) {
        EXPECT_EQ(std::isnan(pr.at(i, c)), c == 3) << Name(*b) << " row " << i << " col " << c;
      }
    }
  }
}

}  // namespace
}  // namespace attnserve::kernels
