#include "server/sessions/session_manager.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/paged_attention_params.h"
#include "server/metrics/metrics.h"

namespace attnserve::server::sessions {

struct Session {
  std::string id;
  std::string module_name;
  std::shared_ptr<const kernels::MultiHeadWeights> module;
  int num_heads = 0;
  Arena* arena = nullptr;
  float scale = 1.0f;
  std::vector<int32_t> pages;
  int64_t length = 0;
  bool pinned = false;
  absl::Duration ttl;
  absl::Time last_used;
  uint64_t expiry_stamp = 0;  // of its live entry in the expiry heap (older ones are stale)
  bool busy = false;          // an extend holds a lease
  bool removed = false;       // closed or lost while busy: freed when the lease ends
  std::string parent_id;
  std::list<Session*>::iterator lru;
};

namespace {

constexpr int kMaxIdChars = 256;
// The loss reason of sessions whose pages were on a device the backend re-initialised.
constexpr absl::string_view kDeviceReset = "device reset";

std::string RandomInstance() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%08x", static_cast<uint32_t>(r ^ (r >> 32)));
}

struct ParsedId {
  absl::string_view owner, instance;
  uint64_t number = 0;
};

absl::StatusOr<ParsedId> ParseId(absl::string_view id) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_id must be \"<owner>/<instance>/<number>\" as CreateSession returned it (", why,
        "); was '", id.substr(0, kMaxIdChars), id.size() > kMaxIdChars ? "...'" : "'"));
  };
  if (id.empty()) return bad("empty");
  if (id.size() > kMaxIdChars) return bad("longer than 256 characters");
  const size_t last = id.rfind('/');
  if (last == absl::string_view::npos || last == 0) return bad("no '/'");
  const size_t mid = id.rfind('/', last - 1);
  if (mid == absl::string_view::npos || mid == 0) return bad("one '/' only");
  ParsedId p;
  p.owner = id.substr(0, mid);
  p.instance = id.substr(mid + 1, last - mid - 1);
  const absl::string_view number = id.substr(last + 1);
  if (p.instance.empty()) return bad("empty instance");
  for (char c : p.instance) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return bad("instance not hex");
  }
  if (number.empty() || number.size() > 19 ||
      !std::all_of(number.begin(), number.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(number, &p.number)) {
    return bad("number not decimal");
  }
  return p;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A failure of the backend itself, for an extend.
absl::Status BackendFailure(const kernels::Backend& backend, const absl::Status& status) {
  return absl::InternalError(
      absl::StrCat("backend ", backend.name(), " failed: ", status.message()));
}

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

// A failure of the pool's store (a device's) for session `id`: the session is lost when the
// store lost its pages (the device was re-initialised), else the extend fails as a failure of
// the backend.
absl::Status StoreFailure(const absl::Status& status, const kernels::PageStore& store,
                          const kernels::Backend& backend, const std::string& id) {
  if (store.lost()) return SessionManager::Lost(kDeviceReset, id);
  return absl::InternalError(
      absl::StrCat("backend ", backend.name(), " failed: ", status.message()));
}

}  // namespace

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    End(false);
    manager_ = std::exchange(other.manager_, nullptr);
    session_ = std::move(other.session_);
    new_tokens_ = other.new_tokens_;
    reserved_ = std::exchange(other.reserved_, false);
    computed_ = std::exchange(other.computed_, false);
    new_table_ = std::move(other.new_table_);
    fresh_ = std::move(other.fresh_);
    replaced_ = std::exchange(other.replaced_, std::nullopt);
  }
  return *this;
}

void Lease::End(bool keep) {
  if (manager_ == nullptr) return;
  manager_->EndLease(*this, keep);
  manager_ = nullptr;
  session_.reset();
}

absl::Status SessionManager::Lost(absl::string_view reason, absl::string_view id) {
  return absl::FailedPreconditionError(
      absl::StrCat("session lost (", reason, "): session '", id,
                   "' is no longer held by this server; create a new session and prefill it "
                   "again"));
}

