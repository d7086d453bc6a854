// The fused attention forward kernel body (FlashAttention-2 style), specialised by
// FlashFwdTraits. Launch code: flash_fwd_launch_template.h; instantiations: flash_fwd_hdim*.cu.
//
// One thread block computes kBlockM query rows of one (sequence, head): Q is loaded once into
// shared memory (and, up to head dim 160, kept in registers as mma A-fragments); head_dim and
// v_head_dim are zero-padded to the traits' kHeadDim while loading (kernel_traits.h). For each
// block of kBlockN keys, S = Q K^T (fp32),
// scale + mask in registers, online softmax (online_softmax.h), then O += P V with P rounded to
// the operand type. Key blocks past the last allowed key of the block's last row (causal, key
// length) are never loaded. Rows with no allowed key get the mean of all values (v_mean).
//
// ScoreMods (windows, soft-capping, ALiBi) are taken by the Traits::kMods instantiation only: it
// starts
// at the first key block inside the block's windows (blocks wholly before every row's window
// are never loaded, so a window of w keys costs O(L·w)), tests each score against its row's
// window start as well as its limit, and modifies the scores in linear units before taking
// them to log2 units. The plain instantiation keeps the registers it had: at hdim 64 one more
// live value made it spill (flash_fwd_dispatch.cc picks the instantiation).
#ifndef ATTNSERVE_KERNELS_CUDA_FLASH_FWD_KERNEL_H_
#define ATTNSERVE_KERNELS_CUDA_FLASH_FWD_KERNEL_H_

#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/kernel_traits.h"
#include "kernels/cuda/online_softmax.h"

