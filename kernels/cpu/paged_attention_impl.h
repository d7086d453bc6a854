// The body of the CPU paged attention kernel (paged_attention_kernel.h), written once against a
// vector-traits struct and compiled once per instruction set. NOT a normal header: no include
// guard, included exactly once at the end of each per-ISA translation unit
// (paged_attention_avx512.cc, paged_attention_avx2.cc, paged_attention_generic.cc), after that
// unit has included its vector traits and defined
//
//   ATTNSERVE_CPU_ISA_NAMESPACE   a namespace name unique to the unit
//   ATTNSERVE_CPU_KERNEL(make)    the kernel's constant: `kXPagedAttentionKernel = make(isa, name)`
//   ATTNSERVE_CPU_TILES           the tiles, PVec here (vec_tiles.h's PagedTiles or a type
//                                  derived from it), with
//     V, kWidth                    the vector type and its float lanes
//     kScoreRows                   row-heads per pass of the score loop (accumulators)
//     kPvRows, kPvVecs             register block of P·V (row-heads x vectors of columns)
//     Zero, Set1, Load, Store, Add, Sub, Mul, Div, Max, Fmadd(a, b, c) = a·b + c,
//     LoadN(p, n), StoreN(p, v, n)  the first n lanes (0 <= n <= kWidth; loads zero the rest)
//     LoadF16(p), LoadF16N(p, n), LoadBf16(p), LoadBf16N(p, n)   16-bit elements widened
//     Exp (exp(-inf) = 0, NaN stays NaN), ReduceAdd, ReduceMax (fixed order),
//     Reduce4(a, b, c, d, out)     out[0..3] = the lane sums of a, b, c, d, each by the same tree
//     kBf16Dot                     true: BFLOAT16 scores by a bfloat16 dot product, with
//       kPairWidth, Bh, LoadPairs(p), LoadPairsN(p, n), DotBf16(acc, a, b)
//                                  (acc lane i += a[2i]·b[2i] + a[2i+1]·b[2i+1])
//
// As in attention_kernel_impl.h, everything has internal linkage and the body calls no inline
// function of another header (not even PagedAttentionParams' offset helpers), so no copy compiled
// with wide instructions can be picked by the linker for another path.
//
// Layout of the work. Row-heads rh = r · group + g (query row r of the task, head
// kv_head · group + g). Scores: a few key rows of K (4 for up to 4 row-heads) are loaded
// (widened) once per pass of kScoreRows row-heads and dotted with each, one accumulator vector
// per (row-head, key) over D, reduced at the end; a split's scores [rh][kPagedSplitKeys] stay in
// the task's scratch. P·V:
// per block of kPvVecs vectors of output columns, kPvRows row-heads accumulate over the split's
// keys in order, each V element loaded once per block.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::ATTNSERVE_CPU_ISA_NAMESPACE::paged {
namespace {

using PVec = ATTNSERVE_CPU_TILES;
using V = PVec::V;
constexpr int kW = PVec::kWidth;
constexpr int kSplit = kPagedSplitKeys;

static_assert(kSplit % kW == 0, "a split must be a whole number of vectors");

// Element type as a template parameter, so the inner loops carry no dtype branch.
template <DType T>
V LoadElems(const void* base, int64_t i) {
  if constexpr (T == DType::kFloat32) {
    return PVec::Load(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kFloat16) {
    return PVec::LoadF16(static_cast<const uint16_t*>(base) + i);
  } else {
    return PVec::LoadBf16(static_cast<const uint16_t*>(base) + i);
  }
}
template <DType T>
V LoadElemsN(const void* base, int64_t i, int n) {
  if constexpr (T == DType::kFloat32) {
    return PVec::LoadN(static_cast<const float*>(base) + i, n);
  } else if constexpr (T == DType::kFloat16) {
    return PVec::LoadF16N(static_cast<const uint16_t*>(base) + i, n);
  } else {
    return PVec::LoadBf16N(static_cast<const uint16_t*>(base) + i, n);
  }
}
// Elements [i, i + n) of a row, any n >= 0 (full vector when n >= kW).
template <DType T>
V LoadSome(const void* base, int64_t i, int n) {
  return n >= kW ? LoadElems<T>(base, i) : LoadElemsN<T>(base, i, n < 0 ? 0 : n);
}

// The shape of one task's work, derived from p and the task only.
struct Shape {
  int group;                             // query heads per kv head
  int n;                                 // row-heads of the task: rows · group
  int dp;                                // D rounded up to kW
  int dvp;                               // Dv rounded up to kW
  int esize;                             // bytes per cache element
  int64_t k_page_stride, v_page_stride;  // elements
};

Shape ShapeOf(const PagedAttentionParams& p, int rows) {
  Shape s;
  s.group = p.num_heads / p.num_kv_heads;
  s.n = rows * s.group;
  s.dp = static_cast<int>(RoundUp(p.head_dim, kW));
  s.dvp = static_cast<int>(RoundUp(p.v_head_dim, kW));
  s.esize = p.dtype == DType::kFloat32 ? 4 : 2;
  s.k_page_stride = int64_t{p.num_kv_heads} * p.page_size * p.head_dim;
  s.v_page_stride = int64_t{p.num_kv_heads} * p.page_size * p.v_head_dim;
  return s;
}

// One split's state, or the running state of the fold: m[n], l[n], o[n][dvp].
struct State {
  float* m;
  float* l;
  float* o;
};

int64_t StateFloats(const Shape& sh) { return Align16(sh.n) * 2 + int64_t{sh.n} * sh.dvp; }

State StateAt(float* base, const Shape& sh) {
  return State{base, base + Align16(sh.n), base + 2 * Align16(sh.n)};
}

// Task scratch: q [n][dp] (float32, zero-padded), scores [n][kSplit], the split state, the
// running state and one row of dvp floats (the mean of V for rows whose scores are all -inf).
struct Scratch {
  float* q;
  float* s;
  State split;
  State run;
  float* mean;
};

int64_t ScratchFloatsFor(const Shape& sh) {
  return Align16(int64_t{sh.n} * sh.dp) + Align16(int64_t{sh.n} * kSplit) + 2 * StateFloats(sh) +
         Align16(sh.dvp);
}

Scratch Carve(float* base, const Shape& sh) {
  Scratch s;
  s.q = base;
  s.s = s.q + Align16(int64_t{sh.n} * sh.dp);
  s.split = StateAt(s.s + Align16(int64_t{sh.n} * kSplit), sh);
  s.run = StateAt(s.split.m + StateFloats(sh), sh);
  s.mean = s.run.m + StateFloats(sh);
  return s;
}

// The task's view of one sequence.
struct Seq {
  const int32_t* pages;  // its page table row
  int kv_len;
  int q_len;
  int first_pos;  // position of query row 0: kv_len - q_len
};

Seq SeqOf(const PagedAttentionParams& p, int s) {
  return Seq{p.page_table + int64_t{s} * p.max_pages_per_seq, p.kv_lens[s], p.q_lens[s],
             p.kv_lens[s] - p.q_lens[s]};
}

// Software prefetch of the rows of one kv head of K or V, in key order, ahead of use. A
// sequence's pages are scattered through the pool, and the hardware prefetchers stop at 4 KiB
// boundaries, so without this every page run starts with a stall on memory latency (measured
// before it: 2.2 GB/s of K/V per core against STREAM's 8.5). Into L2 (PREFETCHT2): prefetches
// into L1 stalled on the core's L1 miss buffers (a third of the samples sat on PREFETCHT0).
// The schedule (ComputeSplit): K kAheadBytes ahead of the scores and a whole split ahead of
// them by the time the next split starts; V during the scores of its split; both a few keys
// at a time among the arithmetic (kPfKeys). 8 KiB ahead: the split ahead is most of the
// distance already (4, 8 and 16 KiB measured alike; tests/bench/DECODE.md).
struct Prefetcher {
  static constexpr int64_t kAheadBytes = 8192;
  const char* base;
  int64_t page_stride;  // elements
  const int32_t* pages;
  int page_size, kv_head, cols, esize;
  int next = 0;  // first key not yet prefetched
  int end = 0;   // keys at or past it are not prefetched

  int AheadKeys() const {
    const int64_t keys = kAheadBytes / (int64_t{cols} * esize);
    return keys < 1 ? 1 : static_cast<int>(keys);
  }
  // Prefetches keys [next, min(upto, end)).
  void Upto(int upto) {
    const int stop = MinInt(upto, end);
    while (next < stop) {
      const int slot = next % page_size;
      const int run = MinInt(stop - next, page_size - slot);
      const char* row = base + (pages[next / page_size] * page_stride +
                                (int64_t{kv_head} * page_size + slot) * cols) *
                                   esize;
      const int64_t bytes = int64_t{run} * cols * esize;
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 1);
      next += run;
    }
  }
};

// Keys per step of the score and P·V loops: each step issues the prefetches for as many keys.
constexpr int kPfKeys = 4;

// ---------------------------------------------------------------------------------------------
// Scores of kRows row-heads against `keys` consecutive key rows at k (row stride D elements):
// s[i · kSplit + j] = dot(q_i, k_j), one multiply-add chain per lane over the D vectors, then a
// fixed-order reduction (Reduce4's tree, the same for every score). kKeys keys at a time (1, 2
// or 4; kRows · kKeys accumulators): each query vector loaded serves kKeys keys, and the scores
// of 4 keys of one row-head come out of one Reduce4 as a whole vector. A score's bits do not
// depend on kKeys (the same chain and the same tree either way).
template <int kRows, int kKeys>
[[gnu::always_inline]] inline void StoreScores(const V (&acc)[kKeys][kRows], float* s) {
  static_assert(kKeys == 1 || kKeys == 2 || kKeys == 4, "1, 2 or 4 keys at a time");
  if constexpr (kKeys == 4) {
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      PVec::Reduce4(acc[0][i], acc[1][i], acc[2][i], acc[3][i], s + int64_t{i} * kSplit);
    }
  } else if constexpr (kKeys == 2) {
#pragma GCC unroll 8
    for (int i = 0; i < kRows; i += 2) {
      float sum[4];
      const bool two = i + 1 < kRows;
      PVec::Reduce4(acc[0][i], acc[1][i], two ? acc[0][i + 1] : PVec::Zero(),
                    two ? acc[1][i + 1] : PVec::Zero(), sum);
      s[int64_t{i} * kSplit] = sum[0];
      s[int64_t{i} * kSplit + 1] = sum[1];
      if (two) {
        s[int64_t{i + 1} * kSplit] = sum[2];
        s[int64_t{i + 1} * kSplit + 1] = sum[3];
      }
    }
  } else {
    // Four row-heads per reduction (the missing ones zero).
#pragma GCC unroll 4
    for (int i = 0; i < kRows; i += 4) {
      float sum[4];
      PVec::Reduce4(acc[0][i], i + 1 < kRows ? acc[0][i + 1] : PVec::Zero(),
                    i + 2 < kRows ? acc[0][i + 2] : PVec::Zero(),
                    i + 3 < kRows ? acc[0][i + 3] : PVec::Zero(), sum);
      for (int x = 0; x < 4 && i + x < kRows; ++x) s[int64_t{i + x} * kSplit] = sum[x];
    }
  }
}