std::string SessionManager::LostReason(const absl::Status& status) {
  constexpr absl::string_view kPrefix = "session lost (";
  if (status.code() != absl::StatusCode::kFailedPrecondition ||
      !absl::StartsWith(status.message(), kPrefix)) {
    return "";
  }
  const absl::string_view rest = status.message().substr(kPrefix.size());
  const size_t end = rest.find(')');
  return end == absl::string_view::npos ? "" : std::string(rest.substr(0, end));
}

bool SessionManager::IdOrder::operator()(const std::string& a, const std::string& b) const {
  const size_t ca = a.rfind('/') + 1, cb = b.rfind('/') + 1;  // npos + 1 = 0: no slash
  const absl::string_view pa(a.data(), ca), pb(b.data(), cb);
  if (pa != pb) return pa < pb;
  // Numbers without leading zeros (as issued) compare by length, then digit by digit; any other
  // text after the last slash still orders strictly (by length, then text).
  const size_t na = a.size() - ca, nb = b.size() - cb;
  if (na != nb) return na < nb;
  return absl::string_view(a).substr(ca) < absl::string_view(b).substr(cb);
}

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
      pool_(std::move(pool)) {}

SessionManager::~SessionManager() {
  MutexLock lock(&mu_);
  // Leases outlive nothing: the server finishes its jobs before the manager goes.
  for (auto& [id, s] : sessions_) {
    if (!s->busy) {
      FreePagesLocked(*s);
      pool_->Release(s->arena);
    }
  }
  sessions_.clear();
}

std::string SessionManager::owner() const {
  MutexLock lock(&mu_);
  return owner_;
}

void SessionManager::SetOwner(std::string owner) {
  MutexLock lock(&mu_);
  owner_ = std::move(owner);
}

void SessionManager::TouchLocked(Session& s) {
  s.last_used = Now();
  lru_.splice(lru_.end(), lru_, s.lru);
  ScheduleExpiryLocked(s);
}

void SessionManager::ScheduleExpiryLocked(Session& s) {
  s.expiry_stamp = ++next_expiry_stamp_;
  expiry_.push(Expiry{s.last_used + s.ttl, s.expiry_stamp, s.id});
  // Every use pushes an entry and leaves the previous one stale: rebuilt from the sessions when
  // stale ones outnumber live ones several times over (amortised O(1) a use).
  if (expiry_.size() > 4 * sessions_.size() + 1024) {
    std::vector<Expiry> live;
    live.reserve(sessions_.size());
    for (const auto& [id, session] : sessions_) {
      live.push_back(Expiry{session->last_used + session->ttl, session->expiry_stamp, id});
    }
    expiry_ = decltype(expiry_)(std::greater<Expiry>(), std::move(live));
  }
}

void SessionManager::FreePagesLocked(Session& s) {
  for (int32_t page : s.pages) pool_->Unref(s.arena, page);
  s.pages.clear();
}

