// SessionManager::WriteSnapshot and RestoreSnapshot: a replica's sessions on local disk across a
// restart (issue 33, "restart without loss"), in the transfer format of session_codec.h; and the
// encoding and decoding of that format, which moves (session_move.cc) share.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/sessions/session_codec.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

absl::Status IoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status SessionManager::EncodeLocked(const std::vector<const Session*>& sessions,
                                          TransferWriter& w) {
  // Layouts and distinct pages, in the order of the sessions.
  std::vector<const Arena*> layouts;
  std::map<const Arena*, uint32_t> layout_index;
  std::vector<std::pair<const Arena*, int32_t>> pages;
  std::map<std::pair<const Arena*, int32_t>, uint64_t> page_index;
  for (const Session* s : sessions) {
    if (layout_index.emplace(s->arena, layouts.size()).second) layouts.push_back(s->arena);
    for (size_t i = s->dropped; i < s->pages.size(); ++i) {
      if (page_index.emplace(std::make_pair(s->arena, s->pages[i]), pages.size()).second) {
        pages.emplace_back(s->arena, s->pages[i]);
      }
    }
  }
  w.Put(kTransferMagic, sizeof kTransferMagic);
  w.Num(kTransferVersion);
  w.Str(owner_);
  w.Num(static_cast<uint32_t>(pool_->page_tokens()));
  w.Num(static_cast<uint32_t>(layouts.size()));
  for (const Arena* a : layouts) {
    const PageLayout& l = a->layout();
    w.Num<int32_t>(l.num_kv_heads);
    w.Num<int32_t>(l.head_dim);
    w.Num<int32_t>(l.v_head_dim);
    w.Num(static_cast<uint8_t>(l.dtype));
  }
  w.Num(static_cast<uint64_t>(pages.size()));
  std::vector<uint8_t> k, v;
  for (const auto& [arena, page] : pages) {
    const PageLayout& l = arena->layout();
    k.resize(static_cast<size_t>(l.k_page_bytes()));
    v.resize(static_cast<size_t>(l.v_page_bytes()));
    if (absl::Status st = arena->store()->ReadPage(page, k.data(), v.data()); !st.ok()) return st;
    w.Num(layout_index[arena]);
    w.Put(k.data(), k.size());
    w.Put(v.data(), v.size());
  }
  w.Num(static_cast<uint64_t>(sessions.size()));
  for (const Session* sp : sessions) {
    const Session& s = *sp;
    w.Str(s.id);
    w.Str(s.tenant);
    w.Str(s.module_name);
    w.Num(s.module != nullptr ? ModuleChecksum(*s.module) : uint32_t{0});
    w.Num<int32_t>(s.num_heads);
    w.Num(layout_index[s.arena]);
    w.Num(static_cast<uint8_t>(s.cache_dtype));
    w.Num(s.scale);
    w.Num<int32_t>(s.mods.window_left);
    w.Num(s.mods.softcap);
    w.Num(static_cast<uint32_t>(s.mods.alibi_slopes.size()));
    for (float slope : s.mods.alibi_slopes) w.Num(slope);
    w.Num(static_cast<uint8_t>(s.kind));
    w.Num(static_cast<uint8_t>(s.feature_map));
    w.Num(static_cast<uint8_t>(s.pinned));
    w.Num(absl::ToInt64Microseconds(s.ttl));
    w.Str(s.parent_id);
    w.Num(s.length);
    w.Num(s.dropped);
    w.Num(static_cast<uint32_t>(s.pages.size()));
    for (size_t i = 0; i < s.pages.size(); ++i) {
      w.Num(i < static_cast<size_t>(s.dropped) ? kNoPage
                                               : page_index[std::make_pair(s.arena, s.pages[i])]);
    }
  }
  w.Trailer();
  return absl::OkStatus();
}

void SessionManager::ReleaseDecodedLocked(Session& s) {
  for (size_t i = s.dropped; i < s.pages.size(); ++i) pool_->Unref(s.arena, s.pages[i]);
  pool_->Release(s.arena);
}