// kKeys for kRows row-heads: as many keys as keep the kRows · kKeys accumulators, the key
// vectors and a query vector in registers (32 vector registers with AVX-512: 16 accumulators;
// 16 with AVX2: 8).
template <int kRows>
constexpr int ScoreKeys() {
  constexpr int kAccumulators = kW >= 16 ? 16 : 8;
  return kRows * 4 <= kAccumulators ? 4 : kRows * 2 <= kAccumulators ? 2 : 1;
}

template <DType T, int kRows, int kKeys>
void ScoreKeysAtOnce(const float* q, int dp, int d, const void* k, float* s) {
  V acc[kKeys][kRows];
  ZeroBlock<PVec>(acc);
  int c = 0;
  for (; c + kW <= d; c += kW) {
    V kv[kKeys];
#pragma GCC unroll 4
    for (int x = 0; x < kKeys; ++x) kv[x] = LoadElems<T>(k, int64_t{x} * d + c);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const V qv = PVec::Load(q + int64_t{i} * dp + c);
#pragma GCC unroll 4
      for (int x = 0; x < kKeys; ++x) acc[x][i] = PVec::Fmadd(qv, kv[x], acc[x][i]);
    }
  }
  if (c < d) {
    V kv[kKeys];
#pragma GCC unroll 4
    for (int x = 0; x < kKeys; ++x) kv[x] = LoadElemsN<T>(k, int64_t{x} * d + c, d - c);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const V qv = PVec::Load(q + int64_t{i} * dp + c);
#pragma GCC unroll 4
      for (int x = 0; x < kKeys; ++x) acc[x][i] = PVec::Fmadd(qv, kv[x], acc[x][i]);
    }
  }
  StoreScores<kRows, kKeys>(acc, s);
}