void SessionManager::RemoveLocked(const std::shared_ptr<Session>& s,
                                  absl::string_view lost_reason) {
  sessions_.erase(s->id);
  lru_.erase(s->lru);
  if (s->pinned) {
    pinned_bytes_ -= static_cast<int64_t>(s->pages.size()) * s->arena->page_bytes();
    --pinned_sessions_;
  }
  if (!lost_reason.empty()) {
    if (lost_.emplace(s->id, std::string(lost_reason)).second) lost_order_.push_back(s->id);
    while (static_cast<int64_t>(lost_order_.size()) > options_.remembered_lost) {
      lost_.erase(lost_order_.front());
      lost_order_.pop_front();
    }
    if (metrics_ != nullptr)
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
  // The expiry heap's due entries only: O(log n) a session that expires, not a scan of all.
  // A stale entry (the session was used since, or is gone) is dropped; so is a busy session's:
  // its lease's end schedules it again.
  const absl::Time now = Now();
  while (!expiry_.empty() && expiry_.top().at <= now) {
    const Expiry e = expiry_.top();
    expiry_.pop();
    auto it = sessions_.find(e.id);
    if (it == sessions_.end() || it->second->expiry_stamp != e.stamp || it->second->busy) continue;
    RemoveLocked(std::shared_ptr<Session>(it->second), "expired");
  }
}

void SessionManager::DropLostLocked() {
  if (!pool_->AnyLost()) return;
  std::vector<std::shared_ptr<Session>> lost;
  for (const auto& [id, s] : sessions_) {
    if (s->arena->store()->lost()) lost.push_back(s);
  }
  for (const auto& s : lost) RemoveLocked(s, kDeviceReset);
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::FindLocked(const std::string& id) {
  DropLostLocked();
  auto parsed = ParseId(id);
  if (!parsed.ok()) return parsed.status();
  if (parsed->owner != owner_) {
    return absl::NotFoundError(absl::StrCat("session '", id, "' belongs to replica '",
                                            parsed->owner, "', not to this one ('", owner_,
                                            "'): send its calls there"));
  }
  if (parsed->instance != instance_) return Lost("restarted", id);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    std::shared_ptr<Session> s = it->second;
    if (!s->busy && Now() - s->last_used >= s->ttl) {
      RemoveLocked(s, "expired");
      return Lost("expired", id);
    }
    return s;
  }
  if (auto lost = lost_.find(id); lost != lost_.end()) return Lost(lost->second, id);
  return absl::NotFoundError(
      absl::StrCat("session '", id, "' does not exist (closed, or never created)"));
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
  st.cache_dtype = l.dtype;
  st.length = s.length;
  st.pages = static_cast<int64_t>(s.pages.size());
  for (int32_t p : s.pages) st.shared_pages += s.arena->refs(p) > 1 ? 1 : 0;
  st.bytes = st.pages * s.arena->page_bytes();
  st.pinned = s.pinned;
  st.idle_ttl = s.ttl;
  st.idle = Now() - s.last_used;
  st.parent_id = s.parent_id;
  st.scale = s.scale;
  return st;
}

absl::StatusOr<SessionState> SessionManager::AddLocked(std::shared_ptr<Session> s) {
  s->id = absl::StrCat(owner_, "/", instance_, "/", next_number_++);
  s->last_used = Now();
  s->lru = lru_.insert(lru_.end(), s.get());
  if (s->pinned) {
    ++pinned_sessions_;
    pinned_bytes_ += static_cast<int64_t>(s->pages.size()) * s->arena->page_bytes();
  }
  Session& ref = *s;
  sessions_.emplace(s->id, std::move(s));
  ScheduleExpiryLocked(ref);
  SessionState st = StateLocked(ref);
  return st;
}

absl::StatusOr<SessionState> SessionManager::Create(const SessionSpec& spec) {
  auto s = std::make_shared<Session>();
  PageLayout layout;
  layout.dtype = spec.cache_dtype;
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
  s->pinned = spec.pinned;
  s->ttl = spec.idle_ttl > absl::ZeroDuration() ? std::min(spec.idle_ttl, options_.idle_ttl)
                                                : options_.idle_ttl;
  MutexLock lock(&mu_);
  ExpireLocked();
  if (static_cast<int64_t>(sessions_.size()) >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", sessions_.size(),
                     " sessions, its limit (--max_sessions); close sessions first"));
  }
  if (spec.pinned &&
      pinned_bytes_ >= static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinned sessions hold ", pinned_bytes_, " bytes, their share of the pool (",
                     options_.max_pinned_fraction, " of ", pool_->bytes_total(),
                     " bytes, --session_max_pinned_fraction); create the session unpinned"));
  }
  DropLostLocked();  // a lost arena of this layout is made anew
  auto arena = pool_->Acquire(layout);
  if (!arena.ok()) return arena.status();
  s->arena = *arena;
  return AddLocked(std::move(s));
}

