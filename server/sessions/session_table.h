// The session table: every live session by id, by creation order and by tenant; the least
// recently used order; when each expires (a min-heap with lazy deletion: O(log n) a use and a
// session that expires, never a scan of all); what the pinned sessions hold; and the ids of
// lost sessions (why and whose, the newest `remembered_lost` of them). Knows nothing of pages or
// the pool: the SessionManager frees a removed session's pages. Not thread-safe: the manager's
// lock guards it.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_TABLE_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/attention_params.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "server/sessions/kv_pool.h"
#include "server/sessions/session_mods.h"

namespace attnserve::server::sessions {

// One session's record: what it computes, its pages, its use, and its places in the table.
// A page table entry whose page left its session's sliding window and was freed.
inline constexpr int32_t kDroppedPage = -1;

struct Session : SessionScoring {
  std::string id;
  std::string tenant;   // whose it is (session_manager.h, "Tenants")
  uint64_t serial = 0;  // creation order on this replica
  std::string module_name;
  std::shared_ptr<const kernels::MultiHeadWeights> module;
  int num_heads = 0;
  Arena* arena = nullptr;
  kernels::DType cache_dtype = kernels::DType::kFloat32;  // a linear session's arena is float32
  // Its page table: pages[i] holds tokens [i · page_tokens, (i + 1) · page_tokens). The first
  // `dropped` entries left a sliding window and went back to the pool (kDroppedPage): no later
  // query reads them (SessionManager::DropPagesBeforeWindowLocked).
  std::vector<int32_t> pages;
  int64_t dropped = 0;
  int64_t length = 0;
  bool pinned = false;
  absl::Duration ttl;
  absl::Time last_used;
  uint64_t expiry_stamp = 0;  // of its live entry in the expiry heap (older ones are stale)
  bool busy = false;          // an extend holds a lease
  bool removed = false;       // closed or lost while busy: freed when the lease ends
  bool moving = false;        // being sent to another replica (busy too): session_move.cc
  bool sending = false;       // a move has begun (its pre-copy, then moving): not evicted
  std::string parent_id;
  // Its ids on the replicas it was moved from, oldest first (at most kMaxAliases): the replica
  // that holds it answers each "session moved to" its id, and a move or a snapshot carries
  // them on, so that a caller holding any of them finds it after every replica it passed
  // through has restarted.
  std::vector<std::string> aliases;
  static constexpr size_t kMaxAliases = 16;
  std::list<Session*>::iterator lru;

  // Pages it holds (not those dropped) and their bytes (a page it shares counted in full).
  int64_t held_pages() const { return static_cast<int64_t>(pages.size()) - dropped; }
  int64_t bytes() const { return held_pages() * arena->page_bytes(); }
};

class SessionTable {
 public:
  // Sessions in creation order (serial -> session).
  using Ordered = std::map<uint64_t, Session*>;
  struct LostId {
    std::string reason;
    std::string tenant;
    std::string moved_to;  // reason "moved": the session's new id (its owner holds it)
  };

  explicit SessionTable(int64_t remembered_lost) : remembered_lost_(remembered_lost) {}

  // Adds `s` (its id, tenant, last_used and ttl set): gives it the next serial, makes it the
  // most recently used, schedules its expiry and counts its pages as pinned when it is.
  void Add(std::shared_ptr<Session> s);
  // Takes `s` out of every index (its pinned pages too) and, for a `lost_reason`, remembers its
  // id as lost. Returns the table's reference, so that the caller holds it while freeing.
  std::shared_ptr<Session> Remove(const Session& s, absl::string_view lost_reason);

  // The live session of `id`, or null.
  std::shared_ptr<Session> Find(const std::string& id) const;
  // Remembers that session `id` of `tenant` lives on as `moved_to` (moved to another replica:
  // its old id, on the replica it left and on the one it went to).
  void RememberMoved(const std::string& id, const std::string& tenant, const std::string& moved_to);
  // Why and whose, when `id` was lost (or moved) and is still remembered; else null.
  const LostId* FindLost(const std::string& id) const;

  // `s` was used at `now`: the most recently used, its expiry moved.
  void Touch(Session& s, absl::Time now);
  // Schedules s's expiry (last_used + ttl) as its live heap entry (a busy session's was dropped
  // when it fell due; its lease's end schedules it again).
  void ScheduleExpiry(Session& s);
  // The sessions whose expiry is due at `now` and that are not busy, taken off the heap (not out
  // of the table: the caller removes them).
  std::vector<std::shared_ptr<Session>> Due(absl::Time now);

  // Pinned sessions and the bytes of their pages (a pinned session's growth is added by its
  // lease's commit).
  void AddPinnedBytes(int64_t bytes) { pinned_bytes_ += bytes; }
  int64_t pinned_bytes() const { return pinned_bytes_; }
  int64_t pinned_sessions() const { return pinned_sessions_; }

  int64_t size() const { return static_cast<int64_t>(by_id_.size()); }
  // Least recently used first.
  const std::list<Session*>& lru() const { return lru_; }
  // Every session by creation order, or `tenant`'s (null when it has none).
  const Ordered& all() const { return by_serial_; }
  const Ordered* of(const std::string& tenant) const;
  // Every tenant's sessions.
  const absl::flat_hash_map<std::string, Ordered>& by_tenant() const { return by_tenant_; }

 private:
  struct Expiry {
    absl::Time at;
    uint64_t stamp;
    std::string id;
    bool operator>(const Expiry& o) const { return at > o.at; }
  };

  void Remember(const std::string& id, LostId lost);

  const int64_t remembered_lost_;
  uint64_t next_serial_ = 1;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> by_id_;
  Ordered by_serial_;
  absl::flat_hash_map<std::string, Ordered> by_tenant_;
  std::list<Session*> lru_;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<Expiry>> expiry_;
  uint64_t next_expiry_stamp_ = 0;
  int64_t pinned_bytes_ = 0;
  int64_t pinned_sessions_ = 0;
  absl::flat_hash_map<std::string, LostId> lost_;
  std::deque<std::string> lost_order_;  // oldest first
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_TABLE_H_