template <DType T, int kRows>
void ScoreRows(const float* q, int dp, int d, const void* k, int keys, float* s) {
  constexpr int kKeys = ScoreKeys<kRows>();
  const int elem = T == DType::kFloat32 ? 4 : 2;
  int j = 0;
  for (; j + kKeys <= keys; j += kKeys) {
    ScoreKeysAtOnce<T, kRows, kKeys>(q, dp, d, static_cast<const char*>(k) + int64_t{j} * d * elem,
                                     s + j);
  }
  for (; j < keys; ++j) {
    ScoreKeysAtOnce<T, kRows, 1>(q, dp, d, static_cast<const char*>(k) + int64_t{j} * d * elem,
                                 s + j);
  }
}

// The same with bfloat16 queries and keys as they are, through Vec::DotBf16 (PVec as a template
// parameter: this compiles only for a PVec with kBf16Dot). q rows are dq elements apart.
template <class Vec, int kRows, int kKeys>
void ScoreKeysAtOnceBf16(const uint16_t* q, int dq, int d, const uint16_t* k, float* s) {
  constexpr int kP = Vec::kPairWidth;
  V acc[kKeys][kRows];
  ZeroBlock<Vec>(acc);
  int c = 0;
  for (; c + kP <= d; c += kP) {
    typename Vec::Bh kv[kKeys];
#pragma GCC unroll 4
    for (int x = 0; x < kKeys; ++x) kv[x] = Vec::LoadPairs(k + int64_t{x} * d + c);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const typename Vec::Bh qv = Vec::LoadPairs(q + int64_t{i} * dq + c);
#pragma GCC unroll 4
      for (int x = 0; x < kKeys; ++x) acc[x][i] = Vec::DotBf16(acc[x][i], qv, kv[x]);
    }
  }
  if (c < d) {
    typename Vec::Bh kv[kKeys];
#pragma GCC unroll 4
    for (int x = 0; x < kKeys; ++x) kv[x] = Vec::LoadPairsN(k + int64_t{x} * d + c, d - c);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const typename Vec::Bh qv = Vec::LoadPairs(q + int64_t{i} * dq + c);
#pragma GCC unroll 4
      for (int x = 0; x < kKeys; ++x) acc[x][i] = Vec::DotBf16(acc[x][i], qv, kv[x]);
    }
  }
  StoreScores<kRows, kKeys>(acc, s);
}

