// Decode sessions: the server-held state behind CreateSession, ExtendSession(s), ForkSession,
// CloseSession, GetSession and ListSessions (proto/attnserve/v1/attention.proto documents the
// codes; this header the mechanics).
//
// A session is a paged KV cache (kv_pool.h) plus what it computes: a module (the server
// projects the new tokens with W_q, W_k, W_v and applies W_o) or a raw head layout. Extends go
// through the server's dispatcher like every compute request:
//
//   BeginExtend (gRPC thread)    the session is marked busy (a second extend: ABORTED),
//                                expected_length checked; returns a Lease
//   Compute (batch thread)       for a batch of leases: reserve pages (evicting LRU idle
//                                sessions, or refusing, as the options say), project (module
//                                sessions), write the new K and V in the cache dtype (copying
//                                a shared last page first), one Backend::PagedAttention call
//                                per head layout for every sequence of the batch, W_o
//   Lease::End(keep)             commits (the tokens become part of the session) or rolls back
//                                (the pages reserved are freed, the session is as before)
//
// A lease that is destroyed without End rolls back, so a job refused or dropped anywhere leaves
// its session as it was.
//
// Session ids are "<owner>/<instance>/<key>": owner the replica's address, instance a random
// tag of this process (an id of another instance is "lost (restarted)"), key 128 random bits
// (32 hex digits, from the system's CSPRNG): knowing one id tells nothing of another.
// Lost sessions (evicted, expired) are remembered, a bounded number, so that their ids answer
// FAILED_PRECONDITION "session lost (...)" and not NOT_FOUND.
//
// Tenants. Every session belongs to the tenant that created it (a fork to the tenant that
// forked it), and every call names the caller's tenant: a session of another tenant, live or
// lost, answers exactly as an id that was never issued (NOT_FOUND, the same message). Only
// List(all = true) (an operator's) sees every tenant's sessions.
//
// Thread-safe: one mutex guards the sessions and the pool; page contents are written outside
// it by the one extend that holds the session (pages it writes are its own: fresh, or its last
// page when no other session shares it; forks of a busy session are refused).
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/buffer.h"
#include "base/log_throttle.h"
#include "base/mutex.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "server/batching/clock.h"
#include "server/sessions/kv_pool.h"
#include "server/sessions/session_mods.h"

namespace attnserve::metrics {
class Metrics;
}