absl::StatusOr<SessionState> SessionManager::Fork(const std::string& id, bool pinned,
                                                  absl::Duration idle_ttl) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto parent = FindLocked(id);
  if (!parent.ok()) return parent.status();
  Session& p = **parent;
  TouchLocked(p);
  if (p.busy) {
    return absl::AbortedError(
        absl::StrCat("an extend of session '", id, "' is in flight; fork it after it returns"));
  }
  if (static_cast<int64_t>(sessions_.size()) >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", sessions_.size(),
                     " sessions, its limit (--max_sessions); close sessions first"));
  }
  const int64_t bytes = static_cast<int64_t>(p.pages.size()) * p.arena->page_bytes();
  if (pinned && pinned_bytes_ + bytes >
                    static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinning the fork would take pinned sessions over their share of the pool (",
                     options_.max_pinned_fraction, " of ", pool_->bytes_total(),
                     " bytes, --session_max_pinned_fraction); fork it unpinned"));
  }
  pool_->AddUser(p.arena);  // the fork shares the parent's pages
  Arena* const arena = p.arena;
  auto c = std::make_shared<Session>();
  c->module_name = p.module_name;
  c->module = p.module;
  c->num_heads = p.num_heads;
  c->arena = arena;
  c->scale = p.scale;
  c->pages = p.pages;
  for (int32_t page : c->pages) pool_->Ref(c->arena, page);
  c->length = p.length;
  c->pinned = pinned;
  c->ttl = idle_ttl > absl::ZeroDuration() ? std::min(idle_ttl, options_.idle_ttl) : p.ttl;
  c->parent_id = p.id;
  return AddLocked(std::move(c));
}

absl::Status SessionManager::Close(const std::string& id) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto s = FindLocked(id);
  if (!s.ok()) return s.status();
  RemoveLocked(*s, "");
  return absl::OkStatus();
}

absl::StatusOr<SessionState> SessionManager::Get(const std::string& id) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto s = FindLocked(id);
  if (!s.ok()) return s.status();
  SessionState st = StateLocked(**s);  // idle before this call
  TouchLocked(**s);
  return st;
}

std::vector<SessionState> SessionManager::List(const std::string& after, int limit, bool* more) {
  MutexLock lock(&mu_);
  ExpireLocked();
  std::vector<SessionState> out;
  auto it = after.empty() ? sessions_.begin() : sessions_.upper_bound(after);
  for (; it != sessions_.end() && static_cast<int>(out.size()) < limit; ++it) {
    out.push_back(StateLocked(*it->second));
  }
  *more = it != sessions_.end();
  return out;
}

PoolUsage SessionManager::Usage() {
  MutexLock lock(&mu_);
  ExpireLocked();
  PoolUsage u;
  u.pages_total = pool_->pages_total();
  u.pages_used = pool_->pages_used();
  u.bytes_total = pool_->bytes_total();
  u.bytes_used = pool_->bytes_used();
  u.sessions = static_cast<int64_t>(sessions_.size());
  u.pinned_sessions = pinned_sessions_;
  // A page's tokens count once however many sessions share it: the most any holder filled.
  absl::flat_hash_map<std::pair<const Arena*, int32_t>, int64_t> filled;
  const int64_t page_tokens = pool_->page_tokens();
  for (const auto& [id, s] : sessions_) {
    for (size_t i = 0; i < s->pages.size(); ++i) {
      const int64_t n = std::min<int64_t>(page_tokens, s->length - int64_t(i) * page_tokens);
      int64_t& f = filled[{s->arena, s->pages[i]}];
      f = std::max(f, n);
      if (s->pinned) ++u.pinned_pages;
    }
  }
  for (const auto& [page, n] : filled) {
    u.tokens += n;
    if (page.first->refs(page.second) > 1) ++u.shared_pages;
  }
  return u;
}

