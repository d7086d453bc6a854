// The fused attention kernel in bfloat16 with float32 accumulation, for CPUs with AVX512_BF16
// (and AMX tiles where present). Compiled with per-file flags (kernels/cpu/CMakeLists.txt);
// reached only through kAmxAttentionKernel / kAvx512Bf16AttentionKernel after the run-time checks
// in cpu_features.h.
//
// Operands: Q, K, V and the probabilities P are rounded to bfloat16 (BFLOAT16 inputs are used as
// they are); both products accumulate in float32; the online softmax (scale, masks, running max,
// exp, running sum, rescale) is float32 throughout. This is the arithmetic of a plain
// "bf16 operands, fp32 accumulation" implementation, computed FlashAttention-style.
//
// Layout. Before the attention tasks, K and V of each (batch entry, kv head) are packed once, key
// tile by key tile, into the layouts the products read (the "VNNI" pair layout of AMX and
// vdpbf16ps: two consecutive reduction elements side by side):
//   K tile t: [Dp/2][kKeyTile][2]   so that S = Q·Kᵀ has K as its right operand
//   V tile t: [kKeyTile/2][Dvp][2]  so that O = P·V has V as its right operand
// (Dp, Dvp: D, Dv rounded up to 32, zero padded; keys past Lk are zero). A task then packs its
// kQueryBlock query rows [M][Dp], and per key tile computes S = Q·Kᵀ (float32), the softmax row
// by row into P (bfloat16), and O = O·alpha + P·V. Packing is exact re-arrangement (plus the one
// rounding of float32 and float16 inputs to bfloat16), so results do not depend on where the
// packing ran.
//
// The two paths differ in the products and their order (RunAmx, RunAvx512Bf16): AMX computes S
// for all M rows ([M][kKeyTile]) by TDPBF16PS on 16x32 by 32x16 tiles (2x2 blocking), then the
// softmax of every row, then P·V for all rows; AVX512_BF16 (VDPBF16PS, 4 rows x 4 vectors of 16
// columns) takes the three steps four rows at a time, so that S and P stay in L1. Their
// summation orders differ, so their bits differ; each is deterministic.
#if !defined(__clang__)  // clang has no such warning (and warns about the unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// GCC 12's _mm512_undefined_ps (the pass-through operand of _mm512_max_ps, _mm512_roundscale_ps
// and others) is uninitialised on purpose; it warns once those calls are inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"
#if defined(ATTNSERVE_AMX_EMULATION)
// Tests only: this file compiled a second time with the tile intrinsics replaced by a host
// emulation, so that the AMX path runs on machines without AMX (the header says how).
#include "tests/kernels/cpu/amx_emu.h"
#endif

namespace attnserve::kernels::cpu::bf16 {
namespace {

constexpr int kQ = kQueryBlock;  // 64
constexpr int kN = kKeyTile;     // 128
static_assert(kQ % 32 == 0 && kN % 32 == 0, "tiles are whole AMX blocks");

int Round32(int n) { return static_cast<int>(RoundUp(n, 32)); }
int64_t Align64(int64_t bytes) { return RoundUp(bytes, 64); }

// ---------------------------------------------------------------------------------------------
// Conversions.

// n elements of `type` at src to bfloat16 (float32 and float16 round to nearest even; bfloat16 is
// copied), then zeros up to n_pad.
void ToBf16Row(DType type, const void* src, int n, int n_pad, uint16_t* dst) {
  int x = 0;
  if (type == DType::kBFloat16) {
    std::memcpy(dst, src, sizeof(uint16_t) * n);
    x = n;
  } else {
    for (; x < n; x += 16) {
      const int count = MinInt(16, n - x);
      const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
      __m512 f;
      if (type == DType::kFloat32) {
        f = _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + x);
      } else {
        f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + x));
      }
      const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f));
      _mm256_mask_storeu_epi16(dst + x, m, h);
    }
    x = n;
  }
  for (; x < n_pad; ++x) dst[x] = 0;
}