namespace attnserve::server::sessions {

enum class WhenFull { kEvictLru, kRefuse };

// What one tenant may hold of the sessions and the pool (server/transport/auth.h: the tenants
// file's sessions=, share= and max_share=). The defaults are no limit and no guarantee.
struct TenantShares {
  int64_t max_sessions = 0;  // 0: only the server's max_sessions
  // Fractions of the pool's bytes: a tenant holding at most `guaranteed` never loses a session
  // to another tenant's need for pages (eviction takes from tenants above theirs first, and
  // only from them); an extend that would take it over `max` is refused RESOURCE_EXHAUSTED.
  double guaranteed = 0.0;
  double max = 1.0;
  // Pinned sessions: at most this fraction of the pool's bytes (within the server's
  // max_pinned_fraction for all tenants together).
  double max_pinned = 1.0;
  // Calls in flight at once (server/core/tenant_calls.h); 0: no limit.
  int64_t max_in_flight = 0;
};

// The sessions' settings (flags of the attnserve binary with the same names, prefixed
// "session_"; GetServerInfo.sessions reports them).
struct SessionOptions {
  // ---- Affect behaviour ----
  // Bytes of the KV pool (K and V of every session). Default: 1 GiB. REQUIRES: > 0.
  int64_t pool_bytes = int64_t{1} << 30;
  // Tokens per page. Default: 128. REQUIRES: 1..4096.
  // Not the 16 common on GPUs: a decode step reads a page as one run per kv head (page_tokens x D
  // elements: 32 KiB of FLOAT16 at D = 128), and scattered runs read slower the shorter they are:
  // side by side, the CPU decode kernel read 16-bit caches faster with pages of 64 tokens than
  // of 16, and with 128 than with 64 on most machines (tests/bench/DECODE.md has the figures).
  // The cost: a session's last page is half empty on average (page_tokens / 2 tokens of K and V
  // per session), and a fork copies up to a page at the first write to a shared last page.
  int page_tokens = 128;
  // When an extend needs pages the pool does not have. Default: evict LRU idle sessions.
  WhenFull when_full = WhenFull::kEvictLru;
  // A session unused this long is lost (expired); the longest a session may ask for.
  // Default: 10 minutes. REQUIRES: > 0.
  absl::Duration idle_ttl = absl::Minutes(10);
  // Pinned sessions hold at most this fraction of pool_bytes. Default: 0.5. REQUIRES: 0..1.
  double max_pinned_fraction = 0.5;
  // Most sessions held at once (Limits.max_sessions). Default: 65536. REQUIRES: > 0.
  int64_t max_sessions = 65536;
  // The most new tokens of one extend computed in one batch: a longer prefill is computed a
  // chunk per batch and goes back to the queue between chunks, so that decode steps queued
  // meanwhile are not held up by it for longer than a chunk. Default: 512. REQUIRES: > 0.
  int64_t prefill_chunk_tokens = 512;
  // Longest session in tokens (Limits.max_sequence_length). Default: 65536. REQUIRES: > 0.
  int64_t max_session_tokens = 65536;
  // Lost ids remembered (beyond it the oldest answer NOT_FOUND). Default: 65536.
  int64_t remembered_lost = 65536;
  // Distinct head layouts (kv heads, head dims, dtype) the pool serves at once. Default: 16.
  int max_layouts = 16;
  // The replica's address in session ids; set by the server host (host:port) when empty.
  std::string owner;
  // The shares of a tenant (called with the manager's lock held: must not call back into it).
  // Null: every tenant has the defaults.
  std::function<TenantShares(const std::string& tenant)> shares_of;
  // A tenant's metrics label (bounded; server/metrics/metrics.h). Same rules as shares_of.
  // Null: "anonymous" for "", "other" otherwise.
  std::function<std::string(const std::string& tenant)> tenant_label;

  // ---- Injected ----
  // The clock of idle times. Not owned. Default: nullptr, the wall clock.
  batching::Clock* clock = nullptr;
  // The backend the extends compute on (Compute's): the pages live where its NewPageStore puts
  // them (device memory for CUDA). Not owned; outlives the manager. Default: nullptr, host
  // memory.
  kernels::Backend* backend = nullptr;
};

// What a session computes.
struct SessionSpec {
  // Module sessions: the module's name and weights (shared with the registry's entry).
  std::string module_name;
  std::shared_ptr<const kernels::MultiHeadWeights> module;
  // Raw sessions (ignored for modules, which use num_heads heads of d_model / num_heads).
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0;
  kernels::DType cache_dtype = kernels::DType::kFloat32;
  std::optional<float> scale;
  SessionMods mods;  // validated by the caller (alibi_slopes: one per query head)
  // Linear attention (attention.proto, CreateSessionRequest.kind; no mods, no scale): the
  // session keeps its running state, not keys and values (linear_extend.cc).
  kernels::AttentionKind kind = kernels::AttentionKind::kSoftmax;
  kernels::FeatureMap feature_map = kernels::FeatureMap::kEluPlusOne;
  bool pinned = false;
  absl::Duration idle_ttl = absl::ZeroDuration();  // zero: the default
  std::string tenant;  // the creator's (auth.h); "" the anonymous tenant
};

// A session's state (SessionInfo).
struct SessionState {
  std::string id;
  std::string module_name;  // empty for raw sessions
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0;
  kernels::DType cache_dtype = kernels::DType::kFloat32;
  int64_t length = 0, pages = 0, shared_pages = 0, bytes = 0;
  bool pinned = false;
  absl::Duration idle_ttl, idle;
  std::string parent_id;
  float scale = 1.0f;
  SessionMods mods;
  kernels::AttentionKind kind = kernels::AttentionKind::kSoftmax;
  kernels::FeatureMap feature_map = kernels::FeatureMap::kEluPlusOne;
  std::string tenant;
  uint64_t serial = 0;  // the order of creation on this replica (ListSessions' pages)
};

// The pool's usage (SessionPoolUsage and the metrics).
struct PoolUsage {
  int64_t pages_total = 0, pages_used = 0, bytes_total = 0, bytes_used = 0, tokens = 0;
  int64_t sessions = 0, pinned_sessions = 0, pinned_pages = 0, shared_pages = 0;
  int64_t bytes_kept = 0;  // freed pages with their memory (KvPool::bytes_kept)
};

struct Session;
class SessionTable;
class SessionManager;
class TransferWriter;  // session_codec.h
class TransferReader;
class TransferDecoder;  // session_decoder.h
class SessionImport;    // session_import.h

// The right to extend one session, from BeginExtend until End. Move-only.
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

class SessionManager {
 public:
  // Validates the options (INVALID_ARGUMENT naming the flag and the value). `metrics` may be
  // null; it outlives the manager.
  static absl::StatusOr<std::unique_ptr<SessionManager>> Create(const SessionOptions& options,
                                                                metrics::Metrics* metrics);
  ~SessionManager();

