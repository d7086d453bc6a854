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
#include "server/sessions/extend_item.h"
#include "server/sessions/kv_pool.h"
#include "server/sessions/session_mods.h"
#include "server/sessions/session_options.h"

namespace attnserve::metrics {
class Metrics;
}

namespace attnserve::server::sessions {

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
struct SessionState : SessionScoring {
  std::string id;
  std::string module_name;  // empty for raw sessions
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0;
  kernels::DType cache_dtype = kernels::DType::kFloat32;
  int64_t length = 0, pages = 0, shared_pages = 0, bytes = 0;
  bool pinned = false;
  absl::Duration idle_ttl, idle;
  std::string parent_id;
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
  // Moves session `id` (whoever's it is), in two phases (session_move.cc). The pre-copy, while
  // the session goes on: the pages it has filled go to `send`, a chunk of about `chunk_bytes`
  // at a time (`send` may take the string's contents, swapping in another string to reuse).
  // The switch: the session is marked moving (its extends, forks and closes answer UNAVAILABLE
  // "moving" (Moving); its description works), an extend in flight is waited for (until
  // `wait_until`: ABORTED then), the rest is sent, and `finish` asked for the session's id on
  // the replica that took it; `pause`, when given, gets the switch's length. On success the
  // session is removed here and its id remembered as moved (Moved); on any failure (its own:
  // NOT_FOUND, FAILED_PRECONDITION (lost, or moved already), ABORTED (moving already, or the
  // extend in flight did not return); or send's or finish's) it is back in place, as it was.
  // Returns the new id.
  using TransferSink = std::function<absl::Status(std::string& chunk)>;
  absl::StatusOr<std::string> Move(const std::string& id, size_t chunk_bytes,
                                   const TransferSink& send,
                                   const std::function<absl::StatusOr<std::string>()>& finish,
                                   absl::Time wait_until, absl::Duration* pause = nullptr);
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
  // RESOURCE_EXHAUSTED when `more` sessions more would take `tenant` over its most sessions.
  absl::Status CheckTenantSessionsLocked(const std::string& tenant, int64_t more = 1) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(Lease& lease, bool keep);
  // The transfer format (session_codec.h; session_snapshot.cc) of `sessions`: the bytes before
  // the pages, the pages (each once, with the index of its layout), and the bytes after them
  // but the trailer. `sent`: pages written before (a move's pre-copy), numbered first and not
  // in `pages`. WriteEncoding reads the pages: under the lock, or not for pages that do not
  // change (a moving session's, a pre-copy's). TransferDecoder (session_decoder.h) reads it
  // back.
  struct Encoding {
    struct Page {
      const Arena* arena;
      int32_t page;
      uint32_t layout;
    };
    std::string head, tail;
    std::vector<Page> pages;
  };
  Encoding EncodeLocked(const std::vector<const Session*>& sessions,
                        const std::vector<Encoding::Page>& sent = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The header of a transfer of `layouts` whose page section holds `records` records.
  std::string TransferHeadLocked(const std::vector<const Arena*>& layouts, uint64_t records) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `e` to `w`, with the trailer; `flush`, when given, is called after each page and at
  // the end (its error stops the writing).
  static absl::Status WriteEncoding(const Encoding& e, TransferWriter& w,
                                    const std::function<absl::Status(bool last)>& flush = nullptr);
  // The page records of `pages`, `flush` (when given) after each.
  static absl::Status WritePages(const std::vector<Encoding::Page>& pages, TransferWriter& w,
                                 const std::function<absl::Status(bool last)>& flush);
  // Move's answer for session `id` when it is not live here: the one a call of its own tenant
  // gets (lost, moved, never issued).
  absl::Status NotHereLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