// n elements of `type` at src to float32 (exact for all three types).
void ToFloatRow(DType type, const void* src, int n, float* dst) {
  if (type == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else if (type == DType::kBFloat16) {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int x = 0; x < n; ++x) dst[x] = __builtin_bit_cast(float, uint32_t{h[x]} << 16);
  } else {
    for (int x = 0; x < n; x += 16) {
      const __mmask16 m = static_cast<__mmask16>((1u << MinInt(16, n - x)) - 1);
      _mm512_mask_storeu_ps(
          dst + x, m,
          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + x)));
    }
  }
}

struct Rows {
  const char* base;
  int64_t stride;
  int esize;
  const void* row(int64_t j) const { return base + j * stride * esize; }
};

Rows InputRows(const AttentionParams& p, const InputView& view, int b, int h) {
  const int esize = p.input_dtype == DType::kFloat32 ? 4 : 2;
  return Rows{
      static_cast<const char*>(view.data) + (b * view.batch_stride + h * view.head_stride) * esize,
      view.row_stride, esize};
}

// ---------------------------------------------------------------------------------------------
// Packed K and V of one (batch entry, kv head).

struct PackedShape {
  int dp, dvp, tiles;
  int64_t k_tile_elems() const { return int64_t{dp} * kN; }
  int64_t v_tile_elems() const { return int64_t{kN} * dvp; }
  int64_t bytes() const { return Align64(tiles * (k_tile_elems() + v_tile_elems()) * 2); }
};

PackedShape ShapeOf(const AttentionParams& p) {
  return PackedShape{Round32(p.head_dim), Round32(p.v_head_dim), (p.kv_len + kN - 1) / kN};
}

int64_t PackedBytes(const AttentionParams& p) { return ShapeOf(p).bytes(); }