  const SessionOptions& options() const { return options_; }
  std::string owner() const;
  // Sets the owner named in new ids (the server host, once its port is known).
  void SetOwner(std::string owner);

  // Every call below names the caller's `tenant`; see "Tenants" above.
  absl::StatusOr<SessionState> Create(const SessionSpec& spec);
  // The fork belongs to `tenant`, which must be the session's.
  absl::StatusOr<SessionState> Fork(const std::string& tenant, const std::string& id, bool pinned,
                                    absl::Duration idle_ttl);
  absl::Status Close(const std::string& tenant, const std::string& id);
  absl::StatusOr<SessionState> Get(const std::string& tenant, const std::string& id);
  // The sessions of `tenant` (of every tenant when `all`) created after the one of serial
  // `after` (0: from the first), in the order they were created, at most `limit`; `more` says
  // whether others follow.
  std::vector<SessionState> List(const std::string& tenant, bool all, uint64_t after, int limit,
                                 bool* more);
  PoolUsage Usage();
  // Hands back the pool's memory no session holds (KvPool::ReleaseFreeMemory): called by the
  // server once it has been idle. Returns the bytes discarded.
  int64_t ReleaseIdleMemory();
  // Per tenant: its sessions and the bytes of their pages (a page shared by two of its sessions
  // counted twice).
  struct TenantUsage {
    std::string tenant;
    int64_t sessions = 0, bytes = 0;
  };
  std::vector<TenantUsage> UsageByTenant();

  // Marks session `id` busy for an extend of `new_tokens` tokens. Errors: INVALID_ARGUMENT (a
  // malformed id), NOT_FOUND, FAILED_PRECONDITION (lost), ABORTED (another extend in flight,
  // or the length is not expected_length), RESOURCE_EXHAUSTED (longer than
  // max_session_tokens).
  // Fills item->lease and the layout fields of *item.
  absl::Status BeginExtend(const std::string& tenant, const std::string& id,
                           std::optional<int64_t> expected_length, int64_t new_tokens,
                           ExtendItem* item);
  // Computes a batch of extends (each with an active lease and status OK): per-item errors in
  // item.status (RESOURCE_EXHAUSTED when the pool is full), a backend failure for every item it
  // touched. Computes the next prefill_chunk_tokens new tokens of each item; an item with more
  // left is pending() and must be computed again (the K and V of all its tokens are cached at
  // its first chunk; its queries attend causally whatever the chunking). Does not End the
  // leases.
  void Compute(absl::Span<ExtendItem* const> items, kernels::Backend* backend);

