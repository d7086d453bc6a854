// SessionManager's session table: ids, create / fork / close / describe / list (each tenant its
// own), TTL by the expiry heap, LRU, lost ids, the pinned budget (usage: pool_shares.cc).
#include "server/sessions/session_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/paged_attention_params.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {

absl::StatusOr<std::unique_ptr<SessionManager>> SessionManager::Create(
    const SessionOptions& options, metrics::Metrics* metrics) {
  if (options.idle_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("session_idle_ttl_ms must be positive; was ",
                                                   absl::ToInt64Milliseconds(options.idle_ttl)));
  }
  if (!(options.max_pinned_fraction >= 0 && options.max_pinned_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_max_pinned_fraction must be in [0, 1]; was ", options.max_pinned_fraction));
  }
  if (options.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sessions must be positive; was ", options.max_sessions));
  }
  if (options.prefill_chunk_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_prefill_chunk_tokens must be positive; was ", options.prefill_chunk_tokens));
  }
  if (options.max_session_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_session_tokens must be positive; was ", options.max_session_tokens));
  }
  KvPool::StoreFactory new_store;
  if (options.backend != nullptr) {
    new_store = [backend = options.backend](const kernels::PageStoreShape& shape) {
      return backend->NewPageStore(shape);
    };
  }
  auto pool = KvPool::Create(options.pool_bytes, options.page_tokens, options.max_layouts,
                             std::move(new_store));
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<SessionManager>(new SessionManager(options, *std::move(pool), metrics));
}

SessionManager::SessionManager(const SessionOptions& options, std::unique_ptr<KvPool> pool,
                               metrics::Metrics* metrics)
    : options_(options),
      metrics_(metrics),
      owned_clock_(options.clock == nullptr ? std::make_unique<batching::RealClock>() : nullptr),
      clock_(options.clock != nullptr ? options.clock : owned_clock_.get()),
      instance_(RandomInstance()),
      owner_(options.owner.empty() ? "localhost" : options.owner),
      pool_(std::move(pool)),
      table_(std::make_unique<SessionTable>(options.remembered_lost)) {}

SessionManager::~SessionManager() {
  MutexLock lock(&mu_);
  // Leases outlive nothing: the server finishes its jobs before the manager goes.
  for (const auto& [serial, s] : table_->all()) {
    if (!s->busy) {
      FreePagesLocked(*s);
      pool_->Release(s->arena);
    }
  }
  table_.reset();
}

std::string SessionManager::owner() const {
  MutexLock lock(&mu_);
  return owner_;
}

void SessionManager::SetOwner(std::string owner) {
  MutexLock lock(&mu_);
  owner_ = std::move(owner);
}

void SessionManager::TouchLocked(Session& s) { table_->Touch(s, Now()); }

void SessionManager::FreePagesLocked(Session& s) {
  for (size_t i = s.dropped; i < s.pages.size(); ++i) pool_->Unref(s.arena, s.pages[i]);
  s.pages.clear();
  s.dropped = 0;
}

void SessionManager::DropPagesBeforeWindowLocked(Session& s) {
  if (s.mods.window_left < 0) return;
  // The next query (at position s.length) attends from s.length - window_left on, and the
  // paged kernels read whole splits of kPagedSplitKeys keys from the one holding it: every page
  // wholly before that split is never read again, by this session or by its later forks.
  const int64_t first_key = std::max<int64_t>(0, s.length - s.mods.window_left);
  const int64_t first_split_key = first_key / kernels::kPagedSplitKeys * kernels::kPagedSplitKeys;
  const int64_t keep_from = std::min<int64_t>(first_split_key / pool_->page_tokens(),
                                              static_cast<int64_t>(s.pages.size()) - 1);
  for (; s.dropped < keep_from; ++s.dropped) {
    pool_->Unref(s.arena, s.pages[s.dropped]);
    s.pages[s.dropped] = kDroppedPage;
    if (s.pinned) table_->AddPinnedBytes(-s.arena->page_bytes());
  }
}

void SessionManager::RemoveLocked(const std::shared_ptr<Session>& s,
                                  absl::string_view lost_reason) {
  table_->Remove(*s, lost_reason);
  if (!lost_reason.empty() && metrics_ != nullptr) {
    metrics_->RecordSessionLost(std::string_view(lost_reason.data(), lost_reason.size()));
  }
  if (s->busy) {
    s->removed = true;  // the lease frees it
  } else {
    FreePagesLocked(*s);
    pool_->Release(s->arena);
  }
}

void SessionManager::ExpireLocked() {
  // The expiry heap's due entries only (session_table.h): O(log n) a session that expires.
  for (const std::shared_ptr<Session>& s : table_->Due(Now())) RemoveLocked(s, "expired");
}

void SessionManager::DropLostLocked() {
  if (!pool_->AnyLost()) return;
  std::vector<std::shared_ptr<Session>> lost;
  for (const auto& [serial, s] : table_->all()) {
    if (s->arena->store()->lost()) lost.push_back(table_->Find(s->id));
  }
  for (const auto& s : lost) RemoveLocked(s, kDeviceReset);
}

