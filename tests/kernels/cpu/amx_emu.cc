#include "tests/kernels/cpu/amx_emu.h"

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attnserve::kernels::testing::amx_emu {
namespace {

constexpr int kTiles = 8;      // palette 1
constexpr int kMaxRows = 16;   // palette 1: max_rows
constexpr int kMaxColsb = 64;  // palette 1: bytes_per_row

// The 64-byte LDTILECFG operand (SDM vol. 1, "Tile configuration").
struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

struct TileState {
  bool configured = false;
  int rows[kTiles] = {};
  int colsb[kTiles] = {};
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb] = {};
};

thread_local TileState state;
std::atomic<uint64_t> dp_count{0};

[[noreturn]] void Fail(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Fail(const char* format, ...) {
  std::fputs("AMX emulation: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputs("\n", stderr);
  std::abort();
}

// The tile `t` as `op` uses it: configured, in range, with a shape.
void CheckTile(const char* op, int t) {
  if (!state.configured) {
    Fail(
        "%s tmm%d without a tile configuration (no LDTILECFG on this thread, or after TILERELEASE)",
        op, t);
  }
  if (t < 0 || t >= kTiles) Fail("%s: tile index %d out of range [0, %d)", op, t, kTiles);
  if (state.rows[t] == 0) Fail("%s: tmm%d is not configured (rows 0, colsb 0)", op, t);
}

// bfloat16 as float32 with input denormals treated as zero (DAZ).
float Bf16Daz(uint16_t h) {
  if ((h & 0x7f80) == 0) h &= 0x8000;
  return __builtin_bit_cast(float, uint32_t{h} << 16);
}

float Daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float Ftz(float x) { return Daz(x); }

// The arithmetic of TDPBF16PS on shapes already checked. Cloned for FMA hardware, where std::fmaf
// becomes one instruction instead of a library call (the emulated kernel runs every tile product
// here); both clones compute the same correctly rounded FMA.
__attribute__((target_clones("fma", "default"))) void Product(int c, int a, int b, int m_rows,
                                                              int n_cols, int k_pairs) {
  for (int m = 0; m < m_rows; ++m) {
    uint16_t arow[kMaxColsb / 2];
    std::memcpy(arow, state.data[a][m], sizeof arow);
    float even[kMaxColsb / 4] = {}, odd[kMaxColsb / 4] = {};
    for (int k = 0; k < k_pairs; ++k) {
      uint16_t brow[kMaxColsb / 2];
      std::memcpy(brow, state.data[b][k], sizeof brow);
      const float a0 = Bf16Daz(arow[2 * k]), a1 = Bf16Daz(arow[2 * k + 1]);
      for (int n = 0; n < n_cols; ++n) {
        even[n] = Ftz(std::fmaf(a0, Bf16Daz(brow[2 * n]), even[n]));
        odd[n] = Ftz(std::fmaf(a1, Bf16Daz(brow[2 * n + 1]), odd[n]));
      }
    }
    float crow[kMaxColsb / 4];
    std::memcpy(crow, state.data[c][m], sizeof crow);
    for (int n = 0; n < n_cols; ++n) crow[n] = Ftz(Daz(crow[n]) + Ftz(even[n] + odd[n]));
    std::memcpy(state.data[c][m], crow, sizeof crow);
    std::memset(state.data[c][m] + state.colsb[c], 0, kMaxColsb - state.colsb[c]);
  }
  for (int m = m_rows; m < kMaxRows; ++m) std::memset(state.data[c][m], 0, kMaxColsb);
}

}  // namespace

void LoadConfig(const void* config) {
  TileConfig cfg;
  std::memcpy(&cfg, config, sizeof cfg);
  if (cfg.palette_id == 0) {  // the init state: no tile configured
    Release();
    return;
  }
  if (cfg.palette_id != 1) Fail("LDTILECFG: palette %d (only 0 and 1 exist)", cfg.palette_id);
  for (int i = 0; i < 14; ++i) {
    if (cfg.reserved[i] != 0)
      Fail("LDTILECFG: reserved byte %d is %d, not 0", i + 2, cfg.reserved[i]);
  }
  for (int t = 0; t < 16; ++t) {
    const int rows = cfg.rows[t], colsb = cfg.colsb[t];
    if (t >= kTiles && (rows != 0 || colsb != 0)) {
      Fail("LDTILECFG: tile %d configured (rows %d, colsb %d); palette 1 has %d tiles", t, rows,
           colsb, kTiles);
    }
    if (rows > kMaxRows || colsb > kMaxColsb) {
      Fail("LDTILECFG: tile %d has rows %d, colsb %d (at most %d and %d)", t, rows, colsb, kMaxRows,
           kMaxColsb);
    }
    if ((rows == 0) != (colsb == 0)) {
      Fail("LDTILECFG: tile %d has rows %d, colsb %d (both or neither must be 0)", t, rows, colsb);
    }
  }
  if (cfg.start_row != 0)
    Fail("LDTILECFG: start_row %d (restarts are not emulated)", cfg.start_row);
  for (int t = 0; t < kTiles; ++t) {
    state.rows[t] = cfg.rows[t];
    state.colsb[t] = cfg.colsb[t];
  }
  std::memset(state.data, 0, sizeof state.data);
  state.configured = true;
}

void Release() { state = TileState{}; }

void Zero(int tile) {
  CheckTile("TILEZERO", tile);
  std::memset(state.data[tile], 0, sizeof state.data[tile]);
}

void Load(int tile, const void* base, std::ptrdiff_t stride) {
  CheckTile("TILELOADD", tile);
  std::memset(state.data[tile], 0, sizeof state.data[tile]);
  const char* src = static_cast<const char*>(base);
  for (int r = 0; r < state.rows[tile]; ++r) {
    std::memcpy(state.data[tile][r], src + r * stride, state.colsb[tile]);
  }
}

void Store(int tile, void* base, std::ptrdiff_t stride) {
  CheckTile("TILESTORED", tile);
  char* dst = static_cast<char*>(base);
  for (int r = 0; r < state.rows[tile]; ++r) {
    std::memcpy(dst + r * stride, state.data[tile][r], state.colsb[tile]);
  }
}

void DpBf16Ps(int c, int a, int b) {
  CheckTile("TDPBF16PS", c);
  CheckTile("TDPBF16PS", a);
  CheckTile("TDPBF16PS", b);
  if (c == a || c == b || a == b) {
    Fail("TDPBF16PS tmm%d, tmm%d, tmm%d: the three tiles must be distinct", c, a, b);
  }
  const int m_rows = state.rows[c], n_cols = state.colsb[c] / 4, k_pairs = state.colsb[a] / 4;
  if (state.colsb[c] % 4 != 0 || state.colsb[a] % 4 != 0 || state.colsb[b] % 4 != 0 ||
      state.colsb[a] / 4 != state.rows[b] || state.colsb[c] != state.colsb[b] ||
      state.rows[c] != state.rows[a]) {
    Fail(
        "TDPBF16PS tmm%d (C: rows %d, colsb %d), tmm%d (A: rows %d, colsb %d), tmm%d (B: rows %d, "
        "colsb %d): shapes do not chain (need A.colsb = 4 * B.rows, C.colsb = B.colsb, "
        "C.rows = A.rows, all colsb multiples of 4)",
        c, state.rows[c], state.colsb[c], a, state.rows[a], state.colsb[a], b, state.rows[b],
        state.colsb[b]);
  }
  dp_count.fetch_add(1, std::memory_order_relaxed);
  Product(c, a, b, m_rows, n_cols, k_pairs);
}

uint64_t DpBf16PsCount() { return dp_count.load(std::memory_order_relaxed); }

}  // namespace attnserve::kernels::testing::amx_emu