absl::Status SessionManager::BeginExtend(const std::string& id,
                                         std::optional<int64_t> expected_length, int64_t new_tokens,
                                         ExtendItem* item) {
  MutexLock lock(&mu_);
  auto found = FindLocked(id);
  if (!found.ok()) return found.status();
  Session& s = **found;
  TouchLocked(s);
  if (s.busy) {
    return absl::AbortedError(absl::StrCat(
        "an extend of session '", id,
        "' is already queued or computing; extends of one session are applied one at a time: "
        "wait for its answer"));
  }
  if (expected_length.has_value() && *expected_length != s.length) {
    return absl::AbortedError(absl::StrCat("expected_length is ", *expected_length,
                                           " but session '", id, "' holds ", s.length,
                                           " tokens; nothing was appended"));
  }
  if (s.length + new_tokens > options_.max_session_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session '", id, "' holds ", s.length, " tokens; ", new_tokens,
                     " more would exceed the server's limit of ", options_.max_session_tokens,
                     " (--max_sequence_length)"));
  }
  s.busy = true;
  item->lease.End(false);
  item->lease.manager_ = this;
  item->lease.session_ = *found;
  item->lease.new_tokens_ = new_tokens;
  item->new_tokens = new_tokens;
  item->module_name = s.module_name;
  item->module = s.module;
  item->num_heads = s.num_heads;
  item->num_kv_heads = s.arena->layout().num_kv_heads;
  item->head_dim = s.arena->layout().head_dim;
  item->v_head_dim = s.arena->layout().v_head_dim;
  return absl::OkStatus();
}

absl::Status SessionManager::ReserveLocked(ExtendItem& item) {
  Lease& lease = item.lease;
  Session& s = *lease.session_;
  Arena* arena = s.arena;
  const int64_t page_tokens = pool_->page_tokens();
  const int64_t have = static_cast<int64_t>(s.pages.size());
  const int64_t need = CeilDiv(s.length + lease.new_tokens_, page_tokens);
  const bool copy = s.length % page_tokens != 0 && arena->refs(s.pages.back()) > 1;
  const int64_t fresh = need - have + (copy ? 1 : 0);
  if (fresh == 0) {
    lease.new_table_ = s.pages;
    lease.reserved_ = true;
    return absl::OkStatus();
  }
  if (s.pinned && pinned_bytes_ + (need - have) * arena->page_bytes() >
                      static_cast<int64_t>(options_.max_pinned_fraction * pool_->bytes_total())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session '", s.id, "' is pinned, and pinned sessions would hold more than their share of ",
        "the pool (", options_.max_pinned_fraction, " of ", pool_->bytes_total(),
        " bytes, --session_max_pinned_fraction)"));
  }
  std::vector<int32_t> pages;
  bool ok = pool_->Allocate(arena, fresh, &pages);
  if (!ok && options_.when_full == WhenFull::kEvictLru) {
    std::vector<std::shared_ptr<Session>> victims;
    for (Session* v : lru_) {
      if (!v->busy && !v->pinned && v != &s) victims.push_back(sessions_.at(v->id));
    }
    for (const auto& v : victims) {
      RemoveLocked(v, "evicted");
      if ((ok = pool_->Allocate(arena, fresh, &pages))) break;
    }
  }
  if (!ok) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session pool is full (", pool_->bytes_used(), " of ", pool_->bytes_total(),
        " bytes used; ", fresh, " more pages of ", arena->page_bytes(), " bytes needed) and ",
        options_.when_full == WhenFull::kRefuse
            ? "the server refuses rather than evicts (--session_when_full=refuse)"
            : "no idle unpinned session is left to evict",
        "; close sessions or retry later"));
  }
  lease.new_table_ = s.pages;
  size_t next = 0;
  if (copy) {
    lease.replaced_ = s.pages.back();
    lease.new_table_.back() = pages[next++];
  }
  while (next < pages.size()) lease.new_table_.push_back(pages[next++]);
  lease.fresh_ = std::move(pages);
  lease.reserved_ = true;
  return absl::OkStatus();
}