template <class Vec, int kRows>
void ScoreRowsBf16(const uint16_t* q, int dq, int d, const uint16_t* k, int keys, float* s) {
  constexpr int kKeys = ScoreKeys<kRows>();
  int j = 0;
  for (; j + kKeys <= keys; j += kKeys) {
    ScoreKeysAtOnceBf16<Vec, kRows, kKeys>(q, dq, d, k + int64_t{j} * d, s + j);
  }
  for (; j < keys; ++j) ScoreKeysAtOnceBf16<Vec, kRows, 1>(q, dq, d, k + int64_t{j} * d, s + j);
}

template <class Vec, int kRows>
void ScoreRowsBf16Tail(int rows, const uint16_t* q, int dq, int d, const uint16_t* k, int keys,
                       float* s) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      ScoreRowsBf16<Vec, kRows>(q, dq, d, k, keys, s);
    } else {
      ScoreRowsBf16Tail<Vec, kRows - 1>(rows, q, dq, d, k, keys, s);
    }
  }
}

// True when the scores of a cache of type T can take the bfloat16 dot product: used when the
// queries are bfloat16 too (q_dtype), never by rounding float32 queries (they stay float32).
template <DType T>
constexpr bool CanBf16Dot() {
  return T == DType::kBFloat16 && PVec::kBf16Dot;
}

// Elements per query row in the scratch with the bfloat16 dot product (bfloat16, padded to whole
// pairs of vectors): at most 2 · dp, so it fits the float32 query area.
template <class Vec>
int Bf16QueryStride(int d) {
  return static_cast<int>(RoundUp(d, Vec::kPairWidth));
}

