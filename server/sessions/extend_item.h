// One extend of a decode session as the server carries it (SessionManager::BeginExtend,
// Compute; server/sessions/session_manager.h): its lease on the session, the pages it reserved,
// its inputs and its results.
#ifndef ATTNSERVE_SERVER_SESSIONS_EXTEND_ITEM_H_
#define ATTNSERVE_SERVER_SESSIONS_EXTEND_ITEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/buffer.h"
#include "kernels/attention_params.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::server::sessions {

struct Session;        // session_table.h
class SessionManager;  // session_manager.h

// One extend's pages, reserved over the pool as a transaction (SessionManager::ReserveLocked;
// committed or rolled back when its lease ends): the session's page table (block table) after
// the extend, the pages allocated for it, and the copy-on-write pairs, each a page the session
// shares with another (the source) and the private copy that replaces it in `table` (the
// destination), copied before the extend writes into it.
struct PageReservation {
  struct Copy {
    int32_t from, to;
  };
  std::vector<int32_t> table;  // token t in table[t / page_tokens]
  std::vector<int32_t> fresh;  // allocated for the extend: freed on rollback
  std::vector<Copy> copies;    // on commit each `from` loses this session's reference
};

// The right to extend one session, from BeginExtend until End. Move-only.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept { *this = std::move(other); }
  Lease& operator=(Lease&& other) noexcept;
  ~Lease() { End(false); }

  // Commits the computed tokens (`keep` and the computation succeeded) or rolls back, and frees
  // the session for its next extend. Idempotent.
  void End(bool keep);
  bool active() const { return manager_ != nullptr; }

 private:
  friend class SessionManager;
  SessionManager* manager_ = nullptr;
  std::shared_ptr<Session> session_;
  // What Compute reserved (reserved_): the extend's pages.
  int64_t new_tokens_ = 0;
  bool reserved_ = false, computed_ = false;
  PageReservation pages_;
};

// One extend: inputs (views of the request's bytes, in the wire dtype) and results.
struct ExtendItem {
  Lease lease;
  int64_t new_tokens = 0;  // L
  kernels::DType wire_dtype = kernels::DType::kFloat32;
  const void* input = nullptr;  // module: [L, d_model]
  const void* q = nullptr;      // raw: [L, Hq, D]
  const void* k = nullptr;      // raw: [L, Hkv, D]
  const void* v = nullptr;      // raw: [L, Hkv, Dv]
  bool return_lse = false;

  // Results of Compute.
  absl::Status status;
  Buffer<float> out;  // module: [L, d_model]; raw: [L, Hq, Dv]
  Buffer<float> lse;  // [L, Hq] when return_lse
  int64_t length_after = 0;

  // Progress of a prefill computed in chunks (SessionOptions::prefill_chunk_tokens).
  bool written = false;   // pages reserved, K and V cached, queries converted
  int64_t done_rows = 0;  // new tokens whose attention is computed
  // [L, Hq, D] in q_dtype: the cache dtype when the request's queries are exactly in it (a
  // 16-bit request on a cache of its type), else float32. Never rounded to the cache's type.
  Buffer<uint8_t> queries;
  kernels::DType q_dtype = kernels::DType::kFloat32;
  Buffer<float> attention;  // [L, Hq, Dv], filled chunk by chunk
  // True when Compute has more chunks to do (the caller queues the item again).
  bool pending() const { return status.ok() && written && done_rows < new_tokens; }
  // The session's id and layout, as BeginExtend found it (for validating the request's tensors).
  std::string session_id;
  std::string module_name;
  std::shared_ptr<const kernels::MultiHeadWeights> module;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0;
  kernels::AttentionKind kind = kernels::AttentionKind::kSoftmax;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_EXTEND_ITEM_H_
