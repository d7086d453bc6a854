// SessionManager::Compute, the extend runner: per item at its first chunk the projections of
// module sessions (Backend::Project), the queries as sent and the new keys and values into the
// pages; then one PagedAttention call per (layout, heads, scale, query dtype, score mods) for
// each item's next chunk; W_o for module items that are complete. Linear-attention items are
// computed whole after the projections (linear_extend.cc).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/paged_attention_params.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

// Converts `n` elements from `from` to `to` (both float types).
void Convert(kernels::DType from, const void* src, kernels::DType to, void* dst, int64_t n,
             std::vector<float>* tmp) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * kernels::DTypeSize(to));
    return;
  }
  tmp->resize(static_cast<size_t>(n));
  kernels::ToFloat32(from, src, static_cast<size_t>(n), tmp->data());
  kernels::FromFloat32(to, tmp->data(), static_cast<size_t>(n), dst);
}

// Converts `rows` rows of `cols` elements, `src_ld` elements apart in src (0: contiguous), to
// contiguous rows of `to` in dst.
void ConvertRows(kernels::DType from, const void* src, int64_t src_ld, kernels::DType to, void* dst,
                 int64_t rows, int64_t cols, std::vector<float>* tmp) {
  if (src_ld == 0 || src_ld == cols) return Convert(from, src, to, dst, rows * cols, tmp);
  const size_t in = kernels::DTypeSize(from), out = kernels::DTypeSize(to);
  for (int64_t r = 0; r < rows; ++r) {
    Convert(from, static_cast<const char*>(src) + r * src_ld * in, to,
            static_cast<char*>(dst) + r * cols * out, cols, tmp);
  }
}

}  // namespace

absl::Status BackendFailure(const kernels::Backend& backend, const absl::Status& status) {
  return absl::InternalError(
      absl::StrCat("backend ", backend.name(), " failed: ", status.message()));
}

absl::Status StoreFailure(const absl::Status& status, const kernels::PageStore& store,
                          const kernels::Backend& backend, const std::string& id) {
  if (store.lost()) return SessionManager::Lost(kDeviceReset, id);
  return BackendFailure(backend, status);
}