void Pack(const AttentionParams& p, int b, int kvh, void* packed) {
  const PackedShape sh = ShapeOf(p);
  const Rows k = InputRows(p, p.k, b, kvh);
  const Rows v = InputRows(p, p.v, b, kvh);
  uint16_t* kp = static_cast<uint16_t*>(packed);
  uint16_t* vp = kp + sh.tiles * sh.k_tile_elems();
  uint16_t row_a[512 + 32], row_b[512 + 32];  // D, Dv <= 512 (kMaxBf16HeadDim)
  for (int t = 0; t < sh.tiles; ++t) {
    const int j0 = t * kN;
    const int keys = MinInt(kN, p.kv_len - j0);
    // K: word (xx, j) = (K[j][2xx], K[j][2xx + 1]).
    uint32_t* kt = reinterpret_cast<uint32_t*>(kp + t * sh.k_tile_elems());
    for (int j = 0; j < kN; ++j) {
      if (j < keys) {
        ToBf16Row(p.input_dtype, k.row(j0 + j), p.head_dim, sh.dp, row_a);
      } else {
        std::memset(row_a, 0, sizeof(uint16_t) * sh.dp);
      }
      const uint32_t* words = reinterpret_cast<const uint32_t*>(row_a);
      for (int xx = 0; xx < sh.dp / 2; ++xx) kt[int64_t{xx} * kN + j] = words[xx];
    }
    // V: pair jj, column c = (V[2jj][c], V[2jj + 1][c]).
    uint16_t* vt = vp + t * sh.v_tile_elems();
    for (int jj = 0; jj < kN / 2; ++jj) {
      const int ja = 2 * jj, jb = 2 * jj + 1;
      if (ja < keys) {
        ToBf16Row(p.input_dtype, v.row(j0 + ja), p.v_head_dim, sh.dvp, row_a);
      } else {
        std::memset(row_a, 0, sizeof(uint16_t) * sh.dvp);
      }
      if (jb < keys) {
        ToBf16Row(p.input_dtype, v.row(j0 + jb), p.v_head_dim, sh.dvp, row_b);
      } else {
        std::memset(row_b, 0, sizeof(uint16_t) * sh.dvp);
      }
      uint16_t* out = vt + int64_t{jj} * sh.dvp * 2;
      for (int c = 0; c < sh.dvp; c += 32) {
        // Interleave 32 columns of the two rows: out[2c'] = a[c'], out[2c' + 1] = b[c'].
        const __m512i a = _mm512_loadu_si512(row_a + c);
        const __m512i bb = _mm512_loadu_si512(row_b + c);
        const __m512i lo_idx =
            _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                             38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
        const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
        _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(a, lo_idx, bb));
        _mm512_storeu_si512(out + 2 * c + 32, _mm512_permutex2var_epi16(a, hi_idx, bb));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tile products: C[M][N] = A[M][K] · B, A row-major bfloat16 (lda elements), B in pair layout
// [K/2][N][2] bfloat16, C row-major float32 (ldc floats). M, N, K multiples of 32.

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void ConfigureTiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

void GemmAmx(const uint16_t* a, int lda, const uint16_t* b, float* c, int ldc, int m, int n,
             int k) {
  const int64_t a_stride = int64_t{lda} * 2;  // bytes
  const int64_t b_stride = int64_t{n} * 4;    // bytes per pair row
  const int64_t c_stride = int64_t{ldc} * 4;
  for (int i = 0; i < m; i += 32) {
    for (int j = 0; j < n; j += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int x = 0; x < k; x += 32) {
        _tile_loadd(4, a + int64_t{i} * lda + x, a_stride);
        _tile_loadd(5, a + int64_t{i + 16} * lda + x, a_stride);
        _tile_loadd(6, b + (int64_t{x / 2} * n + j) * 2, b_stride);
        _tile_loadd(7, b + (int64_t{x / 2} * n + j + 16) * 2, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c + int64_t{i} * ldc + j, c_stride);
      _tile_stored(1, c + int64_t{i} * ldc + j + 16, c_stride);
      _tile_stored(2, c + int64_t{i + 16} * ldc + j, c_stride);
      _tile_stored(3, c + int64_t{i + 16} * ldc + j + 16, c_stride);
    }
  }
}

// C rows [4][16·kVecs] (ldc floats) = A rows [4][k] (lda elements) · B columns [16·kVecs] of a
// pair-layout B whose pair rows are n elements long: VDPBF16PS on 4 x kVecs accumulators, the
// A pair broadcast. With kRescale, the accumulators start from C[r] · alpha[r] instead of zero
// (the online softmax's O = O·alpha + P·V in one pass over O).
template <int kVecs, bool kRescale>
inline void DpBlock(const uint16_t* a, int lda, const uint16_t* b, int n, float* c, int ldc, int k,
                    const float* alpha) {
  __m512 acc[4][kVecs];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      if constexpr (kRescale) {
        acc[r][v] =
            _mm512_mul_ps(_mm512_loadu_ps(c + int64_t{r} * ldc + 16 * v), _mm512_set1_ps(alpha[r]));
      } else {
        acc[r][v] = _mm512_setzero_ps();
      }
    }
  }
  for (int xx = 0; xx < k / 2; ++xx) {
    __m512bh bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + (int64_t{xx} * n + 16 * v) * 2));
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      uint32_t pair;
      std::memcpy(&pair, a + int64_t{r} * lda + 2 * xx, sizeof pair);
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(c + int64_t{r} * ldc + 16 * v, acc[r][v]);
  }
}

// Four rows of A·B (n a multiple of 32), optionally rescaling C first (DpBlock).
template <bool kRescale>
void Gemm4Rows(const uint16_t* a, int lda, const uint16_t* b, float* c, int n, int k,
               const float* alpha) {
  int j = 0;
  for (; j + 64 <= n; j += 64) DpBlock<4, kRescale>(a, lda, b + j * 2, n, c + j, n, k, alpha);
  if (j < n) DpBlock<2, kRescale>(a, lda, b + j * 2, n, c + j, n, k, alpha);
}