absl::StatusOr<SessionManager::Decoded> SessionManager::DecodeLocked(
    TransferReader& r, const std::string& what, const ModuleNamed& module_named) {
  char magic[sizeof kTransferMagic];
  r.Get(magic, sizeof magic);
  const uint32_t version = r.Num<uint32_t>();
  if (!r.ok() || std::memcmp(magic, kTransferMagic, sizeof kTransferMagic) != 0 ||
      version != kTransferVersion) {
    return absl::DataLossError(
        absl::StrCat(what, " is not an attnserve session transfer of version ", kTransferVersion));
  }
  Decoded out;
  out.owner = r.Str();
  const uint32_t page_tokens = r.Num<uint32_t>();
  if (page_tokens != static_cast<uint32_t>(pool_->page_tokens())) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has pages of ", page_tokens, " tokens; this server's are of ",
                     pool_->page_tokens(), " (--session_page_tokens)"));
  }

  // What the decode holds until it returns, released on any failure: the arenas, the pages
  // (in the transfer's order; {null, -1} for one the pool had no room for) and the sessions.
  std::vector<Arena*> arenas;
  std::vector<std::pair<Arena*, int32_t>> pages;
  std::vector<std::shared_ptr<Session>>& decoded = out.sessions;
  const auto fail = [&](absl::Status st) {
    mu_.AssertHeld();  // called with it held, below
    for (const auto& [arena, page] : pages) {
      if (arena != nullptr) pool_->Unref(arena, page);
    }
    for (const auto& s : decoded) ReleaseDecodedLocked(*s);
    for (Arena* a : arenas) pool_->Release(a);
    return st;
  };
  const auto torn = [&] {
    return fail(absl::DataLossError(absl::StrCat(what, " does not parse (its checksum holds)")));
  };
  const uint32_t n_layouts = r.Num<uint32_t>();
  for (uint32_t i = 0; i < n_layouts && r.ok(); ++i) {
    PageLayout l;
    l.num_kv_heads = r.Num<int32_t>();
    l.head_dim = r.Num<int32_t>();
    l.v_head_dim = r.Num<int32_t>();
    l.dtype = static_cast<kernels::DType>(r.Num<uint8_t>());
    l.page_size = static_cast<int>(page_tokens);
    if (!r.ok() || l.num_kv_heads < 1 || l.head_dim < 1 || l.v_head_dim < 1) return torn();
    auto arena = pool_->Acquire(l);
    if (!arena.ok()) return fail(arena.status());
    arenas.push_back(*arena);
  }
  const uint64_t n_pages = r.Num<uint64_t>();
  std::vector<uint8_t> k, v;
  std::vector<int64_t> rows;
  for (uint64_t i = 0; i < n_pages && r.ok(); ++i) {
    const uint32_t li = r.Num<uint32_t>();
    if (!r.ok() || li >= arenas.size()) return torn();
    Arena* arena = arenas[li];
    const PageLayout& l = arena->layout();
    k.resize(static_cast<size_t>(l.k_page_bytes()));
    v.resize(static_cast<size_t>(l.v_page_bytes()));
    if (!r.Get(k.data(), k.size()) || !r.Get(v.data(), v.size())) return torn();
    std::vector<int32_t> got;
    if (!pool_->Allocate(arena, 1, &got)) {  // a smaller pool than the writer's
      pages.emplace_back(nullptr, -1);
      continue;
    }
    pages.emplace_back(arena, got[0]);
    rows.clear();
    for (int h = 0; h < l.num_kv_heads; ++h) {
      for (int slot = 0; slot < l.page_size; ++slot) rows.push_back(l.row(got[0], h, slot));
    }
    if (absl::Status st = arena->store()->WriteRows(k.data(), v.data(), rows); !st.ok()) {
      return fail(st);
    }
  }
  const uint64_t n_sessions = r.Num<uint64_t>();
  for (uint64_t i = 0; i < n_sessions && r.ok(); ++i) {
    auto s = std::make_shared<Session>();
    s->id = r.Str();
    s->tenant = r.Str();
    s->module_name = r.Str();
    const uint32_t module_crc = r.Num<uint32_t>();
    s->num_heads = r.Num<int32_t>();
    const uint32_t li = r.Num<uint32_t>();
    s->cache_dtype = static_cast<kernels::DType>(r.Num<uint8_t>());
    s->scale = r.Num<float>();
    s->mods.window_left = r.Num<int32_t>();
    s->mods.softcap = r.Num<float>();
    const uint32_t n_slopes = r.Num<uint32_t>();
    if (!r.ok() || n_slopes > (1u << 16)) return torn();
    for (uint32_t j = 0; j < n_slopes; ++j) s->mods.alibi_slopes.push_back(r.Num<float>());
    s->kind = static_cast<kernels::AttentionKind>(r.Num<uint8_t>());
    s->feature_map = static_cast<kernels::FeatureMap>(r.Num<uint8_t>());
    s->pinned = r.Num<uint8_t>() != 0;
    s->ttl = absl::Microseconds(r.Num<int64_t>());
    s->parent_id = r.Str();
    s->length = r.Num<int64_t>();
    s->dropped = r.Num<int64_t>();
    const uint32_t n = r.Num<uint32_t>();
    if (!r.ok() || li >= arenas.size() || n > n_pages + static_cast<uint64_t>(s->dropped) ||
        s->dropped < 0 || s->dropped > n) {
      return torn();
    }
    s->arena = arenas[li];
    s->pages.resize(n);
    std::string why;
    for (uint32_t j = 0; j < n; ++j) {
      const uint64_t ref = r.Num<uint64_t>();
      if (j < s->dropped) {
        if (ref != kNoPage) return torn();
        s->pages[j] = kDroppedPage;
      } else if (ref >= pages.size() ||
                 (pages[ref].first != nullptr && pages[ref].first != s->arena)) {
        return torn();
      } else if (pages[ref].first == nullptr) {
        why = "the pool has no room for its pages";
      } else {
        s->pages[j] = pages[ref].second;
      }
    }
    if (!r.ok()) return torn();
    if (!s->module_name.empty()) {
      std::shared_ptr<const kernels::MultiHeadWeights> m = module_named(s->module_name);
      if (m == nullptr) {
        why = absl::StrCat("module '", s->module_name, "' is not loaded");
      } else if (ModuleChecksum(*m) != module_crc) {
        why = absl::StrCat("module '", s->module_name, "' has other weights");
      }
      s->module = std::move(m);
    }
    if (!why.empty()) {
      if (++out.stats.lost == 1) out.stats.why_lost = absl::StrCat("session '", s->id, "': ", why);
      continue;
    }
    pool_->AddUser(s->arena);
    for (size_t j = s->dropped; j < s->pages.size(); ++j) pool_->Ref(s->arena, s->pages[j]);
    decoded.push_back(std::move(s));
  }
  if (!r.ok()) return torn();

  // The pages keep the references of their sessions only (one no session refers to is free
  // again).
  for (const auto& [arena, page] : pages) {
    if (arena == nullptr) continue;
    pool_->Unref(arena, page);
    ++out.stats.pages;
  }
  for (Arena* a : arenas) pool_->Release(a);
  out.stats.sessions = static_cast<int64_t>(decoded.size());
  out.stats.bytes = static_cast<int64_t>(r.position() + kTransferTrailer);
  return out;
}