void SessionManager::Compute(absl::Span<ExtendItem* const> items, kernels::Backend* backend) {
  const absl::Time start = absl::Now();
  int64_t page_tokens;
  {
    MutexLock lock(&mu_);
    page_tokens = pool_->page_tokens();
    ExpireLocked();  // expired sessions free their pages before anything is evicted
    DropLostLocked();
    for (ExtendItem* item : items) {
      const Session& s = *item->lease.session_;
      if (item->status.ok() && s.arena->store()->lost()) item->status = Lost(kDeviceReset, s.id);
      if (item->status.ok() && !item->written) item->status = ReserveLocked(*item);
    }
  }

  // Module items at their first chunk: Q, K and V projected by the backend, one GEMM per item
  // (W_q, W_k, W_v stacked: row t of projected[i] is token t's Q, K, V), all items in one call.
  std::vector<Buffer<float>> projected(items.size());
  {
    std::vector<kernels::ProjectionParams> batch;
    std::vector<size_t> which;
    for (size_t i = 0; i < items.size(); ++i) {
      ExtendItem& item = *items[i];
      if (!item.status.ok() || item.written || item.module == nullptr) continue;
      projected[i].resize(static_cast<size_t>(item.new_tokens) * 3 * item.module->d_model);
      batch.push_back({.module = item.module.get(),
                       .weights = kernels::ProjectionParams::Weights::kQkv,
                       .x = item.input,
                       .x_type = item.wire_dtype,
                       .rows = item.new_tokens,
                       .y = projected[i].data(),
                       .request_dtype = item.wire_dtype});
      which.push_back(i);
    }
    if (!batch.empty()) {
      if (absl::Status st = backend->Project(batch); !st.ok()) {
        for (size_t i : which) items[i]->status = BackendFailure(*backend, st);
      }
    }
  }

  // Linear-attention items: the whole extend at once (its cost is O(L·D·Dv) whatever the
  // session's length), their state into fresh pages (linear_extend.cc).
  std::vector<ExtendItem*> finished_modules;
  for (size_t i = 0; i < items.size(); ++i) {
    ExtendItem& item = *items[i];
    if (!item.status.ok() || item.written || item.kind != kernels::AttentionKind::kLinear) continue;
    ComputeLinear(item, projected[i].data(), *backend);
    Buffer<float>().swap(projected[i]);
    if (!item.status.ok()) continue;
    if (item.module != nullptr) {
      finished_modules.push_back(&item);  // W_o below, with the softmax ones
      continue;
    }
    item.out = std::move(item.attention);
    item.length_after = item.lease.session_->length + item.new_tokens;
    item.lease.computed_ = true;
  }

  // Per item, at its first chunk: the queries as sent (kept for the later chunks: in the cache
  // dtype when they are exactly in it, else in float32; only K and V are rounded to the cache's
  // type, as the proto says), and the new K and V written into its pages. The pages written are the
  // item's own (fresh, or a last page no other session holds).
  std::vector<float> tmp;
  for (size_t i = 0; i < items.size(); ++i) {
    ExtendItem& item = *items[i];
    if (!item.status.ok() || item.written) continue;
    item.written = true;
    Lease& lease = item.lease;
    const Session& s = *lease.session_;
    const Arena& arena = *s.arena;
    const PageLayout& l = arena.layout();
    const kernels::DType cache = l.dtype;
    const size_t esize = kernels::DTypeSize(cache);
    const int64_t L = item.new_tokens;
    kernels::PageStore& store = *arena.store();
    for (const PageReservation::Copy& c : lease.pages_.copies) {  // copy-on-write first
      item.status = store.CopyPage(c.from, c.to);
      if (!item.status.ok()) break;
    }
    if (!item.status.ok()) {
      item.status = StoreFailure(item.status, store, *backend, s.id);
      continue;
    }
    // Sources of q, k, v rows: the request's bytes (raw: [L, H, D] each, token t's rows
    // contiguous) or the projections (module: token t's Q, K and V side by side).
    const kernels::DType src_type =
        item.module != nullptr ? kernels::DType::kFloat32 : item.wire_dtype;
    const int64_t q_row = int64_t{s.num_heads} * l.head_dim;     // elements per token
    const int64_t k_row = int64_t{l.num_kv_heads} * l.head_dim;  // (module: all d_model)
    const int64_t v_row = int64_t{l.num_kv_heads} * l.v_head_dim;
    const float* y = projected[i].data();
    const void* q = item.module != nullptr ? y : item.q;
    const void* k = item.module != nullptr ? y + q_row : item.k;
    const void* v = item.module != nullptr ? y + q_row + k_row : item.v;
    const int64_t src_ld = item.module != nullptr ? q_row + k_row + v_row : 0;  // 0: contiguous
    item.q_dtype = src_type == cache ? cache : kernels::DType::kFloat32;
    item.queries.resize(static_cast<size_t>(L * q_row) * kernels::DTypeSize(item.q_dtype));
    ConvertRows(src_type, q, src_ld, item.q_dtype, item.queries.data(), L, q_row, &tmp);
    // Every row written by its chunk before it is read (Buffer: not zeroed first).
    item.attention.resize(static_cast<size_t>(L) * s.num_heads * l.v_head_dim);
    item.lse.resize(item.return_lse ? static_cast<size_t>(L) * s.num_heads : 0);
    // The new K and V in the cache dtype, row t * Hkv + h of the request going to the row of
    // (its page, h, its slot) in the store: one WriteRows per item (one copy to a device).
    const int64_t rows = L * l.num_kv_heads;
    Buffer<uint8_t> k_rows(static_cast<size_t>(L * k_row) * esize);
    Buffer<uint8_t> v_rows(static_cast<size_t>(L * v_row) * esize);
    ConvertRows(src_type, k, src_ld, cache, k_rows.data(), L, k_row, &tmp);
    ConvertRows(src_type, v, src_ld, cache, v_rows.data(), L, v_row, &tmp);
    Buffer<float>().swap(projected[i]);
    std::vector<int64_t> dst(static_cast<size_t>(rows));
    for (int64_t t = 0; t < L; ++t) {
      const int64_t pos = s.length + t;
      const int32_t page = lease.pages_.table[pos / page_tokens];
      const int slot = static_cast<int>(pos % page_tokens);
      for (int h = 0; h < l.num_kv_heads; ++h) {
        dst[t * l.num_kv_heads + h] = store.shape().row(page, h, slot);
      }
    }
    item.status = store.WriteRows(k_rows.data(), v_rows.data(), dst);
    if (!item.status.ok()) item.status = StoreFailure(item.status, store, *backend, s.id);
  }

  // One PagedAttention call per (layout, query heads, scale, query dtype, score modifications):
  // the sequences of a call share them. Every row's bits depend on its own sequence alone
  // (paged_attention_params.h). An item computes its next chunk: rows [done_rows, done_rows + rows)
  // of its new tokens, attending to the cache up to its last row (chunk boundaries depend on the
  // item alone).
  std::map<std::tuple<const Arena*, int, uint32_t, kernels::DType, std::string>,
           std::vector<size_t>>
      groups;
  std::vector<int64_t> rows_now(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const ExtendItem& item = *items[i];
    if (!item.status.ok() || item.done_rows >= item.new_tokens) continue;
    rows_now[i] = std::min(item.new_tokens - item.done_rows, options_.prefill_chunk_tokens);
    const Session& s = *item.lease.session_;
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
    groups[{s.arena, s.num_heads, scale_bits, item.q_dtype, s.mods.Key()}].push_back(i);
  }
  for (const auto& [key, members] : groups) {
    const Session& first = *items[members.front()]->lease.session_;
    const Arena& arena = *first.arena;
    const PageLayout& l = arena.layout();
    const kernels::DType q_dtype = std::get<3>(key);
    const size_t q_esize = kernels::DTypeSize(q_dtype);
    kernels::PagedAttentionParams p;
    p.num_seqs = static_cast<int>(members.size());
    p.num_heads = first.num_heads;
    p.set_layout(l);
    p.q_dtype = q_dtype;
    p.store = arena.store();
    p.k_pages = arena.store()->k_base();
    p.v_pages = arena.store()->v_base();
    p.scale = first.scale;
    first.mods.ApplyTo(p);  // the group's (equal keys)
    int max_pages = 1;
    int64_t total_q = 0;
    for (size_t i : members) {
      max_pages = std::max(max_pages, static_cast<int>(items[i]->lease.pages_.table.size()));
      total_q += rows_now[i];
    }
    p.max_pages_per_seq = max_pages;
    std::vector<int32_t> table(static_cast<size_t>(p.num_seqs) * max_pages, 0);
    std::vector<int32_t> kv_lens, q_lens, q_offsets;
    const int64_t q_row_bytes = int64_t{p.num_heads} * p.head_dim * static_cast<int64_t>(q_esize);
    const int64_t out_row = int64_t{p.num_heads} * p.v_head_dim;
    int64_t offset = 0;
    for (size_t j = 0; j < members.size(); ++j) {
      const ExtendItem& item = *items[members[j]];
      const std::vector<int32_t>& t = item.lease.pages_.table;
      std::copy(t.begin(), t.end(), table.begin() + static_cast<int64_t>(j) * max_pages);
      const int64_t rows = rows_now[members[j]];
      kv_lens.push_back(static_cast<int32_t>(item.lease.session_->length + item.done_rows + rows));
      q_lens.push_back(static_cast<int32_t>(rows));
      q_offsets.push_back(static_cast<int32_t>(offset));
      offset += rows;
    }
    // One sequence (a lone prefill, say) reads its queries and writes its rows in place; several
    // are gathered into one array of each.
    Buffer<uint8_t> q;
    Buffer<float> out, lse;
    ExtendItem& lone = *items[members.front()];
    const bool in_place = members.size() == 1 && lone.return_lse;
    if (members.size() == 1) {
      p.q = lone.queries.data() + lone.done_rows * q_row_bytes;
      p.out = lone.attention.data() + lone.done_rows * out_row;
    } else {
      q.resize(static_cast<size_t>(total_q * q_row_bytes));
      for (size_t j = 0; j < members.size(); ++j) {
        const ExtendItem& item = *items[members[j]];
        std::memcpy(q.data() + int64_t{q_offsets[j]} * q_row_bytes,
                    item.queries.data() + item.done_rows * q_row_bytes,
                    static_cast<size_t>(q_lens[j] * q_row_bytes));
      }
      out.resize(static_cast<size_t>(total_q * out_row));
      p.q = q.data();
      p.out = out.data();
    }
    if (in_place) {
      p.lse = lone.lse.data() + lone.done_rows * p.num_heads;
    } else {
      lse.resize(static_cast<size_t>(total_q) * p.num_heads);
      p.lse = lse.data();
    }
    p.page_table = table.data();
    p.kv_lens = kv_lens.data();
    p.q_lens = q_lens.data();
    p.q_offsets = q_offsets.data();
    p.total_q = static_cast<int>(total_q);
    absl::Status status = backend->PagedAttention(p);
    for (size_t j = 0; j < members.size(); ++j) {
      ExtendItem& item = *items[members[j]];
      if (!status.ok()) {
        item.status = BackendFailure(*backend, status);
        continue;
      }
      const int64_t L = item.new_tokens;
      const int64_t rows = rows_now[members[j]];
      if (members.size() > 1) {
        const float* o = out.data() + int64_t{q_offsets[j]} * out_row;
        std::copy(o, o + rows * out_row, item.attention.begin() + item.done_rows * out_row);
      }
      if (item.return_lse && !in_place) {
        const float* e = lse.data() + int64_t{q_offsets[j]} * p.num_heads;
        std::copy(e, e + rows * p.num_heads, item.lse.begin() + item.done_rows * p.num_heads);
      }
      item.done_rows += rows;
      if (item.done_rows < L) continue;  // more chunks to come
      Buffer<uint8_t>().swap(item.queries);
      if (item.module != nullptr) {
        finished_modules.push_back(&item);  // W_o below, for all of them at once
        continue;
      }
      item.out = std::move(item.attention);
      item.length_after = item.lease.session_->length + L;
      item.lease.computed_ = true;
    }
  }
  // Module items whose attention is complete: the output projection (W_o), one backend call.
  if (!finished_modules.empty()) {
    std::vector<kernels::ProjectionParams> batch;
    for (ExtendItem* item : finished_modules) {
      item->out.resize(static_cast<size_t>(item->new_tokens) * item->module->d_model);
      batch.push_back({.module = item->module.get(),
                       .weights = kernels::ProjectionParams::Weights::kOut,
                       .x = item->attention.data(),
                       .x_type = kernels::DType::kFloat32,
                       .rows = item->new_tokens,
                       .y = item->out.data(),
                       .request_dtype = item->wire_dtype});
    }
    const absl::Status status = backend->Project(batch);
    for (ExtendItem* item : finished_modules) {
      Buffer<float>().swap(item->attention);
      if (!status.ok()) {
        item->status = BackendFailure(*backend, status);
        continue;
      }
      item->length_after = item->lease.session_->length + item->new_tokens;
      item->lease.computed_ = true;
    }
  }
  if (metrics_ != nullptr) {
    const absl::Duration elapsed = absl::Now() - start;
    for (ExtendItem* item : items) {
      if (item->status.ok() && item->lease.computed_) {
        metrics_->ObserveSessionExtend(item->new_tokens == 1 ? "decode" : "prefill", elapsed);
      }
    }
  }
}

}  // namespace attnserve::server::sessions