// 2^t for t <= 0 (scores minus their running max, in units of log2 e) or NaN: t = n + f with n
// an integer and |f| <= 1/2, 2^f by a degree-4 polynomial (the Taylor series of e^(f ln 2);
// relative error below 4e-5, far under the 2^-9 rounding of P to bfloat16 that follows), and
// 2^n applied by VSCALEFPS. t < -126 (t = -inf included) gives exactly 0, NaN gives NaN.
inline __m512 Exp2NonPositive(__m512 t) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  t = _mm512_max_ps(_mm512_set1_ps(-126.0f), t);  // t second: NaN stays NaN
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(9.6181291e-3f);                  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));  // ln2^2 / 2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

constexpr float kLog2e = 1.44269504088896341f;

// ---------------------------------------------------------------------------------------------
// Per-task scratch.

struct Scratch {
  uint16_t* qa;  // [kQ][Dp]
  float* s;      // [kQ][kN] (the AVX512_BF16 path uses 4 rows)
  uint16_t* pa;  // [kQ][kN] (likewise)
  float* ot;     // [kQ][Dvp]: P·V of the current tile (AMX path only)
  float* o;      // [kQ][Dvp]: running output
  float* m;      // [kQ]
  float* l;      // [kQ][16]: running sums, per row a vector of 16 partial sums
  float* mean;   // [Dvp]
  float* row;    // [max(Dp, Dvp)]
};

int64_t ScratchBytes(int d, int dv) {
  const int64_t dp = Round32(d), dvp = Round32(dv);
  return Align64(kQ * dp * 2) + Align64(int64_t{kQ} * kN * 4) + Align64(int64_t{kQ} * kN * 2) +
         2 * Align64(kQ * dvp * 4) + Align64(kQ * 4) + Align64(kQ * 16 * 4) + Align64(dvp * 4) +
         Align64((dp > dvp ? dp : dvp) * 4);
}

Scratch Carve(void* base, int d, int dv) {
  const int64_t dp = Round32(d), dvp = Round32(dv);
  char* at = static_cast<char*>(base);
  auto take = [&](int64_t bytes) {
    char* p = at;
    at += Align64(bytes);
    return p;
  };
  Scratch s;
  s.qa = reinterpret_cast<uint16_t*>(take(kQ * dp * 2));
  s.s = reinterpret_cast<float*>(take(int64_t{kQ} * kN * 4));
  s.pa = reinterpret_cast<uint16_t*>(take(int64_t{kQ} * kN * 2));
  s.ot = reinterpret_cast<float*>(take(kQ * dvp * 4));
  s.o = reinterpret_cast<float*>(take(kQ * dvp * 4));
  s.m = reinterpret_cast<float*>(take(kQ * 4));
  s.l = reinterpret_cast<float*>(take(kQ * 16 * 4));
  s.mean = reinterpret_cast<float*>(take(dvp * 4));
  s.row = reinterpret_cast<float*>(take((dp > dvp ? dp : dvp) * 4));
  return s;
}

// The mask bits of row (b, h, i) for keys [j0, j0 + 16) as a lane mask (1 = allowed).
__mmask16 MaskBits(const MaskView& mk, const uint8_t* row, int j0, int count) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << count) - 1);
  if (mk.col_stride == 1) {
    const __m128i bytes = _mm_maskz_loadu_epi8(lanes, row + j0);
    return _mm_mask_cmpneq_epi8_mask(lanes, bytes, _mm_setzero_si128());
  }
  if (mk.col_stride == 0) return row[0] != 0 ? lanes : 0;
  unsigned bits = 0;
  for (int x = 0; x < count; ++x) bits |= unsigned{row[(j0 + x) * mk.col_stride] != 0} << x;
  return static_cast<__mmask16>(bits);
}