  // Snapshots (session_snapshot.cc): a replica's sessions on local disk across a restart.
  // What a snapshot held, or what of it came back.
  struct SnapshotStats {
    int64_t sessions = 0;  // written, or restored
    int64_t pages = 0;     // distinct pages (a page forks share once)
    int64_t bytes = 0;     // of the file
    int64_t lost = 0;      // sessions not restored: their module missing or changed, or no room
    std::string why_lost;  // the first such reason, for the log
  };
  // Writes every session to `path` (a temporary file beside it, flushed to disk, then renamed
  // over it: a crash leaves the old file or the new one, never a torn one). For the end of a
  // drain: REQUIRES no extend in flight (FAILED_PRECONDITION otherwise, nothing written).
  // INTERNAL for a failure of the disk (nothing left behind).
  absl::StatusOr<SnapshotStats> WriteSnapshot(const std::string& path);
  // Restores the sessions of the snapshot at `path`, with their ids (which stay valid: a session
  // is found by its id, whichever process issued it), tenants, settings, lengths and pages. For the
  // start of a server, before its first call: REQUIRES no session yet. A module session comes
  // back only if `module_named(name)` gives weights equal to those it was created with (else it
  // is lost, as a session whose pages do not fit in the pool). NOT_FOUND: no file; DATA_LOSS: a
  // torn or corrupt file (checksums), FAILED_PRECONDITION: a snapshot of another owner, or of
  // another page size; nothing is restored then.
  using ModuleNamed =
      std::function<std::shared_ptr<const kernels::MultiHeadWeights>(const std::string& name)>;
  absl::StatusOr<SnapshotStats> RestoreSnapshot(const std::string& path,
                                                const ModuleNamed& module_named);

  // Moves (session_move.cc): a session sent to another replica, sessions taken from one, in the
  // transfer format of session_codec.h (the snapshot's), streamed.
  //
  // Moves session `id` (whoever's it is): marks it moving (its extends, forks and closes answer
  // UNAVAILABLE "moving" (Moving) until the move ends; its description works), then, outside
  // the manager's lock (a moving session's pages do not change), hands its transfer to `send` a
  // chunk of about `chunk_bytes` at a time (`send` may take the string's contents, swapping in
  // another string to reuse), then asks `finish` for the session's id on the
  // replica that took it. On success the session is removed here and its id remembered as moved
  // (Moved); on any failure (its own: NOT_FOUND, FAILED_PRECONDITION (lost, or moved
  // already), ABORTED (an extend in flight); or send's or finish's) it is back in place, as it
  // was. Returns the new id.
  using TransferSink = std::function<absl::Status(std::string& chunk)>;
  absl::StatusOr<std::string> Move(const std::string& id, size_t chunk_bytes,
                                   const TransferSink& send,
                                   const std::function<absl::StatusOr<std::string>()>& finish);
  // Takes sessions sent by another replica as their transfer arrives (session_import.h): pages
  // are written into the pool as their bytes come, and nothing is visible before Commit.
  std::unique_ptr<SessionImport> BeginImport(ModuleNamed module_named);
  // Every session's id, in the order they were created (a drain moves them in turn).
  std::vector<std::string> Ids();
  // The replica is leaving (a drain that moves its sessions): from now on Create, Fork and
  // imports answer UNAVAILABLE (Leaving), so that the sessions moved out are the last.
  void Leave();

  // "session lost (<reason>): ..." status helpers (the proto's contract).
  static absl::Status Lost(absl::string_view reason, absl::string_view id);
  // The reason of a status made by Lost, or empty.
  static std::string LostReason(const absl::Status& status);
  // "session moved to '<to>': ..." (FAILED_PRECONDITION) and its new id; "session ... is
  // moving" (UNAVAILABLE).
  static absl::Status Moved(absl::string_view id, absl::string_view to);
  static std::string MovedTo(const absl::Status& status);
  static absl::Status Moving(absl::string_view id);
  static absl::Status Leaving();

 private:
  friend class Lease;
  SessionManager(const SessionOptions& options, std::unique_ptr<KvPool> pool,
                 metrics::Metrics* metrics);
  absl::Time Now() { return clock_->Now(); }