namespace attnserve::kernels::cuda {
namespace detail {

// Offset of element (row, col) in a swizzled [rows, kHeadDim] shared-memory tile; col % 8 == 0.
// kernel_traits.h (kSwizzleChunks) says why two patterns.
template <int kHeadDim>
__device__ __forceinline__ int SwizzledOffset(int row, int col) {
  if constexpr (kHeadDim % 64 == 0) {
    return row * kHeadDim + ((((col >> 3) ^ (row & 7))) << 3);
  } else {
    return row * kHeadDim + ((((col >> 3) ^ ((row >> 1) & 3))) << 3);
  }
}

// SwizzledOffset for the ldmatrix addresses of the unrolled loops: a thread's row r has a fixed
// r % 8 and it reads one 8-column half of each 16-column block kk16, so the XOR touches only
// the chunk's place within its swizzle group and takes kGroup / 2 distinct values per thread,
// computed once here. Written with SwizzledOffset in the loops, nvcc kept one address register
// per (block, tile) and the kernels spilled (ptxas fails the build on any:
// kernels/cuda/CMakeLists.txt).
template <int kHeadDim>
struct LdMatrixCols {
  static constexpr int kGroup = kHeadDim % 64 == 0 ? 8 : 4;  // chunks per swizzle group
  int col[kGroup / 2];
  // row8: the thread's row % 8; half: its 8-column half (0 or 1) of each 16-column block.
  __device__ __forceinline__ LdMatrixCols(int row8, int half) {
    const int x = kGroup == 8 ? (row8 & 7) : ((row8 >> 1) & 3);
#pragma unroll
    for (int j = 0; j < kGroup / 2; ++j) col[j] = ((2 * j + half) ^ x) << 3;
  }
  // == SwizzledOffset<kHeadDim>(row, kk16 * 16 + half * 8) for row % 8 == row8.
  __device__ __forceinline__ int Offset(int row, int kk16) const {
    return row * kHeadDim + (kk16 / (kGroup / 2)) * (kGroup * 8) + col[kk16 % (kGroup / 2)];
  }
};

// Issues the cp.async copies of rows [0, kRows) of a [rows, kHeadDim] global tile into shared
// memory; rows >= valid_rows and columns >= valid_cols (the padding up to kHeadDim; a multiple
// of 8) are zero-filled, never read. Consecutive threads copy consecutive 16-byte chunks of a
// row (coalesced).
template <int kRows, int kHeadDim, int kNThreads, typename Element>
__device__ __forceinline__ void LoadTileAsync(Element* smem, const Element* gmem,
                                              int64_t row_stride, int valid_rows, int valid_cols,
                                              int tid) {
  constexpr int kChunks = kHeadDim / 8;
  // A thread copies the same chunk of every row it copies when kChunks divides kNThreads: one
  // test of the column for the whole tile (a per-copy test tipped hdim 128 into spilling).
  constexpr bool kFixedChunk = kNThreads % kChunks == 0;
  if (kFixedChunk && (tid % kChunks) * 8 >= valid_cols) valid_rows = 0;
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kNThreads; ++it) {
    const int idx = it * kNThreads + tid;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool valid = r < valid_rows && (kFixedChunk || c * 8 < valid_cols);
    const Element* src = valid ? gmem + r * row_stride + c * 8 : gmem;
    CpAsync16(SmemAddr(smem + SwizzledOffset<kHeadDim>(r, c * 8)), src, valid);
  }
}

// The byte (0-3) within its 4-byte word at which query row i's mask row starts: where its
// scores start in the mask tile row (LoadMaskTileAsync). The same for every key block (they
// start at multiples of 16 keys, column stride 0 or 1).
__device__ __forceinline__ int MaskRowOffset(const uint8_t* mask, int64_t row_stride, int i) {
  return static_cast<int>(
      (reinterpret_cast<uintptr_t>(mask) + static_cast<uintptr_t>(i * row_stride)) & 3);
}

// Issues the cp.async copies of the mask bytes of query rows [m0, m0 + kBlockM) x keys
// [n0, n0 + kBlockN) into shared memory, in the pipeline's current group with the K tile: they
// land while the block computes, where plain loads waited for global memory in line. (A tile
// at all: global byte loads inside the unrolled score loop were hoisted and spilled.)
// cp.async copies whole aligned words while a mask row may start at any byte: row r's bytes
// [first, first + len) go in the words that hold them, from the one at or below first, to tile
// row r (kMaskStride bytes apart, kernel_traits.h), so its scores start at byte
// MaskRowOffset. The bytes of rows >= q_len and keys >= kv_len are zero-filled, and nothing
// past a row's last key is read; the bytes below first in its word are the mask's own (the
// previous row's, or this row's previous keys). REQUIRES col_stride 0 or 1 (a row of keys, or
// one byte broadcast over them) and mask 4-byte aligned (SelectFlashPath checks both).
template <int kBlockM, int kBlockN, int kMaskStride, int kNThreads>
__device__ __forceinline__ void LoadMaskTileAsync(uint8_t* s_mask, const uint8_t* mask,
                                                  int64_t row_stride, int64_t col_stride, int m0,
                                                  int n0, int q_len, int kv_len, int tid) {
  constexpr int kWords = kBlockN / 4 + 1;
  const int row_bytes = col_stride == 0 ? 1 : min(kBlockN, kv_len - n0);
#pragma unroll 4
  for (int idx = tid; idx < kBlockM * kWords; idx += kNThreads) {
    const int r = idx / kWords;
    const int w = idx % kWords;
    const int i = m0 + r;
    const uintptr_t first = reinterpret_cast<uintptr_t>(mask) +
                            static_cast<uintptr_t>(i * row_stride + n0 * col_stride);
    // The bytes to copy from the row's first word on; none for a row past q_len (its address
    // may lie past the mask).
    const int bytes = i < q_len && row_bytes > 0 ? static_cast<int>(first & 3) + row_bytes : 0;
    const int src_bytes = min(max(bytes - 4 * w, 0), 4);
    const uintptr_t word = (first & ~uintptr_t{3}) + 4 * static_cast<uintptr_t>(w);
    CpAsync4(SmemAddr(s_mask + r * kMaskStride + 4 * w), reinterpret_cast<const void*>(word),
             src_bytes);
  }
}

}  // namespace detail

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    FlashFwdKernel(const FlashFwdParams p, const int num_m_blocks) {
  using Element = typename Traits::Element;
  constexpr bool kMods = Traits::kMods;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr ComputeType kType = Traits::kType;
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* s_q = reinterpret_cast<Element*>(smem_raw);
  Element* s_k = s_q + Traits::kSmemQElems;
  Element* s_v = s_k + Traits::kSmemKElems;
  // [kBlockM, kBlockN] at a byte offset per row (LoadMaskTileAsync), rows kMaskStride bytes apart.
  uint8_t* s_mask = reinterpret_cast<uint8_t*>(s_v + Traits::kSmemVElems);

  // One 1-D grid (flash_grid.h): m block fastest, then head, then sequence.
  const FlashBlockCoord coord = FlashBlockOf(blockIdx.x, num_m_blocks, p.num_heads);
  const int m_block = coord.m_block;
  const int seq = coord.seq;
  const int head = coord.head;
  const int q_begin = p.cu_seqlens_q[seq];
  const int q_len = p.cu_seqlens_q[seq + 1] - q_begin;
  const int m0 = m_block * kBlockM;
  if (m0 >= q_len) return;
  const int k_begin = p.cu_seqlens_k[seq];
  const int kv_len = p.cu_seqlens_k[seq + 1] - k_begin;
  const int key_length = p.key_lengths != nullptr ? p.key_lengths[seq] : kv_len;
  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const int row_end = min(m0 + kBlockM, q_len);
  // The key blocks [nb_begin, n_blocks) hold every key some row of the block may attend to.
  const KeyWindow window = kMods ? p.window : KeyWindow{};
  const int n_blocks =
      NumKeyBlocks(m0, row_end, q_len, kv_len, key_length, p.causal, kBlockN, window);
  const int nb_begin = FirstKeyBlock(m0, q_len, kv_len, kBlockN, window);

  const auto [q_ptr, k_ptr, v_ptr] =
      detail::QkvRowsOf<Element>(p, q_begin + m0, head, k_begin, kv_head);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  detail::LoadTileAsync<kBlockM, kHeadDim, kNThreads>(s_q, q_ptr, p.q_row_stride, q_len - m0,
                                                      p.head_dim, tid);
  const uint8_t* mask_ptr =
      p.mask != nullptr ? p.mask + seq * p.mask_batch_stride + head * p.mask_head_stride : nullptr;
  if (nb_begin < n_blocks) {
    const int n0 = nb_begin * kBlockN;
    detail::LoadTileAsync<kBlockN, kHeadDim, kNThreads>(
        s_k, k_ptr + n0 * p.k_row_stride, p.k_row_stride, kv_len - n0, p.head_dim, tid);
    if (mask_ptr != nullptr) {
      detail::LoadMaskTileAsync<kBlockM, kBlockN, Traits::kMaskStride, kNThreads>(
          s_mask, mask_ptr, p.mask_row_stride, p.mask_col_stride, m0, n0, q_len, kv_len, tid);
    }
  }
  detail::CpAsyncCommit();
  detail::CpAsyncWaitAll();
  __syncthreads();

  // Q as A-fragments: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15);
  // loaded once here when they stay in registers, else at each k16 step of Q.K^T.
  // Q and V are read by ldmatrix with the 8-column half lane / 16, K with (lane / 8) % 2.
  const detail::LdMatrixCols<kHeadDim> qv_cols(lane % 8, lane >> 4);
  const detail::LdMatrixCols<kHeadDim> k_cols(lane % 8, (lane >> 3) & 1);
  auto load_q_frag = [&](uint32_t(&frag)[4], int kk) {
    const int row = warp * 16 + (lane % 8) + ((lane >> 3) & 1) * 8;
    detail::LdMatrixX4(frag, detail::SmemAddr(s_q + qv_cols.Offset(row, kk)));
  };
  uint32_t q_frag[Traits::kQInRegs ? Traits::kQSteps : 1][4];
  if constexpr (Traits::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < Traits::kQSteps; ++kk) load_q_frag(q_frag[kk], kk);
  }

  float acc_o[Traits::kOTiles][4];