template <DType T, int kRows>
void ScoreRowsTail(int rows, const float* q, int dp, int d, const void* k, int keys, float* s) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      ScoreRows<T, kRows>(q, dp, d, k, keys, s);
    } else {
      ScoreRowsTail<T, kRows - 1>(rows, q, dp, d, k, keys, s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// P·V: o[i][c0 + x·kW ...] = sum_j s[i][j] · v_j[...] over `keys` value rows at v, in key order,
// for kRows row-heads and kVecs vectors of columns starting at column c0; cols = Dv - c0 (the
// last vector may be partial when kTail). pf(j) before each kPfKeys keys, j the keys done once
// they are (the prefetches; inside the loop so that acc stays in registers).
template <DType T, int kRows, int kVecs, bool kTail, class Pf>
void PvBlock(const float* s, int64_t s_off, const void* v, int dv, int keys, int c0,
             V (&acc)[kRows][kVecs], const Pf& pf) {
  const int cols = dv - c0;
  for (int j0 = 0; j0 < keys; j0 += kPfKeys) {
    const int j1 = MinInt(j0 + kPfKeys, keys);
    pf(j1);
    for (int j = j0; j < j1; ++j) {
      const int64_t row = int64_t{j} * dv + c0;
      V vv[kVecs];
#pragma GCC unroll 16
      for (int x = 0; x < kVecs; ++x) {
        vv[x] = kTail ? LoadSome<T>(v, row + x * kW, cols - x * kW) : LoadElems<T>(v, row + x * kW);
      }
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i) {
        const V pb = PVec::Set1(s[int64_t{i} * kSplit + s_off + j]);
#pragma GCC unroll 16
        for (int x = 0; x < kVecs; ++x) acc[i][x] = PVec::Fmadd(pb, vv[x], acc[i][x]);
      }
    }
  }
}

template <DType T, int kRows, int kVecs, class Pf>
void PvRun(bool tail, const float* s, int64_t s_off, const void* v, int dv, int keys, int c0,
           V (&acc)[kRows][kVecs], const Pf& pf) {
  if (tail) {
    PvBlock<T, kRows, kVecs, true>(s, s_off, v, dv, keys, c0, acc, pf);
  } else {
    PvBlock<T, kRows, kVecs, false>(s, s_off, v, dv, keys, c0, acc, pf);
  }
}

// A split's raw scores s[0, n) of one row-head, scaled and then modified as ScoreMods says
// (paged_attention_params.h): soft-capped (vec_tiles.h, SoftCap, as the fused body does), then
// lowered by slope · (pos - j), where key x of the split is j = pos + offset + x (offset = k0 -
// pos). n is a whole number of vectors.
inline void ModifyScores(float softcap, float slope, float scale, int offset, int n, float* s) {
  const V vscale = PVec::Set1(scale);
  if (softcap != 0.0f) {
    const SoftCap<PVec> cap(softcap);
    for (int x = 0; x < n; x += kW) PVec::Store(s + x, cap(PVec::Mul(PVec::Load(s + x), vscale)));
  } else {
    for (int x = 0; x < n; x += kW) PVec::Store(s + x, PVec::Mul(PVec::Load(s + x), vscale));
  }
  if (slope != 0.0f) {
    // slope · (j - pos) added, j - pos = offset + x + lane.
    alignas(64) float lane[kW];
    for (int y = 0; y < kW; ++y) lane[y] = static_cast<float>(y);
    const V vslope = PVec::Set1(slope), vlane = PVec::Load(lane);
    for (int x = 0; x < n; x += kW) {
      const V dist = PVec::Add(vlane, PVec::Set1(static_cast<float>(offset + x)));
      PVec::Store(s + x, PVec::Fmadd(vslope, dist, PVec::Load(s + x)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One split of one task: the split-local state of every row-head into `out`.
// k_pf and v_pf span the task's keys (this split's and the later splits' of the task): the
// scores prefetch this split's values, the sum over values prefetches the next split's keys, so
// a task of many splits streams K and V without a break.
template <DType T, bool kDotBf16>
void ComputeSplit(const PagedAttentionParams& p, const Shape& sh, const Seq& sq, int kv_head,
                  int row0, int rows, int split, const Scratch& sc, const State& out,
                  Prefetcher& k_pf, Prefetcher& v_pf) {
  const int k0 = split * kSplit;
  const int block_limit = sq.first_pos + row0 + rows;  // keys allowed to the block's last row
  const int k1 = MinInt(MinInt(k0 + kSplit, sq.kv_len), block_limit);
  const int nk = k1 - k0;  // > 0: the caller skips splits the block does not reach
  const char* k_base = static_cast<const char*>(p.k_pages);
  const char* v_base = static_cast<const char*>(p.v_pages);
  const int ps = p.page_size;

  // 1. Raw scores, page run by page run (a run's keys are contiguous in the page), kPfKeys keys
  //    at a time, each step prefetching as many keys' K ahead and V of this split: a steady
  //    trickle of prefetches among the arithmetic, not a burst per page that fills the core's
  //    miss buffers and stalls it.
  const int k_ahead = k_pf.AheadKeys();
  const int64_t k_row_bytes = int64_t{p.head_dim} * sh.esize;
  for (int j = k0; j < k1;) {
    const int32_t page = sq.pages[j / ps];
    const int slot = j % ps;
    const int run = MinInt(k1 - j, ps - slot);
    const char* k =
        k_base + (page * sh.k_page_stride + (int64_t{kv_head} * ps + slot) * p.head_dim) * sh.esize;
    for (int c = 0; c < run; c += kPfKeys) {
      const int m = MinInt(kPfKeys, run - c);
      k_pf.Upto(j + c + m + k_ahead);
      v_pf.Upto(j + c + m);
      for (int i = 0; i < sh.n; i += PVec::kScoreRows) {
        const int rows_now = MinInt(PVec::kScoreRows, sh.n - i);
        float* s = sc.s + int64_t{i} * kSplit + (j + c - k0);
        if constexpr (kDotBf16) {
          const int dq = Bf16QueryStride<PVec>(p.head_dim);
          ScoreRowsBf16Tail<PVec, PVec::kScoreRows>(
              rows_now, reinterpret_cast<const uint16_t*>(sc.q) + int64_t{i} * dq, dq, p.head_dim,
              reinterpret_cast<const uint16_t*>(k + c * k_row_bytes), m, s);
        } else {
          ScoreRowsTail<T, PVec::kScoreRows>(rows_now, sc.q + int64_t{i} * sh.dp, sh.dp, p.head_dim,
                                             k + c * k_row_bytes, m, s);
        }
      }
    }
    j += run;
  }

  // 2. Per row-head: scale; keys past the row's causal limit (and the padding up to a whole
  //    vector) become -inf; split max m; p = exp(s - m) in place; l = sum of p. Meanwhile the
  //    next split's first k_ahead keys are prefetched, a share per row-head (memory would
  //    otherwise idle here, and phase 3 would start with a burst of them).
  const int nk_pad = static_cast<int>(RoundUp(nk, kW));
  const V scale = PVec::Set1(p.scale);
  const bool modify = p.softcap != 0.0f || p.alibi_slopes != nullptr;
  for (int i = 0; i < sh.n; ++i) {
    k_pf.Upto(k1 + static_cast<int>(int64_t{k_ahead} * (i + 1) / sh.n));
    float* s = sc.s + int64_t{i} * kSplit;
    const int pos = sq.first_pos + row0 + i / sh.group;  // the row's position
    const int allowed = MinInt(nk, pos + 1 - k0);
    // Keys [k0, k0 + blocked) lie before the row's window (ScoreMods): blocked.
    const int blocked = p.window_left >= 0 ? pos - p.window_left - k0 : 0;
    if (allowed <= 0 || blocked >= allowed) {
      // The row does not reach this split (the fold skips it): zero weights, an empty state.
      std::memset(s, 0, sizeof(float) * nk_pad);
      out.m[i] = kNegInf;
      out.l[i] = 0.0f;
      continue;
    }
    if (modify) {
      const int h = kv_head * sh.group + i % sh.group;
      ModifyScores(p.softcap, p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.0f, p.scale,
                   k0 - pos, nk_pad, s);
    }
    V vmax = PVec::Set1(kNegInf);
    for (int x = 0; x < nk_pad; x += kW) {
      // Scaled here unless ModifyScores did (the modifications apply to scaled scores).
      V v = modify ? PVec::Load(s + x) : PVec::Mul(PVec::Load(s + x), scale);
      if (x + kW > allowed || x < blocked) {
        // Lanes before the window or at or past `allowed` to -inf: a score there (NaN included)
        // has no effect.
        alignas(64) float lanes[kW];
        PVec::Store(lanes, v);
        for (int y = 0; y < kW; ++y) {
          if (x + y < blocked || x + y >= allowed) lanes[y] = kNegInf;
        }
        v = PVec::Load(lanes);
      }
      PVec::Store(s + x, v);
      vmax = PVec::Max(vmax, v);
    }
    const float m = PVec::ReduceMax(vmax);
    // A row whose allowed scores are all -inf keeps m = -inf; exponents are then taken against 0
    // so that -inf - -inf never makes a NaN (every p is exp(-inf) = 0).
    const V ref = PVec::Set1(m == kNegInf ? 0.0f : m);
    V sum = PVec::Zero();
    for (int x = 0; x < nk_pad; x += kW) {
      const V e = PVec::Exp(PVec::Sub(PVec::Load(s + x), ref));
      PVec::Store(s + x, e);
      sum = PVec::Add(sum, e);
    }
    out.m[i] = m;
    out.l[i] = PVec::ReduceAdd(sum);
  }

  // 3. o = P · V over the split's keys, page run by page run, kPfKeys keys at a time. The
  //    first block of row-heads prefetches the next split's keys, spread evenly over the
  //    passes over column blocks.
  constexpr int kR = PVec::kPvRows, kX = PVec::kPvVecs;
  const int dv = p.v_head_dim;
  const int passes = (dv + kX * kW - 1) / (kX * kW);
  for (int c0 = 0; c0 < dv; c0 += kX * kW) {
    const bool tail = c0 + kX * kW > dv;
    const int pass = c0 / (kX * kW);
    for (int i0 = 0; i0 < sh.n; i0 += kR) {
      const int nr = MinInt(kR, sh.n - i0);
      V acc[kR][kX];
      ZeroBlock<PVec>(acc);
      const float* s = sc.s + int64_t{i0} * kSplit;
      for (int j = k0; j < k1;) {
        const int32_t page = sq.pages[j / ps];
        const int slot = j % ps;
        const int run = MinInt(k1 - j, ps - slot);
        const char* v =
            v_base + (page * sh.v_page_stride + (int64_t{kv_head} * ps + slot) * dv) * sh.esize;
        const int64_t s_off = j - k0;
        auto pf = [&](int done) {
          k_pf.Upto(k1 + static_cast<int>((int64_t{pass} * nk + s_off + done) / passes) + k_ahead);
        };
        auto no_pf = [](int) {};
        // A full block of kR row-heads in one pass; the last, partial block row-head by
        // row-head.
        if (nr == kR) {
          if (i0 == 0) {
            PvRun<T, kR, kX>(tail, s, s_off, v, dv, run, c0, acc, pf);
          } else {
            PvRun<T, kR, kX>(tail, s, s_off, v, dv, run, c0, acc, no_pf);
          }
        } else {
          V acc1[1][kX];
          for (int i = 0; i < nr; ++i) {
            for (int x = 0; x < kX; ++x) acc1[0][x] = acc[i][x];
            if (i0 == 0 && i == 0) {
              PvRun<T, 1, kX>(tail, s + int64_t{i} * kSplit, s_off, v, dv, run, c0, acc1, pf);
            } else {
              PvRun<T, 1, kX>(tail, s + int64_t{i} * kSplit, s_off, v, dv, run, c0, acc1, no_pf);
            }
            for (int x = 0; x < kX; ++x) acc[i][x] = acc1[0][x];
          }
        }
        j += run;
      }
      for (int i = 0; i < nr; ++i) {
        float* o = out.o + int64_t{i0 + i} * sh.dvp + c0;
        for (int x = 0; x < kX && c0 + x * kW < sh.dvp; ++x) PVec::Store(o + x * kW, acc[i][x]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The fold and the final division.

void ResetState(const Shape& sh, const State& st) {
  for (int i = 0; i < sh.n; ++i) {
    st.m[i] = kNegInf;
    st.l[i] = 0.0f;
  }
  std::memset(st.o, 0, sizeof(float) * sh.n * sh.dvp);
}

// Folds row-head i of split state `sp` into the running state `st` (see the header).
void FoldRow(const Shape& sh, const State& st, const State& sp, int i) {
  const float m_old = st.m[i], m = sp.m[i];
  const float m_new = m_old > m ? m_old : m;  // a NaN m makes m_new NaN, hence a NaN row
  const float ref = m_new == kNegInf ? 0.0f : m_new;
  const float a = std::exp(m_old - ref), b = std::exp(m - ref);
  st.l[i] = st.l[i] * a + sp.l[i] * b;
  st.m[i] = m_new;
  const V va = PVec::Set1(a), vb = PVec::Set1(b);
  float* o = st.o + int64_t{i} * sh.dvp;
  const float* os = sp.o + int64_t{i} * sh.dvp;
  for (int c = 0; c < sh.dvp; c += kW) {
    PVec::Store(o + c, PVec::Fmadd(PVec::Load(o + c), va, PVec::Mul(PVec::Load(os + c), vb)));
  }
}

// True when query row r (of the sequence) has allowed keys in `split`.
bool Reaches(const Seq& sq, int r, int split) { return split * kSplit <= sq.first_pos + r; }

// The mean of the value rows [from, to) of the sequence's kv head (what a row whose allowed
// scores are all -inf gets, as in attention_params.h's NaN rule 2: all kv_len keys, or with a
// window the row's window), summed in key order.
template <DType T>
void MeanOfValues(const PagedAttentionParams& p, const Shape& sh, const Seq& sq, int kv_head,
                  int from, int to, float* mean) {
  std::memset(mean, 0, sizeof(float) * sh.dvp);
  const char* v_base = static_cast<const char*>(p.v_pages);
  for (int j = from; j < to; ++j) {
    const void* v = v_base + (sq.pages[j / p.page_size] * sh.v_page_stride +
                              (int64_t{kv_head} * p.page_size + j % p.page_size) * p.v_head_dim) *
                                 sh.esize;
    for (int c = 0; c < p.v_head_dim; c += kW) {
      PVec::Store(mean + c, PVec::Add(PVec::Load(mean + c), LoadSome<T>(v, c, p.v_head_dim - c)));
    }
  }
  const V inv = PVec::Set1(1.0f / static_cast<float>(to - from));
  for (int c = 0; c < sh.dvp; c += kW) PVec::Store(mean + c, PVec::Mul(PVec::Load(mean + c), inv));
}

// out = O / L (and lse = M + log L) for the task's row-heads; rows are [row0, row0 + rows).
template <DType T>
void Finish(const PagedAttentionParams& p, const Shape& sh, int seq, const Seq& sq, int kv_head,
            int row0, const State& st, float* mean) {
  bool have_mean = false;
  const int dv = p.v_head_dim;
  for (int i = 0; i < sh.n; ++i) {
    const int64_t t = p.q_offsets[seq] + row0 + i / sh.group;
    const int64_t h = int64_t{kv_head} * sh.group + i % sh.group;
    float* out = p.out + (t * p.num_heads + h) * dv;
    const float l = st.l[i];
    // l == 0 exactly when every allowed score was -inf (not m == -inf: a NaN score can be lost
    // by the max, never by the sum, which keeps the row NaN as the NaN rule wants).
    if (l == 0.0f) {
      if (p.window_left >= 0) {
        // The row's own window (the pages before it may be gone: session_table.h, dropped).
        const int pos = sq.first_pos + row0 + i / sh.group;
        MeanOfValues<T>(p, sh, sq, kv_head, MaxInt(0, pos - p.window_left), pos + 1, mean);
      } else if (!have_mean) {
        MeanOfValues<T>(p, sh, sq, kv_head, 0, sq.kv_len, mean);
        have_mean = true;
      }
      for (int c = 0; c < dv; c += kW)
        PVec::StoreN(out + c, PVec::Load(mean + c), MinInt(kW, dv - c));
      if (p.lse != nullptr) p.lse[t * p.num_heads + h] = kNegInf;
      continue;
    }
    const V vl = PVec::Set1(l);
    const float* o = st.o + int64_t{i} * sh.dvp;
    int c = 0;
    for (; c + kW <= dv; c += kW) PVec::Store(out + c, PVec::Div(PVec::Load(o + c), vl));
    if (c < dv) PVec::StoreN(out + c, PVec::Div(PVec::Load(o + c), vl), dv - c);
    if (p.lse != nullptr) p.lse[t * p.num_heads + h] = st.m[i] + std::log(l);
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points.

template <DType T, bool kDotBf16>
void RunTyped(const PagedAttentionParams& p, const PagedTask& task, float* scratch) {
  const Shape sh = ShapeOf(p, task.rows);
  const Seq sq = SeqOf(p, task.seq);
  const Scratch sc = Carve(scratch, sh);

  // The queries of the task's row-heads (in q_dtype: float32 or T), widened to float32 and
  // zero-padded to dp (or, for the bfloat16 dot product, as they are, zero-padded to whole pairs
  // of vectors).
  const bool q32 = p.q_dtype == DType::kFloat32;
  for (int i = 0; i < sh.n; ++i) {
    const int64_t t = p.q_offsets[task.seq] + task.row0 + i / sh.group;
    const int64_t h = int64_t{task.kv_head} * sh.group + i % sh.group;
    const int64_t src = (t * p.num_heads + h) * p.head_dim;
    if constexpr (kDotBf16) {
      const int dq = Bf16QueryStride<PVec>(p.head_dim);
      uint16_t* q16 = reinterpret_cast<uint16_t*>(sc.q) + int64_t{i} * dq;
      std::memcpy(q16, static_cast<const uint16_t*>(p.q) + src, sizeof(uint16_t) * p.head_dim);
      std::memset(q16 + p.head_dim, 0, sizeof(uint16_t) * (dq - p.head_dim));
      continue;
    }
    for (int c = 0; c < sh.dp; c += kW) {
      PVec::Store(sc.q + int64_t{i} * sh.dp + c,
                  q32 ? LoadSome<DType::kFloat32>(p.q, src + c, p.head_dim - c)
                      : LoadSome<T>(p.q, src + c, p.head_dim - c));
    }
  }

  const char* k_base = static_cast<const char*>(p.k_pages);
  const char* v_base = static_cast<const char*>(p.v_pages);
  const int block_limit = sq.first_pos + task.row0 + task.rows;
  const int first = task.partial != nullptr ? task.split : 0;
  const int last = task.partial != nullptr ? task.split + task.splits  // one past
                                           : (block_limit + kSplit - 1) / kSplit;
  // Splits wholly before the window of the block's first row (whose window starts first) hold
  // no allowed key for any of its rows: skipped, so that a windowed row costs O(window).
  const int window_split =
      p.window_left >= 0 ? MaxInt(0, sq.first_pos + task.row0 - p.window_left) / kSplit : 0;
  const int from = MaxInt(first, window_split);
  const int k_end = MinInt(MinInt(last * kSplit, sq.kv_len), block_limit);
  Prefetcher k_pf{k_base,     sh.k_page_stride, sq.pages,      p.page_size, task.kv_head,
                  p.head_dim, sh.esize,         from * kSplit, k_end};
  Prefetcher v_pf{v_base,       sh.v_page_stride, sq.pages,      p.page_size, task.kv_head,
                  p.v_head_dim, sh.esize,         from * kSplit, k_end};

  if (task.partial != nullptr) {
    for (int split = first; split < last; ++split) {
      const State part = StateAt(task.partial + (split - first) * StateFloats(sh), sh);
      if (split < from) {
        ResetState(sh, part);  // empty: the combine folds nothing from it
        continue;
      }
      ComputeSplit<T, kDotBf16>(p, sh, sq, task.kv_head, task.row0, task.rows, split, sc, part,
                                k_pf, v_pf);
    }
    return;
  }
  ResetState(sh, sc.run);
  for (int split = from; split < last; ++split) {
    ComputeSplit<T, kDotBf16>(p, sh, sq, task.kv_head, task.row0, task.rows, split, sc, sc.split,
                              k_pf, v_pf);
    for (int i = 0; i < sh.n; ++i) {
      if (Reaches(sq, task.row0 + i / sh.group, split)) FoldRow(sh, sc.run, sc.split, i);
    }
  }
  Finish<T>(p, sh, task.seq, sq, task.kv_head, task.row0, sc.run, sc.mean);
}

template <DType T>
void CombineTyped(const PagedAttentionParams& p, int seq, int kv_head, const float* partials,
                  float* scratch) {
  const Seq sq = SeqOf(p, seq);
  const Shape sh = ShapeOf(p, sq.q_len);
  const Scratch sc = Carve(scratch, sh);
  ResetState(sh, sc.run);
  const int splits = (sq.kv_len + kSplit - 1) / kSplit;
  for (int split = 0; split < splits; ++split) {
    const State sp = StateAt(const_cast<float*>(partials) + split * StateFloats(sh), sh);
    for (int i = 0; i < sh.n; ++i) {
      if (Reaches(sq, i / sh.group, split)) FoldRow(sh, sc.run, sp, i);
    }
  }
  Finish<T>(p, sh, seq, sq, kv_head, 0, sc.run, sc.mean);
}

int64_t ScratchFloats(const PagedAttentionParams& p, int rows) {
  return ScratchFloatsFor(ShapeOf(p, rows));
}

int64_t PartialFloats(const PagedAttentionParams& p, int rows) {
  return StateFloats(ShapeOf(p, rows));
}

void Run(const PagedAttentionParams& p, const PagedTask& task, float* scratch) {
  switch (p.dtype) {
    case DType::kFloat32:
      return RunTyped<DType::kFloat32, false>(p, task, scratch);
    case DType::kFloat16:
      return RunTyped<DType::kFloat16, false>(p, task, scratch);
    case DType::kBFloat16:
      if constexpr (CanBf16Dot<DType::kBFloat16>()) {
        if (p.q_dtype == DType::kBFloat16)
          return RunTyped<DType::kBFloat16, true>(p, task, scratch);
      }
      return RunTyped<DType::kBFloat16, false>(p, task, scratch);
    case DType::kBool:  // not a cache type (REQUIRES a valid p)
      break;
  }
}

void Combine(const PagedAttentionParams& p, int seq, int kv_head, const float* partials,
             float* scratch) {
  switch (p.dtype) {
    case DType::kFloat32:
      return CombineTyped<DType::kFloat32>(p, seq, kv_head, partials, scratch);
    case DType::kFloat16:
      return CombineTyped<DType::kFloat16>(p, seq, kv_head, partials, scratch);
    case DType::kBFloat16:
      return CombineTyped<DType::kBFloat16>(p, seq, kv_head, partials, scratch);
    case DType::kBool:
      break;
  }
}

// The kernel of this ISA, for its file's named constant (k<Isa>PagedAttentionKernel).
constexpr PagedAttentionKernel Kernel(Isa isa, const char* name) {
  return {isa, name, &ScratchFloats, &PartialFloats, &Run, &Combine};
}

}  // namespace
}  // namespace attnserve::kernels::cpu::ATTNSERVE_CPU_ISA_NAMESPACE::paged

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel ATTNSERVE_CPU_KERNEL(ATTNSERVE_CPU_ISA_NAMESPACE::paged::Kernel);
}  // namespace attnserve::kernels::cpu
