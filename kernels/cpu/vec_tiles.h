// The register tiles of the CPU kernels' bodies, over an instruction set's vector operations
// (vec_avx512.h, vec_avx2.h, vec_generic.h): each per-ISA translation unit names its traits as
// one of these, with the sizes that fit its registers (the unit says why). Also the score
// modification both bodies compute alike (SoftCap).
#ifndef ATTNSERVE_KERNELS_CPU_VEC_TILES_H_
#define ATTNSERVE_KERNELS_CPU_VEC_TILES_H_

#include <cstdint>

namespace attnserve::kernels::cpu {
namespace {

// The scalar helpers of the bodies. Internal to each unit, like everything the bodies call (see
// attention_kernel_impl.h on inline functions): each unit's copies compile with its own flags.
constexpr float kNegInf = -__builtin_inff();
constexpr int MinInt(int a, int b) { return a < b ? a : b; }
constexpr int MaxInt(int a, int b) { return a > b ? a : b; }
constexpr int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
constexpr int64_t Align16(int64_t n) { return RoundUp(n, 16); }

// A register block of accumulators set to zero (unrolled, so that they stay in registers).
template <class Ops, class V, int kA, int kB>
void ZeroBlock(V (&acc)[kA][kB]) {
#pragma GCC unroll 16
  for (int a = 0; a < kA; ++a) {
#pragma GCC unroll 16
    for (int b = 0; b < kB; ++b) acc[a][b] = Ops::Zero();
  }
}

}  // namespace

// The fused attention body (attention_kernel_impl.h): the score kernel's register block is
// kScoreKeys keys x kScoreVecs vectors of query rows, the P·V kernel's kPvCols value columns x
// kPvVecs vectors of rows.
template <class Ops, int ScoreKeys, int ScoreVecs, int PvCols, int PvVecs>
struct AttentionTiles : Ops {
  static constexpr int kScoreKeys = ScoreKeys;
  static constexpr int kScoreVecs = ScoreVecs;
  static constexpr int kPvCols = PvCols;
  static constexpr int kPvVecs = PvVecs;
};

// The paged attention body (paged_attention_impl.h): kScoreRows row-heads a score pass, kPvRows
// row-heads x kPvVecs vectors of value columns a P·V pass. kBf16Dot: whether the ISA takes
// bfloat16 dot products (a unit that does adds them: paged_attention_avx512bf16.cc).
template <class Ops, int ScoreRows, int PvRows, int PvVecs>
struct PagedTiles : Ops {
  static constexpr int kScoreRows = ScoreRows;
  static constexpr int kPvRows = PvRows;
  static constexpr int kPvVecs = PvVecs;
  static constexpr bool kBf16Dot = false;
};

// Logit soft-capping (ScoreMods::softcap) of a vector of scores, as both the fused and the paged
// body compute it, so that a session and an Attend with the same soft-cap agree: cap · tanh(s /
// cap) as cap · (1 - 2 / (exp(2s / cap) + 1)), which is ±cap at ±infinity and keeps NaN.
template <class Ops>
struct SoftCap {
  using V = typename Ops::V;
  explicit SoftCap(float c)
      : cap(Ops::Set1(c)),
        two_over_cap(Ops::Set1(2.0f / c)),
        one(Ops::Set1(1.0f)),
        two(Ops::Set1(2.0f)) {}
  V operator()(V s) const {
    const V e = Ops::Exp(Ops::Mul(s, two_over_cap));
    return Ops::Mul(cap, Ops::Sub(one, Ops::Div(two, Ops::Add(e, one))));
  }
  V cap, two_over_cap, one, two;
};

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_VEC_TILES_H_