absl::StatusOr<SessionManager::SnapshotStats> SessionManager::WriteSnapshot(
    const std::string& path) {
  MutexLock lock(&mu_);
  ExpireLocked();  // an expired session is not written
  std::vector<const Session*> sessions;
  for (const auto& [serial, s] : table_->all()) {
    if (s->busy) {
      return absl::FailedPreconditionError(
          absl::StrCat("session '", s->id, "' has an extend in flight: snapshot after the drain"));
    }
    sessions.push_back(s);
  }

  // The callers' keys and values: readable by this user only, whatever the umask.
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("creating", tmp);
  // (A file left by an earlier, killed drain would keep its mode otherwise.)
  FILE* f = fchmod(fd, 0600) == 0 ? fdopen(fd, "wb") : nullptr;
  if (f == nullptr) {
    close(fd);
    return IoError("opening", tmp);
  }
  TransferWriter w(f);
  const absl::Status read_status = EncodeLocked(sessions, w);
  const bool written = w.ok() && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const int saved_errno = errno;
  std::fclose(f);
  if (!read_status.ok() || !written) {
    std::remove(tmp.c_str());
    if (!read_status.ok()) return read_status;
    errno = saved_errno;
    return IoError("writing", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const absl::Status st = IoError("renaming the snapshot to", path);
    std::remove(tmp.c_str());
    return st;
  }
  // The rename itself reaches the disk with the directory's entry.
  const std::string dir = path.find('/') == std::string::npos
                              ? std::string(".")
                              : path.substr(0, std::max<size_t>(path.rfind('/'), 1));
  if (int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  std::set<std::pair<const Arena*, int32_t>> distinct;
  for (const Session* s : sessions) {
    for (size_t i = s->dropped; i < s->pages.size(); ++i) distinct.emplace(s->arena, s->pages[i]);
  }
  SnapshotStats stats;
  stats.sessions = static_cast<int64_t>(sessions.size());
  stats.pages = static_cast<int64_t>(distinct.size());
  stats.bytes = static_cast<int64_t>(w.bytes());
  return stats;
}

absl::StatusOr<SessionManager::SnapshotStats> SessionManager::RestoreSnapshot(
    const std::string& path, const ModuleNamed& module_named) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no session snapshot ", path));
    return IoError("opening", path);
  }
  struct Closer {
    FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  const std::string what = absl::StrCat("session snapshot ", path);
  if (absl::Status st = VerifyTransfer(f, what); !st.ok()) return st;

  MutexLock lock(&mu_);
  if (table_->size() != 0) {
    return absl::FailedPreconditionError("sessions exist already: restore before the first call");
  }
  TransferReader r(f);
  auto decoded = DecodeLocked(r, what, module_named);
  if (!decoded.ok()) return decoded.status();
  if (decoded->owner != owner_) {
    for (const auto& s : decoded->sessions) ReleaseDecodedLocked(*s);
    return absl::FailedPreconditionError(
        absl::StrCat(what, " holds the sessions of replica '", decoded->owner,
                     "', not of this one ('", owner_, "'): their ids name it (--session_owner)"));
  }
  // The sessions join the table in the order they were created, with their ids.
  for (std::shared_ptr<Session>& s : decoded->sessions) {
    s->last_used = Now();  // idle from the restore on
    table_->Add(std::move(s));
  }
  return decoded->stats;
}

}  // namespace attnserve::server::sessions
