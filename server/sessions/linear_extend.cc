// SessionManager::ComputeLinear: an extend of a linear-attention session (attention.proto,
// CreateSessionRequest.kind LINEAR). The session keeps no keys or values: its pages, in a
// float32 layout of its heads, hold each kv head's running state (kernels/linear_state.h),
//
//   z            K row of (page 0, kv head, slot 0)         [D]
//   S row r      V row of (page r / page_size, kv head, r % page_size)   [Dv], r < D
//
// (LinearStatePages pages: the other rows are never written or read). An extend reads the
// state, takes each new token's keys into it and reads its queries against it, in token order,
// exactly as the CPU backend's linear Attend steps its state over a request's keys, and writes
// the new state to the fresh pages its lease reserved (session_lease.cc): the old pages are
// released when the extend commits, and stay as they were when it rolls back.
#include <cstring>
#include <vector>

#include "kernels/linear_state.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

// n elements of `type` at src, widened to float32; rounded to `cache`'s type first when it is
// narrower (keys and values, as a cache rounds them).
void Widen(kernels::DType type, const void* src, int n, kernels::DType cache, float* dst,
           std::vector<uint8_t>* tmp) {
  kernels::ToFloat32(type, src, static_cast<size_t>(n), dst);
  if (cache == kernels::DType::kFloat32 || cache == type) return;
  tmp->resize(static_cast<size_t>(n) * kernels::DTypeSize(cache));
  kernels::FromFloat32(cache, dst, static_cast<size_t>(n), tmp->data());
  kernels::ToFloat32(cache, tmp->data(), static_cast<size_t>(n), dst);
}

}  // namespace

void SessionManager::ComputeLinear(ExtendItem& item, const float* projected,
                                   kernels::Backend& backend) {
  const Session& s = *item.lease.session_;
  const kernels::PageLayout& l = s.arena->layout();
  kernels::PageStore& store = *s.arena->store();
  const int hkv = l.num_kv_heads, d = l.head_dim, dv = l.v_head_dim, hq = s.num_heads;
  const int group = hq / hkv;
  const int64_t state_s = int64_t{d} * dv;  // elements of one head's S
  const auto failed = [&](const absl::Status& st) {
    item.status = StoreFailure(st, store, backend, s.id);
  };
  if (item.return_lse) {  // the request builder refuses it; never computed without scores
    item.status = absl::InvalidArgumentError(
        "return_lse does not apply to a linear-attention session (it has no scores)");
    return;
  }

  // The state before this extend (zeros before the first).
  std::vector<float> S(static_cast<size_t>(hkv * state_s), 0.0f),
      z(static_cast<size_t>(hkv) * d, 0.0f);
  if (!s.pages.empty()) {
    std::vector<float> k_page, v_page;
    const float* k_base = nullptr;
    const float* v_base = nullptr;
    for (size_t i = 0; i < s.pages.size(); ++i) {
      const int64_t page = s.pages[i];
      int64_t first = 0;  // the element offsets below are relative to this page's first
      if (store.on_device()) {
        k_page.resize(static_cast<size_t>(l.k_page_stride()));
        v_page.resize(static_cast<size_t>(l.v_page_stride()));
        if (absl::Status st = store.ReadPage(s.pages[i], k_page.data(), v_page.data()); !st.ok()) {
          return failed(st);
        }
        k_base = k_page.data();
        v_base = v_page.data();
      } else {  // host memory: read in place
        k_base = static_cast<const float*>(store.k_base());
        v_base = static_cast<const float*>(store.v_base());
        first = page;
      }
      for (int h = 0; h < hkv; ++h) {
        if (i == 0) {
          std::memcpy(z.data() + int64_t{h} * d, k_base + l.k_offset(first, h, 0),
                      sizeof(float) * d);
        }
        for (int slot = 0; slot < l.page_size; ++slot) {
          const int64_t r = static_cast<int64_t>(i) * l.page_size + slot;
          if (r >= d) break;
          std::memcpy(S.data() + h * state_s + r * dv, v_base + l.v_offset(first, h, slot),
                      sizeof(float) * dv);
        }
      }
    }
  }

  // The new tokens, in order: each token's keys into the state, then its queries against it.
  const bool module = item.module != nullptr;
  const kernels::DType src = module ? kernels::DType::kFloat32 : item.wire_dtype;
  const size_t esize = kernels::DTypeSize(src);
  const int64_t q_row = int64_t{hq} * d, k_row = int64_t{hkv} * d, v_row = int64_t{hkv} * dv;
  const char* q = static_cast<const char*>(module ? static_cast<const void*>(projected) : item.q);
  const char* k =
      module ? reinterpret_cast<const char*>(projected + q_row) : static_cast<const char*>(item.k);
  const char* v = module ? reinterpret_cast<const char*>(projected + q_row + k_row)
                         : static_cast<const char*>(item.v);
  const int64_t q_ld = module ? q_row + k_row + v_row : q_row;  // elements between tokens
  const int64_t k_ld = module ? q_ld : k_row;
  const int64_t v_ld = module ? q_ld : v_row;
  const int64_t L = item.new_tokens;
  item.attention.resize(static_cast<size_t>(L * hq * dv));
  std::vector<float> feature(d), value(dv);
  std::vector<uint8_t> tmp;
  for (int64_t t = 0; t < L; ++t) {
    for (int h = 0; h < hkv; ++h) {
      Widen(src, k + (t * k_ld + int64_t{h} * d) * esize, d, s.cache_dtype, feature.data(), &tmp);
      kernels::ApplyFeatureMap(s.feature_map, feature.data(), d);
      Widen(src, v + (t * v_ld + int64_t{h} * dv) * esize, dv, s.cache_dtype, value.data(), &tmp);
      kernels::LinearAddKey(feature.data(), value.data(), d, dv, S.data() + h * state_s,
                            z.data() + int64_t{h} * d);
    }
    for (int h = 0; h < hq; ++h) {
      kernels::ToFloat32(src, q + (t * q_ld + int64_t{h} * d) * esize, static_cast<size_t>(d),
                         feature.data());
      kernels::ApplyFeatureMap(s.feature_map, feature.data(), d);
      const int kv = h / group;
      kernels::LinearReadQuery(feature.data(), S.data() + kv * state_s, z.data() + int64_t{kv} * d,
                               d, dv, item.attention.data() + (t * hq + h) * dv);
    }
  }

  // The new state into the fresh pages: D rows a kv head (K holds z in row 0, zeros elsewhere).
  const std::vector<int32_t>& table = item.lease.pages_.table;
  const int64_t rows = int64_t{hkv} * d;
  std::vector<float> k_rows(static_cast<size_t>(rows * d), 0.0f);
  std::vector<float> v_rows(static_cast<size_t>(rows * dv));
  std::vector<int64_t> dst(static_cast<size_t>(rows));
  for (int h = 0; h < hkv; ++h) {
    std::memcpy(k_rows.data() + int64_t{h} * d * d, z.data() + int64_t{h} * d, sizeof(float) * d);
    std::memcpy(v_rows.data() + h * state_s, S.data() + h * state_s, sizeof(float) * state_s);
    for (int r = 0; r < d; ++r) {
      dst[int64_t{h} * d + r] = l.row(table[r / l.page_size], h, r % l.page_size);
    }
  }
  if (absl::Status st = store.WriteRows(k_rows.data(), v_rows.data(), dst); !st.ok()) {
    return failed(st);
  }
  item.written = true;
  item.done_rows = L;
}

}  // namespace attnserve::server::sessions