absl::Status SessionManager::CrossTenantLocked(const std::string& tenant, absl::string_view op,
                                               absl::Status never) {
  // The owner may read the log; the caller learns nothing (the answer is `never`). A tenant
  // probing ids makes a line every 10 s, not one a call.
  if (int64_t left_out = 0; cross_tenant_log_.Admit(tenant, Now(), &left_out)) {
    const std::string more =
        left_out == 0 ? ""
                      : absl::StrCat(" (and ", left_out, " more by it since its last such line)");
    std::fprintf(stderr, "attnserve: %s by tenant '%s' of another tenant's session refused%s\n",
                 std::string(op).c_str(), tenant.c_str(), more.c_str());
  }
  RecordRefusal(tenant, "cross_tenant");
  return never;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::FindLocked(const std::string& tenant,
                                                                    const std::string& id,
                                                                    absl::string_view op) {
  DropLostLocked();
  auto parsed = ParseId(id);
  if (!parsed.ok()) return parsed.status();
  // Another tenant's session, live or lost, is answered as one never issued (the same status).
  const absl::Status never = absl::NotFoundError(
      absl::StrCat("session '", id, "' does not exist (closed, or never created)"));
  // A live session first: every call's lookup. Its id is this replica's (a session moved here
  // gets an id of its own; a snapshot restores only its owner's), and no id is both live and
  // remembered as lost or moved. An id of another instance is looked up too: a snapshot restores
  // sessions with their ids (session_snapshot.cc); one that is not here answers "restarted".
  if (std::shared_ptr<Session> s = table_->Find(id); s != nullptr) {
    if (s->tenant != tenant) return CrossTenantLocked(tenant, op, never);
    if (s->moving && op != "GetSession") return Moving(id);
    if (!s->busy && Now() - s->last_used >= s->ttl) {
      RemoveLocked(s, "expired");
      return Lost("expired", id);
    }
    return s;
  }
  const SessionTable::LostId* lost = table_->FindLost(id);
  // A session moved here from another replica is remembered by its old id too, whose owner is
  // the other replica's.
  if (lost != nullptr && !lost->moved_to.empty()) {
    if (lost->tenant != tenant) return CrossTenantLocked(tenant, op, never);
    return Moved(id, lost->moved_to);
  }
  if (parsed->owner != owner_) {
    return absl::NotFoundError(absl::StrCat("session '", id, "' belongs to replica '",
                                            parsed->owner, "', not to this one ('", owner_,
                                            "'): send its calls there"));
  }
  if (lost != nullptr) {
    if (lost->tenant != tenant) return CrossTenantLocked(tenant, op, never);
    return Lost(lost->reason, id);
  }
  // An id of an earlier process whose session did not come back (or was never issued).
  if (parsed->instance != instance_) return Lost("restarted", id);
  return never;
}

SessionState SessionManager::StateLocked(const Session& s) {
  SessionState st;
  st.id = s.id;
  st.module_name = s.module_name;
  const PageLayout& l = s.arena->layout();
  st.num_heads = s.num_heads;
  st.num_kv_heads = l.num_kv_heads;
  st.head_dim = l.head_dim;
  st.v_head_dim = l.v_head_dim;
  st.cache_dtype = s.cache_dtype;
  st.length = s.length;
  st.pages = s.held_pages();
  for (size_t i = s.dropped; i < s.pages.size(); ++i) {
    st.shared_pages += s.arena->refs(s.pages[i]) > 1 ? 1 : 0;
  }
  st.bytes = st.pages * s.arena->page_bytes();
  st.pinned = s.pinned;
  st.idle_ttl = s.ttl;
  st.idle = Now() - s.last_used;
  st.parent_id = s.parent_id;
  static_cast<SessionScoring&>(st) = s;
  st.tenant = s.tenant;
  st.serial = s.serial;
  return st;
}

absl::StatusOr<SessionState> SessionManager::AddLocked(std::shared_ptr<Session> s) {
  s->id = absl::StrCat(owner_, "/", instance_, "/", RandomKey());
  s->last_used = Now();
  Session& ref = *s;
  table_->Add(std::move(s));
  return StateLocked(ref);
}

absl::StatusOr<SessionState> SessionManager::Create(const SessionSpec& spec) {
  auto s = std::make_shared<Session>();
  s->tenant = spec.tenant;
  PageLayout layout;
  layout.page_size = options_.page_tokens;  // the pool's (KvPool::Create)
  // A linear session's pages hold its float32 state (linear_extend.cc), whatever the dtype its
  // keys and values are rounded to.
  layout.dtype =
      spec.kind == kernels::AttentionKind::kLinear ? kernels::DType::kFloat32 : spec.cache_dtype;
  s->cache_dtype = spec.cache_dtype;
  s->kind = spec.kind;
  s->feature_map = spec.feature_map;
  if (spec.module != nullptr) {
    s->module_name = spec.module_name;
    s->module = spec.module;
    s->num_heads = spec.module->num_heads;
    layout.num_kv_heads = spec.module->num_heads;
    layout.head_dim = layout.v_head_dim = spec.module->head_dim();
  } else {
    s->num_heads = spec.num_heads;
    layout.num_kv_heads = spec.num_kv_heads;
    layout.head_dim = spec.head_dim;
    layout.v_head_dim = spec.v_head_dim;
  }
  s->scale =
      spec.scale.has_value() ? *spec.scale : 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  s->mods = spec.mods;
  s->pinned = spec.pinned;
  s->ttl = spec.idle_ttl > absl::ZeroDuration() ? std::min(spec.idle_ttl, options_.idle_ttl)
                                                : options_.idle_ttl;
  MutexLock lock(&mu_);
  ExpireLocked();
  if (leaving_) return Leaving();
  if (table_->size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", table_->size(),
                     " sessions, its limit (--max_sessions); close sessions first"));
  }
  if (absl::Status st = CheckTenantSessionsLocked(spec.tenant); !st.ok()) return st;
  if (spec.pinned && table_->pinned_bytes() >= static_cast<int64_t>(options_.max_pinned_fraction *
                                                                    pool_->bytes_total())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned sessions hold ", table_->pinned_bytes(), " bytes, their share of the pool (",
        options_.max_pinned_fraction, " of ", pool_->bytes_total(),
        " bytes, --session_max_pinned_fraction); create the session unpinned"));
  }
  if (spec.pinned) {
    if (absl::Status st = CheckTenantPinnedLocked(spec.tenant, 1); !st.ok()) return st;
  }
  DropLostLocked();  // a lost arena of this layout is made anew
  auto arena = pool_->Acquire(layout);
  if (!arena.ok()) return arena.status();
  s->arena = *arena;
  return AddLocked(std::move(s));
}