// The state of one task: its rows, their key limits, the packed operands and the scratch.
struct Task {
  const AttentionParams& p;
  int b, h, i0;
  int rows;  // query rows of this task (<= kQ)
  int max_limit;
  int dp, dvp;         // head dims rounded up to 32
  const uint16_t* kp;  // packed K tiles
  const uint16_t* vp;  // packed V tiles
  Scratch s;
  int limit[kQ];  // keys [limit, kv_len) are blocked for the row (causal, key_lengths)
};

// Rounds the task's queries to bfloat16 into s.qa ([pad_rows][Dp], rows past `rows` zero), sets
// the row limits and the softmax state (m = -inf, l = 0, O = 0).
void Begin(Task& t, int pad_rows) {
  const AttentionParams& p = t.p;
  const Rows q = InputRows(p, p.q, t.b, t.h);
  t.max_limit = 0;
  for (int r = 0; r < pad_rows; ++r) {
    if (r < t.rows) {
      ToBf16Row(p.input_dtype, q.row(t.i0 + r), p.head_dim, t.dp, t.s.qa + int64_t{r} * t.dp);
      t.limit[r] = p.key_limit(t.b, t.i0 + r);
      t.max_limit = MaxInt(t.max_limit, t.limit[r]);
    } else {
      std::memset(t.s.qa + int64_t{r} * t.dp, 0, sizeof(uint16_t) * t.dp);
    }
  }
  for (int r = 0; r < kQ; ++r) {
    t.s.m[r] = kNegInf;
    _mm512_storeu_ps(t.s.l + r * 16, _mm512_setzero_ps());
  }
  std::memset(t.s.o, 0, sizeof(float) * kQ * t.dvp);
}

// SoftmaxRow's common case, a whole tile of allowed keys with scale > 0, with the row's scores
// held in registers between the max and the exp and P converted two vectors at a time. The same
// arithmetic in the same order as the general path (the bits agree).
float SoftmaxFullTile(const Task& t, int r, const float* sr, uint16_t* pr) {
  constexpr int kVecs = kN / 16;
  __m512 sv[kVecs];
  __m512 vmax = _mm512_set1_ps(kNegInf);
#pragma GCC unroll 8
  for (int v = 0; v < kVecs; ++v) {
    sv[v] = _mm512_loadu_ps(sr + 16 * v);
    vmax = _mm512_max_ps(vmax, sv[v]);
  }
  const float tile_max = _mm512_reduce_max_ps(vmax) * t.p.scale;
  const float m_old = t.s.m[r];
  const float m_new = m_old > tile_max ? m_old : tile_max;
  const float m_ref = m_new == kNegInf ? 0.0f : m_new;
  const float alpha = _mm512_cvtss_f32(Exp2NonPositive(_mm512_set1_ps((m_old - m_ref) * kLog2e)));
  const __m512 ref = _mm512_set1_ps(m_ref * kLog2e);
  const __m512 mul = _mm512_set1_ps(t.p.scale * kLog2e);
  __m512 vsum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; v += 2) {
    const __m512 e0 = Exp2NonPositive(_mm512_fmsub_ps(sv[v], mul, ref));
    const __m512 e1 = Exp2NonPositive(_mm512_fmsub_ps(sv[v + 1], mul, ref));
    vsum = _mm512_add_ps(_mm512_add_ps(vsum, e0), e1);
    _mm512_storeu_si512(pr + 16 * v, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0)));
  }
  float* lr = t.s.l + r * 16;
  _mm512_storeu_ps(lr, _mm512_fmadd_ps(_mm512_loadu_ps(lr), _mm512_set1_ps(alpha), vsum));
  t.s.m[r] = m_new;
  return alpha;
}

