#!/usr/bin/env bash
# Writes a copy of kernels/cuda/ with one bug injected, for the mutation smoke test (README.md):
# the emulation tests built against the copy must fail, or the harness could pass silently.
# Usage: make_mutant.sh NAME REPO_ROOT OUT_DIR   (the copy goes to OUT_DIR/kernels/cuda)
# Each mutation replaces an exact piece of kernel text; if the text is not found (the kernel
# changed), this fails, so that a mutation never silently becomes a no-op.
set -euo pipefail
name=$1 root=$2 out=$3
rm -rf "$out/kernels/cuda"
mkdir -p "$out/kernels"
cp -r "$root/kernels/cuda" "$out/kernels/cuda"
nl=$'\n'
case "$name" in
  no_barrier)  # the barrier between reading K[nb] and overwriting it with K[nb + 1]
    file=flash_fwd_kernel.h
    from="    detail::CpAsyncWaitAll();${nl}    __syncthreads();${nl}    if (nb + 1 < n_blocks) {"
    to="    detail::CpAsyncWaitAll();${nl}    if (nb + 1 < n_blocks) {" ;;
  no_cp_async_wait)  # K[nb] read without waiting for its copy
    file=flash_fwd_kernel.h
    from="    detail::CpAsyncWaitAll();${nl}    __syncthreads();${nl}    detail::LoadTileAsync<kBlockN, kHeadDim, kNThreads>(${nl}        s_v"
    to="    __syncthreads();${nl}    detail::LoadTileAsync<kBlockN, kHeadDim, kNThreads>(${nl}        s_v" ;;
  causal_off_by_one)
    file=online_softmax.h
    from="int causal_limit = i + kv_len - q_len + 1;"
    to="int causal_limit = i + kv_len - q_len;" ;;
  one_tile_short)
    file=online_softmax.h
    from="return (limit + block_n - 1) / block_n;"
    to="return limit / block_n;" ;;
  v_not_transposed)
    file=flash_fwd_kernel.h
    from="detail::LdMatrixX4Trans(b,"
    to="detail::LdMatrixX4(b," ;;
  swapped_fragments)
    file=flash_fwd_kernel.h
    from="detail::Mma16816<kType>(acc_s[2 * nn], q_frag[qk], b[0], b[1]);"
    to="detail::Mma16816<kType>(acc_s[2 * nn], q_frag[qk], b[1], b[0]);" ;;
  padding_read_fixed_chunk)  # columns past head_dim copied (thread with a fixed chunk, hdim 32)
    file=flash_fwd_kernel.h
    from="if (kFixedChunk && (tid % kChunks) * 8 >= valid_cols) valid_rows = 0;"
    to="" ;;
  padding_read_per_chunk)  # columns past head_dim copied (chunk varying per copy, hdim 160)
    file=flash_fwd_kernel.h
    from="(kFixedChunk || c * 8 < valid_cols)"
    to="(kFixedChunk || true)" ;;
  v_mean_padded_stride)  # a blocked row's v_mean read at the padded width's stride
    file=flash_fwd_kernel.h
    from="detail::ValueMeanRow(p, seq, kv_head)"
    to="(p.v_mean != nullptr ? p.v_mean + (int64_t{seq} * p.num_kv_heads + kv_head) * kHeadDim : nullptr)" ;;
  stale_mask_tile)  # the next key block's mask tile never loaded
    file=flash_fwd_kernel.h
    from="      if (mask_ptr != nullptr) {${nl}        detail::LoadMaskTile"
    to="      if (false) {${nl}        detail::LoadMaskTile" ;;
  mask_copy_not_waited)  # the next mask tile's copies issued after the group's commit: the wait
    # before the scores read it does not cover them (wait_group 0 leaves uncommitted copies)
    file=flash_fwd_kernel.h
    call="detail::LoadMaskTileAsync<kBlockM, kBlockN, Traits::kMaskStride, kNThreads>(${nl}"
    args="s_mask, mask_ptr, p.mask_row_stride, p.mask_col_stride, m0, n0 + kBlockN, q_len, kv_len,${nl}"
    from="      if (mask_ptr != nullptr) {${nl}        ${call}            ${args}            tid);${nl}      }${nl}    }${nl}    detail::CpAsyncCommit();${nl}"
    to="    }${nl}    detail::CpAsyncCommit();${nl}    if (mask_ptr != nullptr && nb + 1 < n_blocks) {${nl}      ${call}${args}tid);${nl}    }${nl}" ;;
  mask_row_offset_ignored)  # mask rows read from the tile row's first byte, not their offset
    file=flash_fwd_kernel.h
    from="  return static_cast<int>(${nl}      (reinterpret_cast<uintptr_t>(mask) + static_cast<uintptr_t>(i * row_stride)) & 3);"
    to="  return 0;" ;;
  generic_no_rescale)  # the online-softmax rescale of the accumulators dropped
    file=flash_fwd_generic_kernel.h
    from="for (int t = 0; t < kOutPerLane; ++t) acc[t] *= factor;"
    to="for (int t = 0; t < kOutPerLane; ++t) acc[t] *= 1.0f;" ;;
  generic_no_syncwarp)  # q staged in shared memory read before every lane wrote it
    file=flash_fwd_generic_kernel.h
    from="  __syncwarp();${nl}"
    to="" ;;
  decode_last_split_dropped)  # the decode combine merges one split too few
    file=flash_decode_kernel.h
    from="  for (int s = 0; s < splits; ++s) {${nl}    const float* row = base + s * slot_floats;"
    to="  for (int s = 0; s + 1 < splits; ++s) {${nl}    const float* row = base + s * slot_floats;" ;;
  paged_wrong_page)  # the logical page index used as the physical one (page table skipped)
    file=paged_attention_kernel.h
    from="p.k_offset(pages[j / p.page_size], blk.kv_head"
    to="p.k_offset(j / p.page_size, blk.kv_head" ;;
  paged_causal_off_by_one)  # a query row also sees the next token's key
    file=paged_attention_kernel.h
    from="return p.kv_lens[seq] - p.q_lens[seq] + token + 1;"
    to="return p.kv_lens[seq] - p.q_lens[seq] + token + 2;" ;;
  paged_no_syncwarp)  # the tile's probabilities read before every lane wrote them
    file=paged_attention_kernel.h
    from="    __syncwarp();${nl}    const int n = min(32, j_end - j0);"
    to="    const int n = min(32, j_end - j0);" ;;
  paged_last_split_dropped)  # the combine misses a row's last split when it holds one key
    file=paged_attention_kernel.h
    from="PagedSplits(PagedRowLimit(p, blk.seq, row_index))"
    to="PagedSplits(PagedRowLimit(p, blk.seq, row_index) - 1)" ;;
  paged_gqa_head_shared)  # every row of a GQA group reads the group's first query head
    file=paged_attention_kernel.h
    from="const int head = blk.kv_head * group + row % group;"
    to="const int head = blk.kv_head * group;" ;;
  paged_scatter_v_at_k_width)  # a V row placed at the K row width (head_dim for v_head_dim)
    file=paged_scatter_kernel.h
    from="v_pages[rows[i] * v_words + c]"
    to="v_pages[rows[i] * k_words + c]" ;;
  naive_nan_as_blocked)  # a NaN softmax sum taken for a fully blocked row (the review's bug)
    file=naive_attention.cu
    from="const bool blocked = sum == 0.0f;"
    to="const bool blocked = !(sum > 0.0f);" ;;
  naive_gqa_first_query_head)  # every key/value head's GEMM reads query head 0's group
    file=naive_attention.cu
    from="(q_begin * p.q_row_stride + int64_t{g} * group * p.q_head_stride) * esize;"
    to="(q_begin * p.q_row_stride + int64_t{g} * p.q_head_stride) * esize;" ;;
  naive_mask_col_stride_ignored)  # a mask broadcast over keys (column stride 0) read as dense
    file=naive_attention.cu
    from="mrow[j * mask_col_stride]"
    to="mrow[j]" ;;
  value_mean_last_columns_dropped)  # the grid misses the last, partial block of 64 columns
    file=elementwise.cu
    from="(v_head_dim + 63) / 64);"
    to="v_head_dim / 64);" ;;
  linear_bias_epilogue_dropped)  # the cuBLASLt matmul without its bias epilogue
    file=linear.cc
    from="const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;"
    to="const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;" ;;
  window_start_off_by_one)  # a sliding window one key shorter on its left (issue 32)
    file=online_softmax.h
    from="const int start = aligned - window.left;"
    to="const int start = aligned - window.left + 1;" ;;
  window_end_off_by_one)  # one key fewer after the aligned position (window.right)
    file=online_softmax.h
    from="const int window_limit = aligned + window.right + 1;"
    to="const int window_limit = aligned + window.right;" ;;
  softcap_dropped)  # scores never soft-capped
    file=online_softmax.h
    from="if (softcap != 0.0f) s = softcap * tanhf(s / softcap);"
    to="" ;;
  alibi_first_head_slope)  # every head biased by head 0's ALiBi slope
    file=flash_fwd_generic_kernel.h
    from="p.alibi_slopes[head]"
    to="p.alibi_slopes[0]" ;;
  decode_alibi_group_slope)  # the decode kernel's packed GQA rows given their kv head's slope
    file=flash_decode_kernel.h
    from="p.alibi_slopes[head]"
    to="p.alibi_slopes[kv_head]" ;;
  linear_causality_ignored)  # linear attention's rows read every key, causal or not
    file=linear_attention.cu
    from="KeyLimit(i, p.q_len, p.kv_len, key_length, p.causal)"
    to="KeyLimit(i, p.q_len, p.kv_len, key_length, false)" ;;
  linear_zero_normaliser_divided)  # a row with no key divided by its zero normaliser (NaN)
    file=linear_attention.cu
    from="norm != 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f"
    to="__fdiv_rn(1.0f, norm)" ;;
  linear_kv_head_of_query_head)  # GQA's kv head taken modulo instead of by group
    file=linear_attention.cu
    from="const int kvh = h / (p.num_heads / p.num_kv_heads);"
    to="const int kvh = h % p.num_kv_heads;" ;;
  linear_keys_without_features)  # φ applied to the queries only
    file=linear_attention.cu
    from="f[d] = Feature(p.feature_map, key[d]);"
    to="f[d] = key[d];" ;;
  linear_no_barrier)  # a key's features written while other lanes still read the last ones
    file=linear_attention.cu
    from="      __syncthreads();  // every lane is done reading f and z${nl}"
    to="" ;;
  linear_fused_multiply_add)  # S accumulated with a fused multiply-add: not the CPU's bits
    file=linear_attention.cu
    from="cell = __fadd_rn(cell, __fmul_rn(f[d], value));"
    to="cell = std::fma(f[d], value, cell);" ;;
  linear_device_expf)  # elu + 1 of a query by the C library's expf, not FeatureExp: not the CPU's bits
    file=linear_attention.cu
    from="f[d] = Feature(p.feature_map, query[d]);"
    to="f[d] = p.feature_map == FeatureMap::kEluPlusOne && query[d] <= 0 ? expf(query[d]) : Feature(p.feature_map, query[d]);" ;;
  paged_window_start_off_by_one)  # a session's sliding window one key shorter on its left
    # (the paged kernel takes the dense kernels' KeyStart: the same bug, the paged tests)
    file=online_softmax.h
    from="const int start = aligned - window.left;"
    to="const int start = aligned - window.left + 1;" ;;
  paged_splits_before_the_window_merged)  # kernel 2 merges splits kernel 1 never wrote
    file=paged_attention_kernel.h
    from="const int first = PagedFirstSplit(p, window_left, blk.seq, row_index);"
    to="const int first = 0;" ;;
  paged_alibi_kv_head_slope)  # a GQA group's rows given their kv head's ALiBi slope
    file=paged_attention_kernel.h
    from="p.alibi_slopes[blk.kv_head * group + (blk.row0 + r) % group]"
    to="p.alibi_slopes[blk.kv_head]" ;;
  paged_mods_in_log2_units)  # soft-cap and ALiBi applied to scores already in log2 units
    file=paged_attention_kernel.h
    from="const float q_scale = modify ? p.scale : p.scale * kLog2e;"
    to="const float q_scale = p.scale * kLog2e;" ;;
  tc_window_start_off_by_one)  # the tensor-core kernel's windows one key shorter on their left
    file=flash_fwd_kernel.h
    from="n0 + col - 8 * r - aligned >= -p.window.left"
    to="n0 + col - 8 * r - aligned > -p.window.left" ;;
  tc_first_block_of_last_row)  # key blocks skipped that the block's first rows' windows hold
    file=flash_fwd_kernel.h
    from="FirstKeyBlock(m0, q_len, kv_len, kBlockN, window)"
    to="FirstKeyBlock(row_end - 1, q_len, kv_len, kBlockN, window)" ;;
  tc_window_mask_tile_from_zero)  # the first mask tile copied from key 0, not the window's block
    file=flash_fwd_kernel.h
    from="m0, n0, q_len, kv_len, tid);"
    to="m0, 0, q_len, kv_len, tid);" ;;
  tc_alibi_first_head_slope)  # every head biased by head 0's ALiBi slope
    file=flash_fwd_kernel.h
    from="p.alibi_slopes[head] : 0.0f"
    to="p.alibi_slopes[0] : 0.0f" ;;
  tc_alibi_row_r0_position)  # a thread's second row (r0 + 8) biased from its first row's position
    file=flash_fwd_kernel.h
    from="aligned + 8 * (e / 2)) *"
    to="aligned) *" ;;
  tc_softcap_dropped)  # the tensor-core kernel's scores never soft-capped
    file=flash_fwd_kernel.h
    from="p.softcap, slope, n0 + col"
    to="0.0f, slope, n0 + col" ;;
  *) echo "unknown mutation $name" >&2; exit 2 ;;
esac
FROM="$from" TO="$to" perl -0pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/ or die "mutation text not found\n"' \
  "$out/kernels/cuda/$file"