  // The session `id` names if it is `tenant`'s, or the status to answer.
  // `op` names the call in the log line of a refused cross-tenant access.
  absl::StatusOr<std::shared_ptr<Session>> FindLocked(const std::string& tenant,
                                                      const std::string& id, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loses sessions idle past their TTL.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loses the sessions whose pages a device reset took (PageStore::lost), so that their arena
  // is made anew.
  void DropLostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a session (closed or lost), freeing its pages.
  void RemoveLocked(const std::shared_ptr<Session>& s, absl::string_view lost_reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreePagesLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refused access to another tenant's session: logged (throttled) and counted; returns
  // `never`, the answer an id never issued gets.
  absl::Status CrossTenantLocked(const std::string& tenant, absl::string_view op,
                                 absl::Status never) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the pages of a windowed session that no later query reads (session_table.h, dropped).
  void DropPagesBeforeWindowLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionState StateLocked(const Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<SessionState> AddLocked(std::shared_ptr<Session> s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves the pages of one extend (item.new_table, fresh, replaced).
  absl::Status ReserveLocked(ExtendItem& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED unless `fresh` more pages of `arena` for session `s` (`growth` of them
  // kept when it commits) keep it within the pinned shares and its tenant's max_share.
  absl::Status CheckReserveLocked(const Session& s, const Arena& arena, int64_t fresh,
                                  int64_t growth) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates `fresh` pages of `arena` for `s` (evicting when the options say so), or the
  // RESOURCE_EXHAUSTED status of a full pool.
  absl::Status AllocateLocked(const Session& s, Arena* arena, int64_t fresh,
                              std::vector<int32_t>* pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A linear-attention extend (linear_extend.cc): its rows and its new state, in fresh pages.
  void ComputeLinear(ExtendItem& item, const float* projected, kernels::Backend& backend);
  // Evicts idle unpinned sessions, least recently used first, until `fresh` pages of `arena`
  // are allocated into *pages: first of tenants holding more than their guaranteed share, then
  // of `s`'s own tenant; never another tenant's within its share. False when nothing may go.
  bool EvictForLocked(const Session& s, Arena* arena, int64_t fresh, std::vector<int32_t>* pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TenantShares SharesOf(const std::string& tenant) const;
  std::string TenantLabel(const std::string& tenant) const;
  // Counts a refusal of `tenant`'s call for `reason` (attnserve_tenant_refusals_total).
  void RecordRefusal(const std::string& tenant, absl::string_view reason) const;
  // Bytes of the pages `tenant`'s sessions hold (a page shared by two of them counted twice).
  int64_t TenantBytesLocked(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `more` bytes more in `tenant`'s pinned sessions would take them
  // over its pinned share (Create passes 1: a pinned session at the share is refused).
  absl::Status CheckTenantPinnedLocked(const std::string& tenant, int64_t more) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `tenant` already holds its most sessions.
  absl::Status CheckTenantSessionsLocked(const std::string& tenant) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(Lease& lease, bool keep);
  // The transfer format (session_codec.h; session_snapshot.cc) of `sessions`: the bytes before
  // the pages, the pages (each once, with the index of its layout), and the bytes after them
  // but the trailer. WriteEncoding reads the pages: under the lock, or not for a moving
  // session's (they do not change). TransferDecoder (session_decoder.h) reads it back.
  struct Encoding {
    struct Page {
      const Arena* arena;
      int32_t page;
      uint32_t layout;
    };
    std::string head, tail;
    std::vector<Page> pages;
  };
  Encoding EncodeLocked(const std::vector<const Session*>& sessions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `e` to `w`, with the trailer; `flush`, when given, is called after each page and at
  // the end (its error stops the writing).
  static absl::Status WriteEncoding(const Encoding& e, TransferWriter& w,
                                    const std::function<absl::Status()>& flush = nullptr);
  // Bytes of `e` written whole, trailer included.
  static uint64_t TotalBytes(const Encoding& e);
  // Ends a move (Move): `moved_to` empty puts the session back in place.
  void EndMove(const std::string& id, const std::string& moved_to);
  friend class TransferDecoder;
  friend class SessionImport;

  const SessionOptions options_;
  metrics::Metrics* const metrics_;
  std::unique_ptr<batching::Clock> owned_clock_;
  batching::Clock* clock_;
  const std::string instance_;

  mutable Mutex mu_;
  std::string owner_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<KvPool> pool_ ABSL_GUARDED_BY(mu_);
  // The sessions (session_table.h): ids, creation order, tenants, LRU, expiry, pinned use,
  // lost ids.
  std::unique_ptr<SessionTable> table_ ABSL_GUARDED_BY(mu_);
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;  // Leave()
  // The log line of a refused cross-tenant access: one a tenant every 10 s, with the count of
  // those left out (the metric counts each).
  LogThrottle cross_tenant_log_ ABSL_GUARDED_BY(mu_){absl::Seconds(10)};
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_H_