// The online softmax step of row r over the key tile at j0 (`keys` keys, k_pad = Round32(keys)),
// in float32: sr holds the row's raw scores S[r][0, kN) (overwritten), pr receives P[r][0, k_pad)
// as bfloat16 (zero past keys); updates m[r] and l[r] and returns the rescale factor alpha of
// the row's previous O and l.
float SoftmaxRow(const Task& t, int r, int j0, int keys, int k_pad, float* sr, uint16_t* pr) {
  const AttentionParams& p = t.p;
  const MaskView& mk = p.mask;
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const int allowed_end = MinInt(keys, t.limit[r] - j0);  // keys at or past it are blocked
  const uint8_t* mrow = mk.data != nullptr ? mk.data + t.b * mk.batch_stride +
                                                 t.h * mk.head_stride + (t.i0 + r) * mk.row_stride
                                           : nullptr;
  // Every key of the tile allowed (no mask, below the row's limit) and scale > 0: the max of the
  // raw scores gives the max of the scaled ones, and exp takes s·scale - m in one fused step.
  // Otherwise blocked scores are first replaced by -inf, scaled, in place.
  const bool plain = mrow == nullptr && allowed_end >= keys && p.scale > 0.0f;
  if (plain && keys == kN) return SoftmaxFullTile(t, r, sr, pr);
  __m512 vmax = neg_inf;
  for (int x = 0; x < keys; x += 16) {
    const int count = MinInt(16, keys - x);
    const __mmask16 lanes = static_cast<__mmask16>((1u << count) - 1);
    if (plain) {
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, lanes, sr + x));
      continue;
    }
    __mmask16 ok = allowed_end <= x ? 0
                                    : (allowed_end >= x + 16
                                           ? lanes
                                           : static_cast<__mmask16>((1u << (allowed_end - x)) - 1));
    if (mrow != nullptr && ok != 0) ok &= MaskBits(mk, mrow, j0 + x, count);
    const __m512 v = _mm512_mask_mul_ps(neg_inf, ok, _mm512_loadu_ps(sr + x), scale);
    _mm512_storeu_ps(sr + x, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  const float tile_max = plain ? _mm512_reduce_max_ps(vmax) * p.scale : _mm512_reduce_max_ps(vmax);
  const float m_old = t.s.m[r];
  const float m_new = m_old > tile_max ? m_old : tile_max;
  const float m_ref = m_new == kNegInf ? 0.0f : m_new;
  const float alpha = _mm512_cvtss_f32(Exp2NonPositive(_mm512_set1_ps((m_old - m_ref) * kLog2e)));
  // exp(s·scale - m) = 2^(s·(scale·log2 e) - m·log2 e), one fused step per vector.
  const __m512 ref = _mm512_set1_ps(m_ref * kLog2e);
  const __m512 mul = _mm512_set1_ps(plain ? p.scale * kLog2e : kLog2e);
  __m512 vsum = _mm512_setzero_ps();
  for (int x = 0; x < k_pad; x += 16) {
    __m512 e = _mm512_setzero_ps();
    if (x < keys) {
      const __mmask16 lanes = static_cast<__mmask16>((1u << MinInt(16, keys - x)) - 1);
      const __m512 sc = _mm512_loadu_ps(sr + x);
      e = _mm512_maskz_mov_ps(lanes, Exp2NonPositive(_mm512_fmsub_ps(sc, mul, ref)));
    }
    vsum = _mm512_add_ps(vsum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + x),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  }
  // The running sum stays a vector of partial sums (one horizontal sum per row, at the end).
  float* lr = t.s.l + r * 16;
  _mm512_storeu_ps(lr, _mm512_fmadd_ps(_mm512_loadu_ps(lr), _mm512_set1_ps(alpha), vsum));
  t.s.m[r] = m_new;
  return alpha;
}