#pragma unroll
  for (int t = 0; t < Traits::kOTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[t][e] = 0.0f;
  }
  // This thread owns rows r0 = lane / 4 and r0 + 8 of its warp's 16 (accumulator elements 0-1
  // and 2-3), and columns 2 * (lane % 4) + {0, 1} of every 8-wide tile.
  const int row_in_seq[2] = {m0 + warp * 16 + lane / 4, m0 + warp * 16 + lane / 4 + 8};
  const int limit[2] = {KeyLimit(row_in_seq[0], q_len, kv_len, key_length, p.causal, window),
                        KeyLimit(row_in_seq[1], q_len, kv_len, key_length, p.causal, window)};
  // Row r0's aligned position i' = i + kv_len - q_len (row r0 + 8's is 8 more): its window
  // starts at i' - window.left (KeyStart without its clamp: the keys tested lie in [0, kv_len),
  // so the comparisons come out the same) and ALiBi's distance is |j - i'|. One register for
  // both rows and both uses: with a start per row, hdims 64, 96 and 160 spilled. And the head's
  // ALiBi slope. (kMods only.)
  const int aligned = kMods ? row_in_seq[0] + kv_len - q_len : 0;
  const float slope = kMods && p.alibi_slopes != nullptr ? p.alibi_slopes[head] : 0.0f;
  OnlineSoftmaxRow softmax[2] = {OnlineSoftmaxInit(), OnlineSoftmaxInit()};
  // Where the two rows' scores start in the mask tile, and the step per key (0: the mask is
  // broadcast over the keys).
  int mask_at[2] = {0, 0};
  const int mask_col_step = p.mask_col_stride != 0 ? 1 : 0;
  if (mask_ptr != nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mask_at[r] = (warp * 16 + lane / 4 + 8 * r) * Traits::kMaskStride +
                   detail::MaskRowOffset(mask_ptr, p.mask_row_stride, row_in_seq[r]);
    }
  }

  for (int nb = nb_begin; nb < n_blocks; ++nb) {
    const int n0 = nb * kBlockN;
    // K[nb] has landed and every thread is done reading V[nb - 1]: V[nb] may overwrite it.
    detail::CpAsyncWaitAll();
    __syncthreads();
    detail::LoadTileAsync<kBlockN, kHeadDim, kNThreads>(
        s_v, v_ptr + n0 * p.v_row_stride, p.v_row_stride, kv_len - n0, p.v_head_dim, tid);
    detail::CpAsyncCommit();

    // S = Q K^T. K is [keys, dims] row-major: non-transposed ldmatrix gives B-fragments.
    float acc_s[Traits::kSTiles][4];
#pragma unroll
    for (int t = 0; t < Traits::kSTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[t][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < Traits::kQSteps; ++kk) {
      const int qk = Traits::kQInRegs ? kk : 0;
      if constexpr (!Traits::kQInRegs) load_q_frag(q_frag[0], kk);
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        const int row = nn * 16 + (lane % 8) + (lane >> 4) * 8;
        detail::LdMatrixX4(b, detail::SmemAddr(s_k + k_cols.Offset(row, kk)));
        detail::Mma16816<kType>(acc_s[2 * nn], q_frag[qk], b[0], b[1]);
        detail::Mma16816<kType>(acc_s[2 * nn + 1], q_frag[qk], b[2], b[3]);
      }
    }

    // Scale to log2 units (with soft-capping or ALiBi: modify in linear units first); block
    // what causality, key length, kv_len, the window or the mask block. Tiles wholly inside
    // every row's allowed keys without a mask skip the per-element test.
    const bool check =
        mask_ptr != nullptr ||
        !TileFullyAllowed(m0, row_end, n0, kBlockN, q_len, kv_len, key_length, p.causal, window);
    if constexpr (kMods) {
      // In log2 units here already (below, the plain kernel's scaling is skipped).
      if (p.modifies_scores()) {
#pragma unroll
        for (int t = 0; t < Traits::kSTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = t * 8 + (lane % 4) * 2 + (e & 1);
            acc_s[t][e] = ModifyScore(acc_s[t][e] * p.scale, p.softcap, slope, n0 + col,
                                      aligned + 8 * (e / 2)) *
                          kLog2e;
          }
        }
      } else {
#pragma unroll
        for (int t = 0; t < Traits::kSTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[t][e] *= p.scale_log2;
        }
      }
    }
    float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int t = 0; t < Traits::kSTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int col = t * 8 + (lane % 4) * 2 + (e & 1);
        float s = kMods ? acc_s[t][e] : acc_s[t][e] * p.scale_log2;
        if (check) {
          bool allowed = n0 + col < limit[r];
          if constexpr (kMods) {
            allowed =
                allowed && (p.window.left < 0 || n0 + col - 8 * r - aligned >= -p.window.left);
          }
          if (mask_ptr != nullptr) {
            allowed = allowed && s_mask[mask_at[r] + col * mask_col_step] != 0;
          }
          if (!allowed) s = kNegInf;
        }
        acc_s[t][e] = s;
        tile_max[r] = fmaxf(tile_max[r], s);
      }
    }

    // Online softmax: rescale what was accumulated, then exponentiate this tile.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float factor = OnlineSoftmaxRescale(softmax[r], detail::QuadMax(tile_max[r]));
