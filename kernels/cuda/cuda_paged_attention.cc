// CudaBackend::PagedAttention: attention over session pages, on the device or staged from
// host memory.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::cuda {

absl::Status CudaBackend::PagedAttention(const PagedAttentionParams& p) {
  const bool device_pages = p.store != nullptr && p.store->on_device();
  if (device_pages) {
    if (!IsDeviceStoreOf(*p.store, this)) {
      return absl::InvalidArgumentError(
          "cuda backend: the pages are in a device store of another backend");
    }
    // NewPageStore makes device stores only for layouts the kernels take; a call whose query
    // heads they do not take (Hq not a multiple of Hkv) must not reach the host reference.
    if (!PagedAttentionSupported(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda backend: paged attention with ", p.num_heads, " query heads over ",
                       p.num_kv_heads, " kv heads is not supported on device pages"));
    }
  } else if (!PagedAttentionSupported(p)) {
    return Backend::PagedAttention(p);  // the reference
  }
  if (p.num_seqs == 0 || p.total_q == 0) return absl::OkStatus();
  return OnWorker([&](Worker* w) {
    // Checked while holding a worker: no reset can happen until it is released. (Not a fault:
    // MarkFaulted passes it through.)
    if (device_pages && p.store->lost()) return LostPagesError();
    return RunPagedAttention(w, p);
  });
}

absl::Status CudaBackend::RunPagedAttention(Worker* w, const PagedAttentionParams& p) {
  const int S = p.num_seqs;
  int max_q = 0, max_kv = 0, max_pages = 1;
  for (int s = 0; s < S; ++s) {
    max_q = std::max(max_q, p.q_lens[s]);
    max_kv = std::max(max_kv, p.kv_lens[s]);
    max_pages = std::max(max_pages, (p.kv_lens[s] + p.page_size - 1) / p.page_size);
  }
  // The page table's rows cut to the pages the sequences use (max_pages). Device pages are
  // read where they are, under the caller's page numbers. Host pages: the pages the batch uses
  // are staged, renumbered 0..used-1 in order of first use (a page shared by forked sequences
  // is staged once), and the page table rewritten to those numbers.
  const bool device_pages = p.store != nullptr && p.store->on_device();
  std::vector<int32_t> used;  // staged page i is pool page used[i]
  std::vector<int32_t> table(size_t(S) * max_pages, 0);
  if (device_pages) {
    for (int s = 0; s < S; ++s) {
      const int pages = (p.kv_lens[s] + p.page_size - 1) / p.page_size;
      std::copy_n(p.page_table + int64_t{s} * p.max_pages_per_seq, pages,
                  table.begin() + size_t(s) * max_pages);
    }
  } else {
    std::unordered_map<int32_t, int32_t> staged;
    for (int s = 0; s < S; ++s) {
      const int pages = (p.kv_lens[s] + p.page_size - 1) / p.page_size;
      for (int i = 0; i < pages; ++i) {
        const int32_t page = p.page_table[int64_t{s} * p.max_pages_per_seq + i];
        auto [it, added] = staged.emplace(page, static_cast<int32_t>(used.size()));
        if (added) used.push_back(page);
        table[size_t(s) * max_pages + i] = it->second;
      }
    }
  }
  const size_t esize = DTypeSize(p.dtype);
  const size_t k_page_bytes = static_cast<size_t>(p.k_page_stride()) * esize;
  const size_t v_page_bytes = static_cast<size_t>(p.v_page_stride()) * esize;
  const size_t q_bytes = size_t(p.total_q) * p.num_heads * p.head_dim * DTypeSize(p.q_dtype);
  const size_t out_bytes = size_t(p.total_q) * p.num_heads * p.v_head_dim * sizeof(float);
  const size_t lse_bytes = size_t(p.total_q) * p.num_heads * sizeof(float);
  const size_t table_bytes = (table.size() + 3 * size_t(S)) * sizeof(int32_t);

  // One layout serves the pinned staging and the device buffer (same offsets); the device one
  // adds the kernel's workspace.
  Layout lay;
  const size_t o_k = lay.Add(used.size() * k_page_bytes);
  const size_t o_v = lay.Add(used.size() * v_page_bytes);
  const size_t o_q = lay.Add(q_bytes);
  const size_t o_tables = lay.Add(table_bytes);
  const size_t o_slopes = lay.Add(p.alibi_slopes != nullptr ? p.num_heads * sizeof(float) : 0);
  const size_t o_out = lay.Add(out_bytes);
  const size_t o_lse = lay.Add(p.lse != nullptr ? lse_bytes : 0);
  const size_t staged_bytes = lay.size();
  absl::Status st = ReservePinned(w, staged_bytes);
  if (!st.ok()) return st;
  PagedAttentionParams dp = p;
  dp.max_pages_per_seq = max_pages;
  const size_t o_ws = lay.Add(PagedAttentionWorkspaceBytes(dp, max_kv));
  st = ReserveDevice(w, lay.size());
  if (!st.ok()) return st;

  char* host = w->pinned;
  const char* k_src = static_cast<const char*>(p.k_pages);
  const char* v_src = static_cast<const char*>(p.v_pages);
  for (size_t i = 0; i < used.size(); ++i) {
    std::memcpy(host + o_k + i * k_page_bytes, k_src + used[i] * k_page_bytes, k_page_bytes);
    std::memcpy(host + o_v + i * v_page_bytes, v_src + used[i] * v_page_bytes, v_page_bytes);
  }
  std::memcpy(host + o_q, p.q, q_bytes);
  int32_t* tables = At<int32_t>(host, o_tables);
  std::copy(table.begin(), table.end(), tables);
  std::copy(p.kv_lens, p.kv_lens + S, tables + table.size());
  std::copy(p.q_lens, p.q_lens + S, tables + table.size() + S);
  std::copy(p.q_offsets, p.q_offsets + S, tables + table.size() + 2 * S);
  if (p.alibi_slopes != nullptr) {
    std::copy_n(p.alibi_slopes, p.num_heads, At<float>(host, o_slopes));
  }

  char* dev = w->device;
  cudaStream_t stream = w->stream;
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(dev, host, o_out, cudaMemcpyHostToDevice, stream),
                                "copying pages"));
  dp.k_pages = device_pages ? p.store->k_base() : dev + o_k;
  dp.v_pages = device_pages ? p.store->v_base() : dev + o_v;
  dp.q = dev + o_q;
  dp.page_table = At<int32_t>(dev, o_tables);
  dp.kv_lens = dp.page_table + table.size();
  dp.q_lens = dp.kv_lens + S;
  dp.q_offsets = dp.q_lens + S;
  dp.out = At<float>(dev, o_out);
  dp.lse = p.lse != nullptr ? At<float>(dev, o_lse) : nullptr;
  dp.alibi_slopes = p.alibi_slopes != nullptr ? At<float>(dev, o_slopes) : nullptr;
  RETURN_IF_GPU_ERROR(PagedAttentionForward(dp, max_q, max_kv, dev + o_ws, stream));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(host + o_out, dev + o_out, staged_bytes - o_out,
                                                cudaMemcpyDeviceToHost, stream),
                                "copying the output back"));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "paged attention"));
  std::memcpy(p.out, host + o_out, out_bytes);
  if (p.lse != nullptr) std::memcpy(p.lse, host + o_lse, lse_bytes);
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cuda