// out = O / l; a row that met no allowed key gets the mean of all values (float32).
void Finish(const Task& t) {
  const AttentionParams& p = t.p;
  const int kvh = t.h / (p.num_heads / p.num_kv_heads);
  const Rows v = InputRows(p, p.v, t.b, kvh);
  bool have_mean = false;
  for (int r = 0; r < t.rows; ++r) {
    float* out = p.out.data + t.b * p.out.batch_stride + t.h * p.out.head_stride +
                 (t.i0 + r) * p.out.row_stride;
    const float l = _mm512_reduce_add_ps(_mm512_loadu_ps(t.s.l + r * 16));
    if (l == 0.0f) {  // fully blocked; not m == -inf, which a NaN score can leave
      if (!have_mean) {
        for (int c = 0; c < p.v_head_dim; ++c) t.s.mean[c] = 0.0f;
        for (int j = 0; j < p.kv_len; ++j) {
          ToFloatRow(p.input_dtype, v.row(j), p.v_head_dim, t.s.row);
          for (int c = 0; c < p.v_head_dim; ++c) t.s.mean[c] += t.s.row[c];
        }
        const float inv = 1.0f / static_cast<float>(p.kv_len);
        for (int c = 0; c < p.v_head_dim; ++c) t.s.mean[c] *= inv;
        have_mean = true;
      }
      for (int c = 0; c < p.v_head_dim; ++c) out[c] = t.s.mean[c];
    } else {
      const __m512 inv_l = _mm512_set1_ps(1.0f / l);
      const float* orow = t.s.o + int64_t{r} * t.dvp;
      for (int c = 0; c < p.v_head_dim; c += 16) {
        const __mmask16 lanes = static_cast<__mmask16>((1u << MinInt(16, p.v_head_dim - c)) - 1);
        _mm512_mask_storeu_ps(out + c, lanes, _mm512_mul_ps(_mm512_loadu_ps(orow + c), inv_l));
      }
    }
  }
}

Task MakeTask(const AttentionParams& p, int b, int h, int i0, const void* packed, void* scratch) {
  const PackedShape sh = ShapeOf(p);
  const uint16_t* kp = static_cast<const uint16_t*>(packed);
  return Task{p,
              b,
              h,
              i0,
              MinInt(kQ, p.q_len - i0),
              0,
              sh.dp,
              sh.dvp,
              kp,
              kp + sh.tiles * sh.k_tile_elems(),
              Carve(scratch, p.head_dim, p.v_head_dim),
              {}};
}

// AMX: per key tile, S for all the task's rows (padded to 32) in one tile product, the softmax
// row by row, P·V for all rows, then O = O·alpha + P·V.
void RunAmx(const AttentionParams& p, int b, int h, int i0, const void* packed, void* scratch) {
  Task t = MakeTask(p, b, h, i0, packed, scratch);
  const PackedShape sh = ShapeOf(p);
  const Scratch& s = t.s;
  const int m_rows = Round32(t.rows);
  const int dvp = t.dvp;
  ConfigureTiles();
  Begin(t, m_rows);
  for (int r = t.rows; r < m_rows; ++r)
    std::memset(s.pa + int64_t{r} * kN, 0, sizeof(uint16_t) * kN);
  float alpha[kQ];  // rescale factor of the current tile, per row
  for (int j0 = 0; j0 < t.max_limit; j0 += kN) {
    const int tile = j0 / kN;
    const int keys = MinInt(kN, p.kv_len - j0);
    const int k_pad = Round32(keys);
    // 1. S = Q·Kᵀ over the tile ([m_rows][k_pad], float32).
    GemmAmx(s.qa, t.dp, t.kp + tile * sh.k_tile_elems(), s.s, kN, m_rows, kN, t.dp);
    // 2. Online softmax, row by row, in float32; P rounded to bfloat16.
    for (int r = 0; r < t.rows; ++r) {
      alpha[r] = SoftmaxRow(t, r, j0, keys, k_pad, s.s + int64_t{r} * kN, s.pa + int64_t{r} * kN);
    }
    // 3. O_tile = P·V_tile ([m_rows][Dvp]), then O = O · alpha + O_tile.
    GemmAmx(s.pa, kN, t.vp + tile * sh.v_tile_elems(), s.ot, dvp, m_rows, dvp, k_pad);
    for (int r = 0; r < t.rows; ++r) {
      float* orow = s.o + int64_t{r} * dvp;
      const float* trow = s.ot + int64_t{r} * dvp;
      const __m512 va = _mm512_set1_ps(alpha[r]);
      for (int c = 0; c < dvp; c += 16) {
        _mm512_storeu_ps(orow + c,
                         _mm512_fmadd_ps(_mm512_loadu_ps(orow + c), va, _mm512_loadu_ps(trow + c)));
      }
    }
  }
  _tile_release();
  Finish(t);
}