absl::StatusOr<SessionState> SessionManager::Fork(const std::string& tenant, const std::string& id,
                                                  bool pinned, absl::Duration idle_ttl) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto parent = FindLocked(tenant, id, "ForkSession");
  if (!parent.ok()) return parent.status();
  Session& p = **parent;
  TouchLocked(p);
  if (p.busy) {
    return absl::AbortedError(
        absl::StrCat("an extend of session '", id, "' is in flight; fork it after it returns"));
  }
  if (leaving_) return Leaving();
  if (table_->size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", table_->size(),
                     " sessions, its limit (--max_sessions); close sessions first"));
  }
  if (absl::Status st = CheckTenantSessionsLocked(tenant); !st.ok()) return st;
  const int64_t bytes = p.bytes();
  if (pinned && table_->pinned_bytes() + bytes >
                    static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinning the fork would take pinned sessions over their share of the pool (",
                     options_.max_pinned_fraction, " of ", pool_->bytes_total(),
                     " bytes, --session_max_pinned_fraction); fork it unpinned"));
  }
  if (pinned) {
    if (absl::Status st = CheckTenantPinnedLocked(tenant, bytes); !st.ok()) return st;
  }
  pool_->AddUser(p.arena);  // the fork shares the parent's pages
  Arena* const arena = p.arena;
  auto c = std::make_shared<Session>();
  c->tenant = tenant;
  c->module_name = p.module_name;
  c->module = p.module;
  c->num_heads = p.num_heads;
  c->arena = arena;
  c->cache_dtype = p.cache_dtype;
  static_cast<SessionScoring&>(*c) = p;
  c->pages = p.pages;
  c->dropped = p.dropped;
  for (size_t i = c->dropped; i < c->pages.size(); ++i) pool_->Ref(c->arena, c->pages[i]);
  c->length = p.length;
  c->pinned = pinned;
  c->ttl = idle_ttl > absl::ZeroDuration() ? std::min(idle_ttl, options_.idle_ttl) : p.ttl;
  c->parent_id = p.id;
  return AddLocked(std::move(c));
}

absl::Status SessionManager::Close(const std::string& tenant, const std::string& id) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto s = FindLocked(tenant, id, "CloseSession");
  if (!s.ok()) return s.status();
  RemoveLocked(*s, "");
  return absl::OkStatus();
}

absl::StatusOr<SessionState> SessionManager::Get(const std::string& tenant, const std::string& id) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto s = FindLocked(tenant, id, "GetSession");
  if (!s.ok()) return s.status();
  SessionState st = StateLocked(**s);  // idle before this call
  TouchLocked(**s);
  return st;
}

std::vector<SessionState> SessionManager::List(const std::string& tenant, bool all, uint64_t after,
                                               int limit, bool* more) {
  MutexLock lock(&mu_);
  ExpireLocked();
  std::vector<SessionState> out;
  *more = false;
  const SessionTable::Ordered* listed = all ? &table_->all() : table_->of(tenant);
  if (listed == nullptr) return out;
  auto it = listed->upper_bound(after);
  for (; it != listed->end() && static_cast<int>(out.size()) < limit; ++it) {
    out.push_back(StateLocked(*it->second));
  }
  *more = it != listed->end();
  return out;
}

}  // namespace attnserve::server::sessions
