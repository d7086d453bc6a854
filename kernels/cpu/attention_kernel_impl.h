// The body of the fused attention kernel, written once against a small vector-traits struct and
// compiled once per instruction set. NOT a normal header: it has no include guard and is
// included exactly once, at the end of each per-ISA translation unit (attention_avx512.cc,
// attention_avx2.cc, attention_generic.cc), after that unit has included its vector traits and
// defined
//
//   ATTNSERVE_CPU_ISA_NAMESPACE   a namespace name unique to the unit (avx512, avx2, generic)
//   ATTNSERVE_CPU_KERNEL(make)    the kernel's constant: `kXAttentionKernel = make(isa, name)`
//   ATTNSERVE_CPU_TILES           the tiles, Vec here (vec_tiles.h's AttentionTiles), with
//     V, kWidth                    the vector type and its number of float lanes
//     kScoreKeys, kScoreVecs       register block of the score kernel (keys x row vectors)
//     kPvCols, kPvVecs             register block of the P·V kernel (value columns x row vectors)
//     Zero, Set1, Load, Store, Add, Sub, Mul, Div, Max, Fmadd(a, b, c) = a·b + c,
//     Exp (exp(-inf) = 0), MaskBeyond(s, limit, pos) = pos >= limit ? -inf : s,
//     ZeroIfNegInf(x) = x == -inf ? 0 : x,
//     HalfToFloat(src, n, dst)     n IEEE binary16 values to float32 (exact)
//
// Everything here has internal linkage (an unnamed namespace inside the ISA namespace), and the
// body calls no inline function of another header: an out-of-line copy of such a function
// compiled with AVX-512 flags could otherwise be chosen by the linker for the generic path and
// crash a CPU without AVX-512 (AttentionParams' key_limit and key_start are out of line for it).
//
// Layout. Vectors run across the kQueryBlock query rows of a task (one row per lane): the task
// packs Qᵀ [D][kQueryBlock] once, computes Sᵀ = K·Qᵀ tile by tile [keys][rows] straight from the
// caller's strided K rows, and accumulates Oᵀ [Dv][rows] straight from the strided V rows. The
// running max, running sum and rescale factors of the online softmax are then plain vertical
// vector operations; float32 K and V are never copied. FLOAT16 / BFLOAT16 inputs are widened
// (exactly) one key tile at a time into the task's scratch, so a 16-bit request gives the bits a
// float32 request with the same values gives, and no float32 copy of a whole tensor exists.

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::ATTNSERVE_CPU_ISA_NAMESPACE {
namespace {

using Vec = ATTNSERVE_CPU_TILES;
using V = Vec::V;
constexpr int kW = Vec::kWidth;
constexpr int kQ = kQueryBlock;

static_assert(kQ % kW == 0, "the query block must be a whole number of vectors");
static_assert(Vec::kScoreVecs * kW <= kQ && Vec::kPvVecs * kW <= kQ, "register block too wide");
static_assert(kKeyTile % 8 == 0, "key tile");

// Per-task scratch, carved from one 64-byte aligned buffer. Every [.][kQ] row starts on a
// 64-byte boundary.
struct Scratch {
  float* kt;     // [kKeyTile][D]: a key tile widened to float32 (16-bit inputs only)
  float* vt;     // [kKeyTile][Dv]: a value tile widened to float32 (16-bit inputs only)
  float* qt;     // [D][kQ]: scaled queries, transposed
  float* st;     // [kKeyTile][kQ]: scores, then probabilities, of one key tile
  float* ot;     // [Dv][kQ]: unnormalised output accumulator, transposed
  float* m;      // [kQ]: running max per row (-inf until the row meets an allowed key)
  float* l;      // [kQ]: running sum of exp(s - m) per row
  float* alpha;  // [kQ]: rescale factor of the current tile, exp(m_old - m_new)
  float* limit;  // [kQ]: key_limit per row, as float (exact below 2^24)
  float* lower;  // [kQ]: 1 - key_start per row (a key j is before the window iff -j >= lower)
  float* pos;    // [kQ]: the row's aligned position i' = i + Lk - Lq (ALiBi)
  float* mean;   // [Dv]: mean of all value rows, for rows with no allowed key
};

int64_t ScratchFloats(int d, int dv) {
  return Align16(int64_t{kKeyTile} * d) + Align16(int64_t{kKeyTile} * dv) +
         Align16(int64_t{d} * kQ) + Align16(int64_t{kKeyTile} * kQ) + Align16(int64_t{dv} * kQ) +
         6 * kQ + Align16(dv);
}

Scratch CarveScratch(float* base, int d, int dv) {
  Scratch s;
  s.kt = base;
  s.vt = s.kt + Align16(int64_t{kKeyTile} * d);
  s.qt = s.vt + Align16(int64_t{kKeyTile} * dv);
  s.st = s.qt + Align16(int64_t{d} * kQ);
  s.ot = s.st + Align16(int64_t{kKeyTile} * kQ);
  s.m = s.ot + Align16(int64_t{dv} * kQ);
  s.l = s.m + kQ;
  s.alpha = s.l + kQ;
  s.limit = s.alpha + kQ;
  s.lower = s.limit + kQ;
  s.pos = s.lower + kQ;
  s.mean = s.pos + kQ;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Score kernel: st[j][r] = sum_x qt[x][r] · k[j][x] for kKeys keys and kVecs row vectors; each
// score is one multiply-add chain over x = 0..D-1, whatever block it is computed in.
template <int kKeys, int kVecs>
inline void ScoreBlock(const float* qt, int d, const float* k, int64_t k_stride, float* st) {
  V acc[kKeys][kVecs];
  ZeroBlock<Vec>(acc);
  for (int x = 0; x < d; ++x) {
    V q[kVecs];
#pragma GCC unroll 16
    for (int n = 0; n < kVecs; ++n) q[n] = Vec::Load(qt + int64_t{x} * kQ + n * kW);
#pragma GCC unroll 16
    for (int jj = 0; jj < kKeys; ++jj) {
      const V kb = Vec::Set1(k[jj * k_stride + x]);
#pragma GCC unroll 16
      for (int n = 0; n < kVecs; ++n) acc[jj][n] = Vec::Fmadd(q[n], kb, acc[jj][n]);
    }
  }
#pragma GCC unroll 16
  for (int jj = 0; jj < kKeys; ++jj) {
#pragma GCC unroll 16
    for (int n = 0; n < kVecs; ++n) Vec::Store(st + jj * kQ + n * kW, acc[jj][n]);
  }
}

// The key remainder (fewer than kScoreKeys keys), one instantiation per size.
template <int kKeys, int kVecs>
inline void ScoreKeyTail(int keys, const float* qt, int d, const float* k, int64_t k_stride,
                         float* st) {
  if constexpr (kKeys > 0) {
    if (keys == kKeys) {
      ScoreBlock<kKeys, kVecs>(qt, d, k, k_stride, st);
    } else {
      ScoreKeyTail<kKeys - 1, kVecs>(keys, qt, d, k, k_stride, st);
    }
  }
}

template <int kVecs>
void ScoreRows(const float* qt, int d, const float* k, int64_t k_stride, int keys, float* st) {
  constexpr int kKeys = Vec::kScoreKeys;
  int j = 0;
  for (; j + kKeys <= keys; j += kKeys) {
    ScoreBlock<kKeys, kVecs>(qt, d, k + j * k_stride, k_stride, st + j * kQ);
  }
  ScoreKeyTail<kKeys - 1, kVecs>(keys - j, qt, d, k + j * k_stride, k_stride, st + j * kQ);
}

template <int kVecs>
inline void ScoreVecTail(int vecs, const float* qt, int d, const float* k, int64_t k_stride,
                         int keys, float* st) {
  if constexpr (kVecs > 0) {
    if (vecs == kVecs) {
      ScoreRows<kVecs>(qt, d, k, k_stride, keys, st);
    } else {
      ScoreVecTail<kVecs - 1>(vecs, qt, d, k, k_stride, keys, st);
    }
  }
}

// st[0..keys)[0..row_vecs·kW) for the keys starting at k.
void ScoreTile(const float* qt, int d, const float* k, int64_t k_stride, int keys, int row_vecs,
               float* st) {
  constexpr int kVecs = Vec::kScoreVecs;
  int n = 0;
  for (; n + kVecs <= row_vecs; n += kVecs) {
    ScoreRows<kVecs>(qt + n * kW, d, k, k_stride, keys, st + n * kW);
  }
  ScoreVecTail<kVecs - 1>(row_vecs - n, qt + n * kW, d, k, k_stride, keys, st + n * kW);
}

// ---------------------------------------------------------------------------------------------
// P·V kernel: ot[c][r] = ot[c][r] · alpha[r] + sum_j pt[j][r] · v[j][c] for kCols value columns
// and kVecs row vectors; the sum runs over j = 0..keys-1 in order.
template <int kCols, int kVecs>
inline void PvBlock(const float* pt, int keys, const float* v, int64_t v_stride, const float* alpha,
                    float* ot) {
  V acc[kCols][kVecs];
  V a[kVecs];
#pragma GCC unroll 16
  for (int n = 0; n < kVecs; ++n) a[n] = Vec::Load(alpha + n * kW);
#pragma GCC unroll 16
  for (int cc = 0; cc < kCols; ++cc) {
#pragma GCC unroll 16
    for (int n = 0; n < kVecs; ++n) acc[cc][n] = Vec::Mul(Vec::Load(ot + cc * kQ + n * kW), a[n]);
  }
  for (int j = 0; j < keys; ++j) {
    V pr[kVecs];
#pragma GCC unroll 16
    for (int n = 0; n < kVecs; ++n) pr[n] = Vec::Load(pt + j * kQ + n * kW);
#pragma GCC unroll 16
    for (int cc = 0; cc < kCols; ++cc) {
      const V vb = Vec::Set1(v[j * v_stride + cc]);
#pragma GCC unroll 16
      for (int n = 0; n < kVecs; ++n) acc[cc][n] = Vec::Fmadd(pr[n], vb, acc[cc][n]);
    }
  }
#pragma GCC unroll 16
  for (int cc = 0; cc < kCols; ++cc) {
#pragma GCC unroll 16
    for (int n = 0; n < kVecs; ++n) Vec::Store(ot + cc * kQ + n * kW, acc[cc][n]);
  }
}

template <int kCols, int kVecs>
inline void PvColTail(int cols, const float* pt, int keys, const float* v, int64_t v_stride,
                      const float* alpha, float* ot) {
  if constexpr (kCols > 0) {
    if (cols == kCols) {
      PvBlock<kCols, kVecs>(pt, keys, v, v_stride, alpha, ot);
    } else {
      PvColTail<kCols - 1, kVecs>(cols, pt, keys, v, v_stride, alpha, ot);
    }
  }
}

template <int kVecs>
void PvRows(const float* pt, int keys, const float* v, int64_t v_stride, int dv, const float* alpha,
            float* ot) {
  constexpr int kCols = Vec::kPvCols;
  int c = 0;
  for (; c + kCols <= dv; c += kCols) {
    PvBlock<kCols, kVecs>(pt, keys, v + c, v_stride, alpha, ot + c * kQ);
  }
  PvColTail<kCols - 1, kVecs>(dv - c, pt, keys, v + c, v_stride, alpha, ot + c * kQ);
}

template <int kVecs>
inline void PvVecTail(int vecs, const float* pt, int keys, const float* v, int64_t v_stride, int dv,
                      const float* alpha, float* ot) {
  if constexpr (kVecs > 0) {
    if (vecs == kVecs) {
      PvRows<kVecs>(pt, keys, v, v_stride, dv, alpha, ot);
    } else {
      PvVecTail<kVecs - 1>(vecs, pt, keys, v, v_stride, dv, alpha, ot);
    }
  }
}

void PvTile(const float* pt, int keys, const float* v, int64_t v_stride, int dv, int row_vecs,
            const float* alpha, float* ot) {
  constexpr int kVecs = Vec::kPvVecs;
  int n = 0;
  for (; n + kVecs <= row_vecs; n += kVecs) {
    PvRows<kVecs>(pt + n * kW, keys, v, v_stride, dv, alpha + n * kW, ot + n * kW);
  }
  PvVecTail<kVecs - 1>(row_vecs - n, pt + n * kW, keys, v, v_stride, dv, alpha + n * kW,
                       ot + n * kW);
}

// ---------------------------------------------------------------------------------------------
// Input rows of any element type.

// n elements of `type` at src, widened to float32 (exact).
void WidenRow(DType type, const void* src, int n, float* dst) {
  if (type == DType::kFloat32) {
    const float* f = static_cast<const float*>(src);
    for (int x = 0; x < n; ++x) dst[x] = f[x];
  } else if (type == DType::kBFloat16) {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int x = 0; x < n; ++x) dst[x] = __builtin_bit_cast(float, uint32_t{h[x]} << 16);
  } else {
    Vec::HalfToFloat(static_cast<const uint16_t*>(src), n, dst);
  }
}

// The rows of one kv head of q, k or v, as stored: `base` is row 0, `stride` counts elements.
struct Rows {
  const char* base;
  int64_t stride;
  DType type;
  int cols;
  int esize;

  const void* row(int64_t j) const { return base + j * stride * esize; }
  // Rows [j0, j0 + n) as float32: in place when they are float32, else widened into buf
  // [n][cols]. Sets *ld to the row stride of the result.
  const float* Float32(int j0, int n, float* buf, int64_t* ld) const {
    if (type == DType::kFloat32) {
      *ld = stride;
      return reinterpret_cast<const float*>(base) + j0 * stride;
    }
    for (int j = 0; j < n; ++j) WidenRow(type, row(j0 + j), cols, buf + int64_t{j} * cols);
    *ld = cols;
    return buf;
  }
};

Rows InputRows(const AttentionParams& p, const InputView& view, int b, int h, int cols) {
  const int esize = p.input_dtype == DType::kFloat32 ? 4 : 2;
  return Rows{
      static_cast<const char*>(view.data) + (b * view.batch_stride + h * view.head_stride) * esize,
      view.row_stride, p.input_dtype, cols, esize};
}

// ---------------------------------------------------------------------------------------------
// Shared steps of both paths.

// One block of query rows [i0, i0 + rows) of head h of batch entry b, and both paths over it.
// Its constructor carves the scratch and packs qt[x][r] = scale · q[i0 + r][x] (rows past `rows`
// are zero up to padded_rows), the per-row key limits, window starts and positions, and the
// smallest and largest limit and start over the real rows.
struct QueryBlock {
  QueryBlock(const AttentionParams& params, int batch, int head, int first_row, float* scratch);

  // The scores of the key tile [j0, j0 + keys) into st: st[j][r] = scale·q_r · k_j, soft-capped
  // and biased (ScoreMods); then the scores the explicit mask and the window's start block -inf.
  void ScoreKeyTile(int j0, int keys) const;
  // Row r's output row.
  float* Out(int r) const {
    return p.out.data + b * p.out.batch_stride + h * p.out.head_stride +
           (i0 + r) * p.out.row_stride;
  }

  // The fused path: online softmax over key tiles, scores never leave the [kKeyTile][kQ] tile.
  void RunFused() const;
  // The materialising path, when the weights are asked for: the scores of whole rows go to the
  // caller's weights buffer, a plain softmax per row (reference semantics), then O = W · V.
  void RunWithWeights() const;

  const AttentionParams& p;
  const int b, h, i0;
  const Scratch s;
  const int rows, row_vecs, padded_rows;
  const Rows k, v;  // of h's key/value head
  int min_limit, max_limit, min_start, max_start;
};

QueryBlock::QueryBlock(const AttentionParams& params, int batch, int head, int first_row,
                       float* scratch)
    : p(params),
      b(batch),
      h(head),
      i0(first_row),
      s(CarveScratch(scratch, p.head_dim, p.v_head_dim)),
      rows(MinInt(kQ, p.q_len - i0)),
      row_vecs((rows + kW - 1) / kW),
      padded_rows(row_vecs * kW),
      k(InputRows(p, p.k, b, h / p.group_size(), p.head_dim)),
      v(InputRows(p, p.v, b, h / p.group_size(), p.v_head_dim)) {
  const Rows q = InputRows(p, p.q, b, h, p.head_dim);
  for (int r = 0; r < rows; ++r) {
    // Widened into the (not yet used) key tile buffer, then scaled and transposed.
    int64_t ld;
    const float* qr = q.Float32(i0 + r, 1, s.kt, &ld);
    for (int x = 0; x < p.head_dim; ++x) s.qt[int64_t{x} * kQ + r] = qr[x] * p.scale;
  }
  for (int x = 0; x < p.head_dim; ++x) {
    for (int r = rows; r < padded_rows; ++r) s.qt[int64_t{x} * kQ + r] = 0.0f;
  }
  min_limit = p.kv_len;
  max_limit = 0;
  min_start = p.kv_len;
  max_start = 0;
  for (int r = 0; r < rows; ++r) {
    const int limit = p.key_limit(b, i0 + r);
    const int start = p.key_start(i0 + r);
    s.limit[r] = static_cast<float>(limit);
    s.lower[r] = static_cast<float>(1 - start);
    s.pos[r] = static_cast<float>(int64_t{i0} + r + p.kv_len - p.q_len);
    min_limit = MinInt(min_limit, limit);
    max_limit = MaxInt(max_limit, limit);
    min_start = MinInt(min_start, start);
    max_start = MaxInt(max_start, start);
  }
  for (int r = rows; r < padded_rows; ++r) {
    s.limit[r] = s.limit[rows - 1];
    s.lower[r] = s.lower[rows - 1];
    s.pos[r] = s.pos[rows - 1];
  }
}

// Soft-capping (vec_tiles.h, SoftCap) and ALiBi (ScoreMods) on a tile of scores st[j][r] of keys
// j0.. for head h, in that order.
void ModifyScores(const AttentionParams& p, int h, int j0, int keys, int padded_rows,
                  const Scratch& s) {
  const ScoreMods& mods = p.mods;
  if (mods.softcap != 0.0f) {
    const SoftCap<Vec> softcap(mods.softcap);
    for (int j = 0; j < keys; ++j) {
      for (int r = 0; r < padded_rows; r += kW) {
        float* at = s.st + j * kQ + r;
        Vec::Store(at, softcap(Vec::Load(at)));
      }
    }
  }
  if (mods.alibi_slopes != nullptr) {
    const V neg_slope = Vec::Set1(-mods.alibi_slopes[h]);
    for (int j = 0; j < keys; ++j) {
      const V key = Vec::Set1(static_cast<float>(j0 + j));
      for (int r = 0; r < padded_rows; r += kW) {
        float* at = s.st + j * kQ + r;
        const V d = Vec::Sub(key, Vec::Load(s.pos + r));
        const V dist = Vec::Max(d, Vec::Sub(Vec::Zero(), d));  // |j - i'|
        Vec::Store(at, Vec::Fmadd(neg_slope, dist, Vec::Load(at)));
      }
    }
  }
}

// Sets st[j][r] = -inf for the keys before row r's window (j < key_start).
void MaskBeforeWindow(int j0, int keys, int padded_rows, const Scratch& s) {
  for (int j = 0; j < keys; ++j) {
    const V neg_pos = Vec::Set1(-static_cast<float>(j0 + j));
    for (int r = 0; r < padded_rows; r += kW) {
      float* at = s.st + j * kQ + r;
      Vec::Store(at, Vec::MaskBeyond(Vec::Load(at), Vec::Load(s.lower + r), neg_pos));
    }
  }
}

// Sets st[j][r] = -inf where the explicit mask blocks (b, h, i0 + r, j0 + j).
void ApplyMask(const AttentionParams& p, int b, int h, int i0, int j0, int keys, int rows,
               int padded_rows, float* st) {
  const MaskView& mk = p.mask;
  const uint8_t* base = mk.data + b * mk.batch_stride + h * mk.head_stride + i0 * mk.row_stride;
  for (int j = 0; j < keys; ++j) {
    const uint8_t* mj = base + (j0 + j) * mk.col_stride;
    float* row = st + j * kQ;
    if (mk.row_stride == 0) {  // one value for every query row (key padding masks)
      if (*mj == 0) {
        for (int r = 0; r < padded_rows; ++r) row[r] = kNegInf;
      }
    } else {
      for (int r = 0; r < rows; ++r) {
        if (mj[r * mk.row_stride] == 0) row[r] = kNegInf;
      }
    }
  }
}

// Writes the mean of all Lk value rows (the uniform average a row with no allowed key gets),
// summed in key order.
void MeanOfValues(const AttentionParams& p, const Rows& v, const Scratch& s) {
  float* mean = s.mean;
  for (int c = 0; c < p.v_head_dim; ++c) mean[c] = 0.0f;
  for (int j = 0; j < p.kv_len; ++j) {
    int64_t ld;
    const float* vr = v.Float32(j, 1, s.vt, &ld);
    for (int c = 0; c < p.v_head_dim; ++c) mean[c] += vr[c];
  }
  const float inv = 1.0f / static_cast<float>(p.kv_len);
  for (int c = 0; c < p.v_head_dim; ++c) mean[c] *= inv;
}

void QueryBlock::ScoreKeyTile(int j0, int keys) const {
  int64_t k_ld;
  const float* kt = k.Float32(j0, keys, s.kt, &k_ld);
  ScoreTile(s.qt, p.head_dim, kt, k_ld, keys, row_vecs, s.st);
  ModifyScores(p, h, j0, keys, padded_rows, s);
  if (p.mask.data != nullptr) ApplyMask(p, b, h, i0, j0, keys, rows, padded_rows, s.st);
  if (j0 < max_start) MaskBeforeWindow(j0, keys, padded_rows, s);
}

// ---------------------------------------------------------------------------------------------
void QueryBlock::RunFused() const {
  for (int r = 0; r < padded_rows; ++r) {
    s.m[r] = kNegInf;
    s.l[r] = 0.0f;
  }
  for (int64_t n = 0; n < int64_t{p.v_head_dim} * kQ; ++n) s.ot[n] = 0.0f;

  // Key tiles at or past every row's limit (causal future, padding), or before every row's
  // window, hold no allowed key: skip them (a sliding window costs O(Lq · window)). A processed
  // tile in which a row has no allowed key leaves that row's bits unchanged (alpha = exp(0) = 1,
  // p = 0), so skipping never changes a result.
  for (int j0 = min_start / kKeyTile * kKeyTile; j0 < max_limit; j0 += kKeyTile) {
    const int keys = MinInt(kKeyTile, p.kv_len - j0);
    // 1. Scores of the tile: st[j][r] = scale·q_r · k_j, soft-capped and biased (ScoreMods).
    // 2. Blocked scores become -inf: the explicit mask, the window's start, then (below)
    //    causality, key length and the window's end.
    ScoreKeyTile(j0, keys);
    const bool need_limit = j0 + keys > min_limit;

    for (int r = 0; r < padded_rows; r += kW) {
      // 3. Tile max per row, m_tile = max_j st[j][r] (over allowed keys; -inf if none).
      V tile_max = Vec::Set1(kNegInf);
      if (need_limit) {
        const V limit = Vec::Load(s.limit + r);
        for (int j = 0; j < keys; ++j) {
          const V sc = Vec::MaskBeyond(Vec::Load(s.st + j * kQ + r), limit,
                                       Vec::Set1(static_cast<float>(j0 + j)));
          Vec::Store(s.st + j * kQ + r, sc);
          tile_max = Vec::Max(tile_max, sc);
        }
      } else {
        for (int j = 0; j < keys; ++j) tile_max = Vec::Max(tile_max, Vec::Load(s.st + j * kQ + r));
      }
      // 4. New running max m_new = max(m_old, m_tile). While a row has seen no allowed key
      //    m_new is -inf; exponents are then taken against 0 instead so that -inf - -inf never
      //    makes a NaN (every p is then exp(-inf) = 0).
      const V m_old = Vec::Load(s.m + r);
      const V m_new = Vec::Max(m_old, tile_max);
      const V m_ref = Vec::ZeroIfNegInf(m_new);
      // 5. Rescale factor for what was accumulated so far: alpha = exp(m_old - m_new)
      //    (0 while m_old is -inf, exactly 1 when the max did not move).
      const V alpha = Vec::Exp(Vec::Sub(m_old, m_ref));
      // 6. Probabilities p_j = exp(s_j - m_new) in place, and their sum, in key order.
      V sum = Vec::Zero();
      for (int j = 0; j < keys; ++j) {
        const V pr = Vec::Exp(Vec::Sub(Vec::Load(s.st + j * kQ + r), m_ref));
        Vec::Store(s.st + j * kQ + r, pr);
        sum = Vec::Add(sum, pr);
      }
      // 7. Running sum l = l · alpha + sum_j p_j; keep m_new and alpha for the P·V step.
      Vec::Store(s.l + r, Vec::Add(Vec::Mul(Vec::Load(s.l + r), alpha), sum));
      Vec::Store(s.m + r, m_new);
      Vec::Store(s.alpha + r, alpha);
    }
    // 8. Rescale and accumulate the output: O = O · alpha + P · V_tile.
    int64_t v_ld;
    const float* vt = v.Float32(j0, keys, s.vt, &v_ld);
    PvTile(s.st, keys, vt, v_ld, p.v_head_dim, row_vecs, s.alpha, s.ot);
  }

  // 9. Normalise: out = O / l; a row that met no allowed key gets the mean of all values.
  bool have_mean = false;
  for (int r = 0; r < rows; ++r) {
    float* out = Out(r);
    // Fully blocked (or only -inf scores) <=> the running sum is exactly 0. Not m == -inf: a NaN
    // score can be lost by the vector max, but never by the sum (the NaN rule: NaN row).
    if (s.l[r] == 0.0f) {
      if (!have_mean) MeanOfValues(p, v, s);
      have_mean = true;
      for (int c = 0; c < p.v_head_dim; ++c) out[c] = s.mean[c];
    } else {
      const float l = s.l[r];
      for (int c = 0; c < p.v_head_dim; ++c) out[c] = s.ot[int64_t{c} * kQ + r] / l;
    }
  }
}

// ---------------------------------------------------------------------------------------------
void QueryBlock::RunWithWeights() const {
  float* weights = p.weights + ((int64_t{b} * p.num_heads + h) * p.q_len + i0) * p.kv_len;

  // Scores, blocked ones -inf, into the weights rows.
  for (int j0 = 0; j0 < p.kv_len; j0 += kKeyTile) {
    const int keys = MinInt(kKeyTile, p.kv_len - j0);
    ScoreKeyTile(j0, keys);
    for (int r = 0; r < rows; ++r) {
      float* w = weights + int64_t{r} * p.kv_len + j0;
      const int limit = static_cast<int>(s.limit[r]) - j0;
      for (int j = 0; j < keys; ++j) w[j] = j < limit ? s.st[j * kQ + r] : kNegInf;
    }
  }
  // Softmax per row over the allowed keys; uniform 1/Lk when there are none.
  for (int r = 0; r < rows; ++r) {
    float* w = weights + int64_t{r} * p.kv_len;
    float mx = kNegInf;
    for (int j = 0; j < p.kv_len; ++j) mx = w[j] > mx ? w[j] : mx;
    // The NaN rule: a NaN or +inf among the allowed scores makes the row NaN.
    bool poisoned = false;
    for (int j = 0; j < p.kv_len; ++j) poisoned |= w[j] != w[j] || w[j] == -kNegInf;
    if (poisoned) {
      for (int j = 0; j < p.kv_len; ++j) w[j] = __builtin_nanf("");
      continue;
    }
    if (mx == kNegInf) {
      const float u = 1.0f / static_cast<float>(p.kv_len);
      for (int j = 0; j < p.kv_len; ++j) w[j] = u;
      continue;
    }
    float sum = 0.0f;
    for (int j = 0; j < p.kv_len; ++j) {
      w[j] = w[j] == kNegInf ? 0.0f : __builtin_expf(w[j] - mx);
      sum += w[j];
    }
    for (int j = 0; j < p.kv_len; ++j) w[j] /= sum;
  }
  // O = W · V, tile by tile, with the weights transposed back into st.
  for (int r = 0; r < padded_rows; ++r) s.alpha[r] = 1.0f;
  for (int64_t n = 0; n < int64_t{p.v_head_dim} * kQ; ++n) s.ot[n] = 0.0f;
  for (int j0 = 0; j0 < p.kv_len; j0 += kKeyTile) {
    const int keys = MinInt(kKeyTile, p.kv_len - j0);
    for (int j = 0; j < keys; ++j) {
      for (int r = 0; r < rows; ++r) s.st[j * kQ + r] = weights[int64_t{r} * p.kv_len + j0 + j];
      for (int r = rows; r < padded_rows; ++r) s.st[j * kQ + r] = 0.0f;
    }
    int64_t v_ld;
    const float* vt = v.Float32(j0, keys, s.vt, &v_ld);
    PvTile(s.st, keys, vt, v_ld, p.v_head_dim, row_vecs, s.alpha, s.ot);
  }
  for (int r = 0; r < rows; ++r) {
    float* out = Out(r);
    for (int c = 0; c < p.v_head_dim; ++c) out[c] = s.ot[int64_t{c} * kQ + r];
  }
}

void Run(const AttentionParams& p, int b, int h, int i0, float* scratch) {
  const QueryBlock block(p, b, h, i0, scratch);
  if (p.weights != nullptr) {
    block.RunWithWeights();
  } else {
    block.RunFused();
  }
}

// The kernel of this ISA, for its file's named constant (k<Isa>AttentionKernel).
constexpr AttentionKernel Kernel(Isa isa, const char* name) {
  return {isa, name, &ScratchFloats, &Run};
}

}  // namespace
}  // namespace attnserve::kernels::cpu::ATTNSERVE_CPU_ISA_NAMESPACE

namespace attnserve::kernels::cpu {
extern const AttentionKernel ATTNSERVE_CPU_KERNEL(ATTNSERVE_CPU_ISA_NAMESPACE::Kernel);
}  // namespace attnserve::kernels::cpu