// AVX512_BF16: per key tile, four query rows at a time go through all three steps (S = Q·Kᵀ
// for the 4 rows, their softmax, O = O·alpha + P·V) before the next four, so that S and P stay
// in L1 (4 x 128 floats and bfloat16s) instead of making a round trip through L2 for all 64 rows
// as in the AMX order; the rescale of O is folded into the P·V accumulators' start.
void RunAvx512Bf16(const AttentionParams& p, int b, int h, int i0, const void* packed,
                   void* scratch) {
  Task t = MakeTask(p, b, h, i0, packed, scratch);
  const PackedShape sh = ShapeOf(p);
  const Scratch& s = t.s;
  const int pad_rows = (t.rows + 3) / 4 * 4;
  Begin(t, pad_rows);
  float alpha[4];
  for (int j0 = 0; j0 < t.max_limit; j0 += kN) {
    const int tile = j0 / kN;
    const int keys = MinInt(kN, p.kv_len - j0);
    const int k_pad = Round32(keys);
    const uint16_t* kt = t.kp + tile * sh.k_tile_elems();
    const uint16_t* vt = t.vp + tile * sh.v_tile_elems();
    for (int r0 = 0; r0 < t.rows; r0 += 4) {
      Gemm4Rows<false>(s.qa + int64_t{r0} * t.dp, t.dp, kt, s.s, kN, t.dp, nullptr);
      for (int r = 0; r < 4; ++r) {
        uint16_t* pr = s.pa + int64_t{r} * kN;
        if (r0 + r < t.rows) {
          alpha[r] = SoftmaxRow(t, r0 + r, j0, keys, k_pad, s.s + int64_t{r} * kN, pr);
        } else {  // padding rows: P = 0, O stays 0
          alpha[r] = 0.0f;
          std::memset(pr, 0, sizeof(uint16_t) * k_pad);
        }
      }
      Gemm4Rows<true>(s.pa, kN, vt, s.o + int64_t{r0} * t.dvp, t.dvp, k_pad, alpha);
    }
  }
  Finish(t);
}

void ToBf16(DType type, const void* src, int n, uint16_t* dst) { ToBf16Row(type, src, n, n, dst); }

}  // namespace
}  // namespace attnserve::kernels::cpu::bf16

namespace attnserve::kernels::cpu {
#if defined(ATTNSERVE_AMX_EMULATION)
extern const Bf16AttentionKernel kAmxEmulatedAttentionKernel = {
    Bf16Isa::kAmx,       "amx_bf16_emulated", &bf16::PackedBytes, &bf16::Pack,
    &bf16::ScratchBytes, &bf16::RunAmx,       &bf16::ToBf16};
#else
extern const Bf16AttentionKernel kAmxAttentionKernel = {
    Bf16Isa::kAmx,       "amx_bf16",    &bf16::PackedBytes, &bf16::Pack,
    &bf16::ScratchBytes, &bf16::RunAmx, &bf16::ToBf16};
extern const Bf16AttentionKernel kAvx512Bf16AttentionKernel = {
    Bf16Isa::kAvx512Bf16, "avx512_bf16",        &bf16::PackedBytes, &bf16::Pack,
    &bf16::ScratchBytes,  &bf16::RunAvx512Bf16, &bf16::ToBf16};
#endif
}  // namespace attnserve::kernels::cpu