void SessionManager::EndLease(Lease& lease, bool keep) {
  MutexLock lock(&mu_);
  Session& s = *lease.session_;
  const bool commit = keep && lease.computed_ && !s.removed;
  if (commit) {
    if (lease.replaced_.has_value()) pool_->Unref(s.arena, *lease.replaced_);
    if (s.pinned) {
      pinned_bytes_ +=
          (static_cast<int64_t>(lease.new_table_.size()) - static_cast<int64_t>(s.pages.size())) *
          s.arena->page_bytes();
    }
    s.pages = std::move(lease.new_table_);
    s.length += lease.new_tokens_;
    TouchLocked(s);
    if (metrics_ != nullptr) {
      metrics_->RecordSessionTokens(lease.new_tokens_ == 1 ? "decode" : "prefill",
                                    lease.new_tokens_);
    }
  } else {
    for (int32_t page : lease.fresh_) pool_->Unref(s.arena, page);
  }
  s.busy = false;
  if (s.removed) {
    FreePagesLocked(s);
    pool_->Release(s.arena);
  } else if (!commit) {
    // ExpireLocked drops a busy session's due entry: not used, it still expires at its time.
    ScheduleExpiryLocked(s);
  }
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
  std::vector<std::vector<float>> projected(items.size());
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
    if (lease.replaced_.has_value()) {
      item.status = store.CopyPage(*lease.replaced_, lease.new_table_[s.pages.size() - 1]);
      if (!item.status.ok()) {
        item.status = StoreFailure(item.status, store, *backend, s.id);
        continue;
      }
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
    item.attention.assign(static_cast<size_t>(L) * s.num_heads * l.v_head_dim, 0.0f);
    item.lse.assign(item.return_lse ? static_cast<size_t>(L) * s.num_heads : 0, 0.0f);
    // The new K and V in the cache dtype, row t * Hkv + h of the request going to the row of
    // (its page, h, its slot) in the store: one WriteRows per item (one copy to a device).
    const int64_t rows = L * l.num_kv_heads;
    std::vector<uint8_t> k_rows(static_cast<size_t>(L * k_row) * esize);
    std::vector<uint8_t> v_rows(static_cast<size_t>(L * v_row) * esize);
    ConvertRows(src_type, k, src_ld, cache, k_rows.data(), L, k_row, &tmp);
    ConvertRows(src_type, v, src_ld, cache, v_rows.data(), L, v_row, &tmp);
    std::vector<float>().swap(projected[i]);
    std::vector<int64_t> dst(static_cast<size_t>(rows));
    for (int64_t t = 0; t < L; ++t) {
      const int64_t pos = s.length + t;
      const int32_t page = lease.new_table_[pos / page_tokens];
      const int slot = static_cast<int>(pos % page_tokens);
      for (int h = 0; h < l.num_kv_heads; ++h) {
        dst[t * l.num_kv_heads + h] = store.shape().row(page, h, slot);
      }
    }
    item.status = store.WriteRows(k_rows.data(), v_rows.data(), dst);
    if (!item.status.ok()) item.status = StoreFailure(item.status, store, *backend, s.id);
  }

  // One PagedAttention call per (layout, query heads, scale, query dtype): the sequences of a
  // call share them. Every row's bits depend on its own sequence alone (paged_attention_params.h).
  // An item computes its next chunk: rows [done_rows, done_rows + rows) of its new tokens,
  // attending to the cache up to its last row (chunk boundaries depend on the item alone).
  std::map<std::tuple<const Arena*, int, uint32_t, kernels::DType>, std::vector<size_t>> groups;
  std::vector<ExtendItem*> finished_modules;
  std::vector<int64_t> rows_now(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const ExtendItem& item = *items[i];
    if (!item.status.ok() || item.done_rows >= item.new_tokens) continue;
    rows_now[i] = std::min(item.new_tokens - item.done_rows, options_.prefill_chunk_tokens);
    const Session& s = *item.lease.session_;
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
    groups[{s.arena, s.num_heads, scale_bits, item.q_dtype}].push_back(i);
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
    p.num_kv_heads = l.num_kv_heads;
    p.head_dim = l.head_dim;
    p.v_head_dim = l.v_head_dim;
    p.page_size = static_cast<int>(page_tokens);
    p.dtype = l.dtype;
    p.q_dtype = q_dtype;
    p.store = arena.store();
    p.k_pages = arena.store()->k_base();
    p.v_pages = arena.store()->v_base();
    p.scale = first.scale;
    int max_pages = 1;
    int64_t total_q = 0;
    for (size_t i : members) {
      max_pages = std::max(max_pages, static_cast<int>(items[i]->lease.new_table_.size()));
      total_q += rows_now[i];
    }
    p.max_pages_per_seq = max_pages;
    std::vector<int32_t> table(static_cast<size_t>(p.num_seqs) * max_pages, 0);
    std::vector<int32_t> kv_lens, q_lens, q_offsets;
    std::vector<uint8_t> q(static_cast<size_t>(total_q) * p.num_heads * p.head_dim * q_esize);
    int64_t offset = 0;
    for (size_t j = 0; j < members.size(); ++j) {
      const ExtendItem& item = *items[members[j]];
      const std::vector<int32_t>& t = item.lease.new_table_;
      std::copy(t.begin(), t.end(), table.begin() + static_cast<int64_t>(j) * max_pages);
      const int64_t rows = rows_now[members[j]];
      const int64_t row_bytes = int64_t{p.num_heads} * p.head_dim * static_cast<int64_t>(q_esize);
      kv_lens.push_back(static_cast<int32_t>(item.lease.session_->length + item.done_rows + rows));
      q_lens.push_back(static_cast<int32_t>(rows));
      q_offsets.push_back(static_cast<int32_t>(offset));
      std::memcpy(q.data() + offset * row_bytes, item.queries.data() + item.done_rows * row_bytes,
                  static_cast<size_t>(rows * row_bytes));
      offset += rows;
    }
    std::vector<float> out(static_cast<size_t>(total_q) * p.num_heads * p.v_head_dim);
    std::vector<float> lse(static_cast<size_t>(total_q) * p.num_heads);
    p.page_table = table.data();
    p.kv_lens = kv_lens.data();
    p.q_lens = q_lens.data();
    p.q_offsets = q_offsets.data();
    p.total_q = static_cast<int>(total_q);
    p.q = q.data();
    p.out = out.data();
    p.lse = lse.data();
    absl::Status status = backend->PagedAttention(p);
    for (size_t j = 0; j < members.size(); ++j) {
      ExtendItem& item = *items[members[j]];
      if (!status.ok()) {
        item.status = BackendFailure(*backend, status);
        continue;
      }
      const int64_t L = item.new_tokens;
      const int64_t rows = rows_now[members[j]];
      const float* o = out.data() + int64_t{q_offsets[j]} * p.num_heads * p.v_head_dim;
      std::copy(o, o + rows * p.num_heads * p.v_head_dim,
                item.attention.begin() + item.done_rows * p.num_heads * p.v_head_dim);
      if (item.return_lse) {
        const float* e = lse.data() + int64_t{q_offsets[j]} * p.num_heads;
        std::copy(e, e + rows * p.num_heads, item.lse.begin() + item.done_rows * p.num_heads);
      }
      item.done_rows += rows;
      if (item.done_rows < L) continue;  // more chunks to come
      std::vector<uint8_t>().swap(item.queries);
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
      std::vector<float>().swap(item->attention);
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
