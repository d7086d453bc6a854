// The AMX emulation itself (amx_emu.h): the tile shapes honoured, TDPBF16PS's arithmetic as the
// SDM states it (pair layout, even/odd accumulators, DAZ, FTZ), and loud failure on misuse. The
// kernel that runs on it is tested in cpu_backend_test.cc (the amx_bf16_emulated path). Plain
// C++: runs on every machine.
#include "tests/kernels/cpu/amx_emu.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::kernels::testing::amx_emu {
namespace {

struct Config {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(Config) == 64);

uint16_t Bf16(float x) {  // x must be exact in bfloat16
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  EXPECT_EQ(bits & 0xffff, 0u) << x << " is not a bfloat16 value";
  return static_cast<uint16_t>(bits >> 16);
}

// C[m][n] += A[m][k] · B[k][n] with A (m x 2·k_pairs) row-major and B given as its k x n matrix,
// packed here into the pair layout [k/2][n][2]; one TDPBF16PS on tiles configured to these shapes.
std::vector<float> TileProduct(int m, int n, int k, const std::vector<float>& a,
                               const std::vector<float>& b, const std::vector<float>& c0) {
  Config cfg;
  cfg.rows[0] = m, cfg.colsb[0] = 4 * n;      // C: m x n float32
  cfg.rows[1] = m, cfg.colsb[1] = 2 * k;      // A: m x k bfloat16
  cfg.rows[2] = k / 2, cfg.colsb[2] = 4 * n;  // B: k/2 pair rows of n pairs
  LoadConfig(&cfg);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = Bf16(a[i]);
  for (int kk = 0; kk < k; ++kk) {
    for (int j = 0; j < n; ++j) b16[(kk / 2) * n * 2 + j * 2 + kk % 2] = Bf16(b[kk * n + j]);
  }
  std::vector<float> c = c0;
  Load(0, c.data(), 4 * n);
  Load(1, a16.data(), 2 * k);
  Load(2, b16.data(), 4 * n);
  DpBf16Ps(0, 1, 2);
  Store(0, c.data(), 4 * n);
  Release();
  return c;
}

TEST(AmxEmuTest, ProductOfSmallIntegersIsExact) {
  // Integers small enough that every sum is exact in float32: the result must be the integer
  // product, whatever the order, for odd shapes (rows 5, 6 pairs, 3 columns).
  constexpr int m = 5, n = 3, k = 12;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<float> a(m * k), b(k * n), c0(m * n);
  for (float& x : a) x = static_cast<float>(value(rng));
  for (float& x : b) x = static_cast<float>(value(rng));
  for (float& x : c0) x = static_cast<float>(value(rng));
  const std::vector<float> c = TileProduct(m, n, k, a, b, c0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      int64_t want = static_cast<int64_t>(c0[i * n + j]);
      for (int kk = 0; kk < k; ++kk) {
        want += static_cast<int64_t>(a[i * k + kk]) * static_cast<int64_t>(b[kk * n + j]);
      }
      EXPECT_EQ(c[i * n + j], static_cast<float>(want)) << "C[" << i << "][" << j << "]";
    }
  }
  EXPECT_GT(DpBf16PsCount(), 0u);
}

TEST(AmxEmuTest, EvenAndOddProductsAccumulateApartAsTheSdmSays) {
  // A = [1 1 1 1], B column = [2^24, -2^24, 1, 1]ᵀ (k = 4: pairs (2^24, -2^24) and (1, 1)).
  // SDM: even = RNE(2^24 + 1) = 2^24, odd = -2^24 + 1 (exact), C = 0 + (even + odd) = 1.
  // One running sum in k order (the intrinsics guide's description) would give 2.
  const std::vector<float> a = {1, 1, 1, 1};
  const std::vector<float> b = {16777216.0f, -16777216.0f, 1, 1};
  EXPECT_EQ(TileProduct(1, 1, 4, a, b, {0.0f})[0], 1.0f);
}

TEST(AmxEmuTest, InputDenormalsAreZeroAndOutputDenormalsFlushed) {
  const float denormal_bf16 = __builtin_bit_cast(float, uint32_t{0x00010000});  // 2^-133
  const float two_100 = std::ldexp(1.0f, 100), two_m70 = std::ldexp(1.0f, -70);
  // DAZ: a denormal operand counts as 0 (2^-133 · 2^100 = 2^-33 otherwise).
  EXPECT_EQ(TileProduct(1, 1, 2, {denormal_bf16, 0}, {two_100, 0}, {0.0f})[0], 0.0f);
  // FTZ: 2^-70 · 2^-70 = 2^-140 is a float32 denormal, flushed to 0.
  EXPECT_EQ(TileProduct(1, 1, 2, {two_m70, 0}, {two_m70, 0}, {0.0f})[0], 0.0f);
  // DAZ on C: a denormal accumulator counts as 0.
  const float denormal = std::ldexp(1.0f, -140);
  EXPECT_EQ(TileProduct(1, 1, 2, {0, 0}, {0, 0}, {denormal})[0], 0.0f);
  // Normal values near the bottom of the range stay.
  EXPECT_EQ(TileProduct(1, 1, 2, {two_m70, 0}, {std::ldexp(1.0f, -50), 0}, {0.0f})[0],
            std::ldexp(1.0f, -120));
}

