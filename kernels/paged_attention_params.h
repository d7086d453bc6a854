// The parameters of attention over a paged KV cache (decode sessions), shared by every backend
// (reference, CPU, CUDA) and by the server's session pool, which owns the pages.
//
// The pool. K and V live in two arrays of fixed-size pages, in the cache's element type `dtype`
// (FLOAT32, FLOAT16 or BFLOAT16), laid out as the params' PageLayout says (page_layout.h: HND
// within a page; k_offset and v_offset give a token's row).
//
// The sequences. Sequence s has `kv_lens[s]` keys in its cache (the new tokens' K and V already
// appended) at positions 0..kv_lens[s]-1; position p lives in page
// `page_table[s * max_pages_per_seq + p / page_size]`, slot `p % page_size`. Its queries are its
// newest `q_lens[s]` tokens (q_lens[s] <= kv_lens[s]), packed with those of the other sequences:
// query row r of sequence s is row `q_offsets[s] + r` of q [total_q, num_heads, head_dim] and of
// out [total_q, num_heads, v_head_dim] (both contiguous), and it is the token at position
// kv_lens[s] - q_lens[s] + r. Attention is causal, bottom-right aligned as AttentionParams'
// `causal` is: query row r attends to positions 0..kv_lens[s] - q_lens[s] + r.
//
//   s[t, h, j]   = scale * dot(q[t, h, :], K_s[j, h / group, :])
//   out[t, h, :] = sum_j softmax_j(s[t, h, j]) * V_s[j, h / group, :]
//   lse[t, h]    = log(sum_j exp(s[t, h, j]))   (natural log)
//
// with group = num_heads / num_kv_heads. `lse` lets callers merge partial attentions (over
// disjoint key sets A and B: out = (e^lseA outA + e^lseB outB) / (e^lseA + e^lseB)).
//
// Batch invariance. A row's bits must not depend on the other sequences of the batch: kernels
// that split the keys of a sequence do so at fixed multiples of a constant number of keys
// (kPagedSplitKeys), never at a count derived from the batch, and combine the splits in a fixed
// order.
//
// The NaN rule of attention_params.h applies. Every row has at least one allowed key here; a row
// whose allowed scores are all -Inf (rule 2) attends uniformly to all kv_lens[s] keys of its
// sequence, as the same row of a dense causal Attend does (with a window: to the keys of its
// window, the only ones a session still holds), and its lse is -Inf.
#ifndef ATTNSERVE_KERNELS_PAGED_ATTENTION_PARAMS_H_
#define ATTNSERVE_KERNELS_PAGED_ATTENTION_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/page_layout.h"
#include "kernels/page_store.h"

namespace attnserve::kernels {

// Keys per split of a sequence, for kernels that split (a constant: see batch invariance above).
inline constexpr int kPagedSplitKeys = 256;

// What every backend's kernels read. Flat, as FlashAttention's params are (the CUDA kernels
// take exactly this struct by value; their register budget is tight enough that the order of
// these fields matters to ptxas, and a field added here made the combine kernel spill, which
// the build refuses): the pages' geometry is num_kv_heads, head_dim, v_head_dim, page_size and
// dtype, and layout() is its PageLayout, which alone defines the offsets.
struct PagedKernelParams {
  // Dimensions. REQUIRES: all >= 1, num_heads % num_kv_heads == 0.
  int num_seqs = 0;
  int num_heads = 0;     // query heads (Hq)
  int num_kv_heads = 0;  // key/value heads (Hkv)
  int head_dim = 0;      // D, of q and k
  int v_head_dim = 0;    // Dv, of v and out
  int page_size = 0;     // tokens per page
  int max_pages_per_seq = 0;

  // The cache: element type of k_pages and v_pages.
  DType dtype = DType::kFloat32;
  // The element type of q: FLOAT32, or `dtype`. Only keys and values are rounded to the cache's
  // type; queries are not (a caller's float32 queries stay float32 over a 16-bit cache, and the
  // scores accumulate in float32 either way). q in `dtype` is for queries already exactly in it
  // (a 16-bit request on a cache of its own type), where a kernel may take a 16-bit dot product.
  DType q_dtype = DType::kFloat32;
  const void* k_pages = nullptr;
  const void* v_pages = nullptr;
  // The store k_pages and v_pages belong to (its k_base(), v_base()), or nullptr for host
  // memory of the caller's. A device store's pages are device addresses: only the backend that
  // made it computes on them (Backend::PagedAttention).
  const PageStore* store = nullptr;

  // Per sequence (num_seqs entries each; page_table has num_seqs * max_pages_per_seq).
  const int32_t* page_table = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* q_lens = nullptr;
  const int32_t* q_offsets = nullptr;
  int total_q = 0;  // sum of q_lens

  // q [total_q, num_heads, head_dim] in `q_dtype`; outputs in float32.
  const void* q = nullptr;
  float* out = nullptr;  // [total_q, num_heads, v_head_dim]
  float* lse = nullptr;  // [total_q, num_heads], or nullptr when not wanted

  float scale = 1.0f;  // usually 1 / sqrt(head_dim)

  ATTNSERVE_LAYOUT_HD PageLayout layout() const {
    return {num_kv_heads, head_dim, v_head_dim, page_size, dtype};
  }
  void set_layout(const PageLayout& l) {
    num_kv_heads = l.num_kv_heads;
    head_dim = l.head_dim;
    v_head_dim = l.v_head_dim;
    page_size = l.page_size;
    dtype = l.dtype;
  }
  // Element offset of (page, kv head, slot) in k_pages / v_pages (PageLayout's).
  ATTNSERVE_LAYOUT_HD int64_t k_offset(int32_t page, int kv_head, int slot) const {
    return layout().k_offset(page, kv_head, slot);
  }
  ATTNSERVE_LAYOUT_HD int64_t v_offset(int32_t page, int kv_head, int slot) const {
    return layout().v_offset(page, kv_head, slot);
  }
  int64_t k_page_stride() const { return layout().k_page_stride(); }
  int64_t v_page_stride() const { return layout().v_page_stride(); }
};

// A call: the kernels' params and the score modifications (ScoreMods, attention_params.h), as
// Attend applies them to a causal row at its position pos = kv_lens[s] - q_lens[s] + r: the
// score of key j is soft-capped (softcap · tanh(s / softcap); 0: none), then lowered by ALiBi's
// alibi_slopes[h] · (pos - j) (nullptr: none; host memory, num_heads entries), and keys before
// pos - window_left are blocked (-1: no window; the right side is the causal limit). Every row
// keeps its own key. The reference and CPU backends take them; backends that do not say so
// (Backend::supports_session_score_mods).
struct PagedAttentionParams : PagedKernelParams {
  int window_left = -1;
  float softcap = 0.0f;
  const float* alibi_slopes = nullptr;
  bool modifies_scores() const {
    return window_left >= 0 || softcap != 0.0f || alibi_slopes != nullptr;
  }
};

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_PAGED_ATTENTION_PARAMS_H_
