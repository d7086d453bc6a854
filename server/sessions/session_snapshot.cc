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
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/sessions/session_codec.h"
#include "server/sessions/session_decoder.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

absl::Status IoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

std::string SessionManager::TransferHeadLocked(const std::vector<const Arena*>& layouts,
                                               uint64_t records) const {
  std::string out;
  TransferWriter head(&out);
  head.Put(kTransferMagic, sizeof kTransferMagic);
  head.Num(kTransferVersion);
  head.Str(owner_);
  head.Num(static_cast<uint32_t>(pool_->page_tokens()));
  head.Num(static_cast<uint32_t>(layouts.size()));
  for (const Arena* a : layouts) {
    const PageLayout& l = a->layout();
    head.Num<int32_t>(l.num_kv_heads);
    head.Num<int32_t>(l.head_dim);
    head.Num<int32_t>(l.v_head_dim);
    head.Num(static_cast<uint8_t>(l.dtype));
  }
  head.Num(records);
  return out;
}

SessionManager::Encoding SessionManager::EncodeLocked(const std::vector<const Session*>& sessions,
                                                      const std::vector<Encoding::Page>& sent) {
  Encoding e;
  // Layouts and distinct pages, in the order of the sessions, after those sent already.
  std::vector<const Arena*> layouts;
  std::map<const Arena*, uint32_t> layout_index;
  std::map<std::pair<const Arena*, int32_t>, uint64_t> page_index;
  for (const Encoding::Page& p : sent) {
    page_index.emplace(std::make_pair(p.arena, p.page), page_index.size());
  }
  const uint64_t first = page_index.size();
  for (const Session* s : sessions) {
    auto [at, added] = layout_index.emplace(s->arena, static_cast<uint32_t>(layouts.size()));
    if (added) layouts.push_back(s->arena);
    for (size_t i = s->dropped; i < s->pages.size(); ++i) {
      if (page_index.emplace(std::make_pair(s->arena, s->pages[i]), first + e.pages.size())
              .second) {
        e.pages.push_back({s->arena, s->pages[i], at->second});
      }
    }
  }
  e.head = TransferHeadLocked(layouts, e.pages.size());
  TransferWriter w(&e.tail);
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
    w.Num(static_cast<uint32_t>(s.aliases.size()));
    for (const std::string& alias : s.aliases) w.Str(alias);
  }
  return e;
}

absl::Status SessionManager::WritePages(const std::vector<Encoding::Page>& pages, TransferWriter& w,
                                        const std::function<absl::Status(bool last)>& flush) {
  for (const Encoding::Page& p : pages) {
    const PageLayout& l = p.arena->layout();
    w.Num(p.layout);
    // Straight into the writer's buffer (or a page's worth of scratch for a file).
    const size_t kb = static_cast<size_t>(l.k_page_bytes());
    char* k = w.Reserve(kb + static_cast<size_t>(l.v_page_bytes()));
    if (absl::Status st = p.arena->store()->ReadPage(p.page, k, k + kb); !st.ok()) return st;
    w.Commit();
    if (flush != nullptr) {
      if (absl::Status st = flush(/*last=*/false); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status SessionManager::WriteEncoding(const Encoding& e, TransferWriter& w,
                                           const std::function<absl::Status(bool last)>& flush) {
  w.Put(e.head.data(), e.head.size());
  if (absl::Status st = WritePages(e.pages, w, flush); !st.ok()) return st;
  w.Put(e.tail.data(), e.tail.size());
  w.Trailer();
  if (flush != nullptr) return flush(/*last=*/true);
  return absl::OkStatus();
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
  const Encoding encoding = EncodeLocked(sessions);
  const absl::Status read_status = WriteEncoding(encoding, w);
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
  SnapshotStats stats;
  stats.sessions = static_cast<int64_t>(sessions.size());
  stats.pages = static_cast<int64_t>(encoding.pages.size());
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
  TransferDecoder decoder(*this, what, module_named);
  absl::Status st = decoder.HeadLocked(r);
  if (absl::IsOutOfRange(st)) st = absl::DataLossError(st.message());  // verified: a bug
  if (st.ok() && decoder.owner() != owner_) {
    st = absl::FailedPreconditionError(
        absl::StrCat(what, " holds the sessions of replica '", decoder.owner(),
                     "', not of this one ('", owner_, "'): their ids name it (--session_owner)"));
  }
  std::vector<char> k, v;
  while (st.ok() && decoder.records_taken() < decoder.records()) {
    const uint32_t layout = r.Num<uint32_t>();
    if (layout == kMoreRecords) {
      st = decoder.MoreRecords(r.Num<uint64_t>());
      continue;
    }
    auto bytes = decoder.PageBytes(layout);
    if (!bytes.ok()) {
      st = bytes.status();
      break;
    }
    k.resize(bytes->first);
    v.resize(bytes->second);
    if (!r.Get(k.data(), k.size()) || !r.Get(v.data(), v.size())) {
      st = absl::DataLossError(absl::StrCat(what, " does not parse (its checksum holds)"));
      break;
    }
    const TransferDecoder::Target to = decoder.NextPageLocked(layout);
    if (to.store != nullptr) st = to.store->WritePage(to.page, k.data(), v.data());
  }
  if (st.ok()) st = decoder.SessionsLocked(r);
  if (!st.ok()) {
    decoder.AbandonLocked();
    return st;
  }
  std::vector<std::shared_ptr<Session>> sessions = decoder.CommitLocked();
  SnapshotStats stats = decoder.stats();
  stats.bytes = static_cast<int64_t>(r.position() + kTransferTrailer);
  // The sessions join the table in the order they were created, with their ids.
  for (std::shared_ptr<Session>& s : sessions) {
    s->last_used = Now();  // idle from the restore on
    // Its ids on the replicas it came from answer "moved" here again.
    for (const std::string& alias : s->aliases) table_->RememberMoved(alias, s->tenant, s->id);
    table_->Add(std::move(s));
  }
  return stats;
}

}  // namespace attnserve::server::sessions