TEST(AmxEmuTest, LoadsAndStoresTouchOnlyTheConfiguredShape) {
  Config cfg;
  cfg.rows[3] = 3, cfg.colsb[3] = 8;
  cfg.rows[4] = 16, cfg.colsb[4] = 64;
  LoadConfig(&cfg);
  std::vector<uint8_t> src(4 * 20), dst(4 * 20, 0xAA), wide(16 * 64, 0xAA);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i + 1);
  Load(3, src.data(), 20);
  Store(3, dst.data(), 20);
  for (int r = 0; r < 4; ++r) {
    for (int x = 0; x < 20; ++x) {
      const bool inside = r < 3 && x < 8;
      EXPECT_EQ(dst[r * 20 + x], inside ? src[r * 20 + x] : 0xAA) << "row " << r << " byte " << x;
    }
  }
  // TILEZERO clears the whole register.
  Zero(4);
  Store(4, wide.data(), 64);
  for (uint8_t byte : wide) ASSERT_EQ(byte, 0);
  Release();
}

// Misuse aborts with a message naming the problem. Each misuse as a function (for EXPECT_DEATH).
void ConfigureSquareTiles() {
  Config cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  LoadConfig(&cfg);
}
void ConfigureOneTile(int tile, int rows, int colsb, int palette = 1) {
  Config cfg;
  cfg.palette_id = static_cast<uint8_t>(palette);
  cfg.rows[tile] = static_cast<uint8_t>(rows);
  cfg.colsb[tile] = static_cast<uint16_t>(colsb);
  LoadConfig(&cfg);
}
void LoadWithoutConfiguration() {
  float buffer[16 * 16] = {};
  Load(0, buffer, 64);
}
void ZeroAfterRelease() {
  ConfigureSquareTiles();
  Release();
  Zero(1);
}
void ProductWithBTooShort() {
  Config cfg;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;
  cfg.rows[1] = 16, cfg.colsb[1] = 64;
  cfg.rows[2] = 8, cfg.colsb[2] = 64;  // B has 8 pair rows; A has 16 pairs
  LoadConfig(&cfg);
  DpBf16Ps(0, 1, 2);
}
void ProductWithCAsA() {
  ConfigureSquareTiles();
  DpBf16Ps(0, 0, 2);
}
void ProductOnUnconfiguredTiles() {
  ConfigureOneTile(0, 16, 64);
  DpBf16Ps(0, 1, 2);
}
void ZeroTileEight() {
  ConfigureSquareTiles();
  Zero(8);
}

TEST(AmxEmuDeathTest, TileUseWithoutConfigurationAborts) {
  EXPECT_DEATH(LoadWithoutConfiguration(), "TILELOADD tmm0 without a tile configuration");
  EXPECT_DEATH(ZeroAfterRelease(), "TILEZERO tmm1 without a tile configuration");
}

TEST(AmxEmuDeathTest, BadConfigurationAborts) {
  EXPECT_DEATH(ConfigureOneTile(0, 17, 64), "tile 0 has rows 17, colsb 64");
  EXPECT_DEATH(ConfigureOneTile(0, 16, 65), "tile 0 has rows 16, colsb 65");
  EXPECT_DEATH(ConfigureOneTile(9, 1, 4), "tile 9 configured");
  EXPECT_DEATH(ConfigureOneTile(2, 4, 0), "both or neither must be 0");
  EXPECT_DEATH(ConfigureOneTile(0, 16, 64, /*palette=*/2), "palette 2");
}

TEST(AmxEmuDeathTest, MisusedProductAborts) {
  EXPECT_DEATH(ProductWithBTooShort(), "shapes do not chain");
  EXPECT_DEATH(ProductWithCAsA(), "must be distinct");
  EXPECT_DEATH(ProductOnUnconfiguredTiles(), "tmm1 is not configured");
  EXPECT_DEATH(ZeroTileEight(), "tile index 8 out of range");
}

}  // namespace
}  // namespace attnserve::kernels::testing::amx_emu