#pragma unroll
      for (int t = 0; t < Traits::kOTiles; ++t) {
        acc_o[t][2 * r] *= factor;
        acc_o[t][2 * r + 1] *= factor;
      }
    }
#pragma unroll
    for (int t = 0; t < Traits::kSTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float prob = OnlineSoftmaxProb(softmax[e / 2], acc_s[t][e]);
        acc_s[t][e] = prob;
        softmax[e / 2].sum += prob;
      }
    }

    // V[nb] has landed and every thread is done reading K[nb]: prefetch K[nb + 1].
    detail::CpAsyncWaitAll();
    __syncthreads();
    if (nb + 1 < n_blocks) {
      detail::LoadTileAsync<kBlockN, kHeadDim, kNThreads>(
          s_k, k_ptr + (n0 + kBlockN) * p.k_row_stride, p.k_row_stride, kv_len - n0 - kBlockN,
          p.head_dim, tid);
      // The mask tile of the next block: this iteration's was read above, before the barrier.
      if (mask_ptr != nullptr) {
        detail::LoadMaskTileAsync<kBlockM, kBlockN, Traits::kMaskStride, kNThreads>(
            s_mask, mask_ptr, p.mask_row_stride, p.mask_col_stride, m0, n0 + kBlockN, q_len, kv_len,
            tid);
      }
    }
    detail::CpAsyncCommit();

    // O += P V. The S accumulators of two adjacent n8 tiles are exactly the A-fragment of one
    // k16 step; V is [keys, dims] row-major, so transposed ldmatrix gives B-fragments.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {detail::PackPair<kType>(acc_s[2 * kk][0], acc_s[2 * kk][1]),
                             detail::PackPair<kType>(acc_s[2 * kk][2], acc_s[2 * kk][3]),
                             detail::PackPair<kType>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]),
                             detail::PackPair<kType>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3])};
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        uint32_t b[4];
        const int row = kk * 16 + (lane % 8) + ((lane >> 3) & 1) * 8;
        detail::LdMatrixX4Trans(b, detail::SmemAddr(s_v + qv_cols.Offset(row, dd)));
        detail::Mma16816<kType>(acc_o[2 * dd], a, b[0], b[1]);
        detail::Mma16816<kType>(acc_o[2 * dd + 1], a, b[2], b[3]);
      }
    }
  }

  // Epilogue: normalise, or the uniform average for rows with no allowed key.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = detail::QuadSum(softmax[r].sum);
    const int row = row_in_seq[r];
    if (row >= q_len) continue;
    const float inv = OnlineSoftmaxInvSum(total);
    const bool blocked = OnlineSoftmaxFullyBlocked(total);
    const float* mean = detail::ValueMeanRow(p, seq, kv_head);
    float* o_row = p.o + (q_begin + row) * p.o_row_stride + head * p.o_head_stride;
#pragma unroll
    for (int t = 0; t < Traits::kOTiles; ++t) {
      const int col = t * 8 + (lane % 4) * 2;
      if (t * 8 >= p.v_head_dim) break;  // the zero padding up to kHeadDim (a multiple of 8)
      float2 val;
      if (!blocked) {
        val = make_float2(acc_o[t][2 * r] * inv, acc_o[t][2 * r + 1] * inv);
      } else if (mean != nullptr) {
        val = make_float2(mean[col], mean[col + 1]);
      } else {
        val = make_float2(0.0f, 0.0f);
      }
      *reinterpret_cast<float2*>(o_row + col) = val;
    }
  }
}

}  // namespace attnserve::kernels::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASH_FWD_KERNEL_H_
