// SessionManager::WriteSnapshot and RestoreSnapshot: a replica's sessions on local disk across a
// restart (issue 33, "restart without loss"). One file, little-endian:
//
//   "ATTNSNP1"  u32 version (1)  str owner  u32 page_tokens
//   u32 layouts   { i32 num_kv_heads, head_dim, v_head_dim  u8 dtype }
//   u64 pages     { u32 layout  K bytes (k_page_bytes)  V bytes (v_page_bytes) }
//   u64 sessions  { str id, tenant, module  u32 module checksum  i32 num_heads  u32 layout
//                   u8 cache dtype  f32 scale  i32 window_left  f32 softcap  u32 n  f32 slopes[n]
//                   u8 kind  u8 feature map  u8 pinned  i64 ttl_us  str parent  i64 length
//                   i64 dropped  u32 n  u64 page[n] (an index above, or kNoPage: dropped) }
//   "ATTNEND!"  u64 bytes before the trailer  u32 CRC-32 of them
//
// (str: u32 length, then the bytes.) A page forks share is written once. The trailer's length
// and checksum are verified over the whole file before anything is restored: a torn file (the
// process killed while writing leaves the temporary file, never this one; a disk that lies
// could still truncate it) or a corrupt one is refused whole, DATA_LOSS, and its sessions are
// lost, never wrong.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {
namespace {

constexpr char kMagic[8] = {'A', 'T', 'T', 'N', 'S', 'N', 'P', '1'};
constexpr char kEnd[8] = {'A', 'T', 'T', 'N', 'E', 'N', 'D', '!'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kNoPage = ~uint64_t{0};

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

// The weights' checksum: a module session comes back only to the same weights.
uint32_t ModuleChecksum(const kernels::MultiHeadWeights& w) {
  uint32_t crc = Crc(0, &w.d_model, sizeof w.d_model);
  crc = Crc(crc, &w.num_heads, sizeof w.num_heads);
  for (const std::vector<float>* v : {&w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o}) {
    crc = Crc(crc, v->data(), v->size() * sizeof(float));
  }
  return crc;
}

absl::Status IoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Buffered writes with a running CRC.
class Writer {
 public:
  explicit Writer(FILE* f) : f_(f) {}
  void Put(const void* data, size_t n) {
    if (!ok_) return;
    crc_ = Crc(crc_, data, n);
    bytes_ += n;
    ok_ = std::fwrite(data, 1, n, f_) == n;
  }
  template <typename T>
  void Num(T v) {
    Put(&v, sizeof v);
  }
  void Str(const std::string& s) {
    Num(static_cast<uint32_t>(s.size()));
    Put(s.data(), s.size());
  }
  bool ok() const { return ok_; }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  FILE* f_;
  bool ok_ = true;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

// Reads of a verified file; a read past its end (a file that lies about its contents while its
// checksum holds: a bug, not a disk) fails the restore.
class Reader {
 public:
  explicit Reader(FILE* f) : f_(f) {}
  bool Get(void* data, size_t n) {
    ok_ = ok_ && std::fread(data, 1, n, f_) == n;
    return ok_;
  }
  template <typename T>
  T Num() {
    T v{};
    Get(&v, sizeof v);
    return v;
  }
  std::string Str() {
    const uint32_t n = Num<uint32_t>();
    if (!ok_ || n > (1u << 20)) {
      ok_ = false;
      return "";
    }
    std::string s(n, '\0');
    Get(s.data(), n);
    return s;
  }
  bool ok() const { return ok_; }

 private:
  FILE* f_;
  bool ok_ = true;
};

// Verifies the trailer against the file: its length and the CRC of everything before it.
absl::Status Verify(FILE* f, const std::string& path) {
  if (std::fseek(f, 0, SEEK_END) != 0) return IoError("seeking in", path);
  const long size = std::ftell(f);
  constexpr long kTrailer = sizeof kEnd + sizeof(uint64_t) + sizeof(uint32_t);
  if (size < static_cast<long>(sizeof kMagic) + kTrailer) {
    return absl::DataLossError(absl::StrCat("session snapshot ", path, " is torn: ", size,
                                            " bytes, shorter than its header and trailer"));
  }
  char end[sizeof kEnd];
  uint64_t length = 0;
  uint32_t crc = 0;
  std::fseek(f, size - kTrailer, SEEK_SET);
  Reader tail(f);
  tail.Get(end, sizeof end);
  length = tail.Num<uint64_t>();
  crc = tail.Num<uint32_t>();
  if (!tail.ok() || std::memcmp(end, kEnd, sizeof kEnd) != 0 ||
      length != static_cast<uint64_t>(size - kTrailer)) {
    return absl::DataLossError(absl::StrCat("session snapshot ", path,
                                            " is torn: its trailer is missing or names another "
                                            "length (",
                                            size, " bytes)"));
  }
  std::rewind(f);
  std::vector<char> buffer(size_t{1} << 20);
  uint32_t actual = 0;
  for (uint64_t left = length; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    if (std::fread(buffer.data(), 1, n, f) != n) return IoError("reading", path);
    actual = Crc(actual, buffer.data(), n);
    left -= n;
  }
  if (actual != crc) {
    return absl::DataLossError(absl::StrCat("session snapshot ", path,
                                            " is corrupt: its CRC-32 is ", actual,
                                            ", its trailer says ", crc));
  }
  std::rewind(f);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SessionManager::SnapshotStats> SessionManager::WriteSnapshot(
    const std::string& path) {
  MutexLock lock(&mu_);
  ExpireLocked();  // an expired session is not written
  for (const auto& [serial, s] : table_->all()) {
    if (s->busy) {
      return absl::FailedPreconditionError(
          absl::StrCat("session '", s->id, "' has an extend in flight: snapshot after the drain"));
    }
  }
  // Layouts and distinct pages, in the order of the sessions.
  std::vector<const Arena*> layouts;
  std::map<const Arena*, uint32_t> layout_index;
  std::vector<std::pair<const Arena*, int32_t>> pages;
  std::map<std::pair<const Arena*, int32_t>, uint64_t> page_index;
  for (const auto& [serial, s] : table_->all()) {
    if (layout_index.emplace(s->arena, layouts.size()).second) layouts.push_back(s->arena);
    for (size_t i = s->dropped; i < s->pages.size(); ++i) {
      if (page_index.emplace(std::make_pair(s->arena, s->pages[i]), pages.size()).second) {
        pages.emplace_back(s->arena, s->pages[i]);
      }
    }
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
  Writer w(f);
  w.Put(kMagic, sizeof kMagic);
  w.Num(kVersion);
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
  absl::Status read_status;
  for (const auto& [arena, page] : pages) {
    const PageLayout& l = arena->layout();
    k.resize(static_cast<size_t>(l.k_page_bytes()));
    v.resize(static_cast<size_t>(l.v_page_bytes()));
    read_status = arena->store()->ReadPage(page, k.data(), v.data());
    if (!read_status.ok()) break;
    w.Num(layout_index[arena]);
    w.Put(k.data(), k.size());
    w.Put(v.data(), v.size());
  }
  w.Num(static_cast<uint64_t>(table_->size()));
  for (const auto& [serial, sp] : table_->all()) {
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
  const uint64_t length = w.bytes();
  const uint32_t crc = w.crc();
  w.Put(kEnd, sizeof kEnd);
  w.Num(length);
  w.Num(crc);
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
  if (int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
    fsync(fd);
    close(fd);
  }
  SnapshotStats stats;
  stats.sessions = table_->size();
  stats.pages = static_cast<int64_t>(pages.size());
  stats.bytes = static_cast<int64_t>(length + sizeof kEnd + sizeof length + sizeof crc);
  return stats;
}

absl::StatusOr<SessionManager::SnapshotStats> SessionManager::RestoreSnapshot(
    const std::string& path,
    const std::function<std::shared_ptr<const kernels::MultiHeadWeights>(const std::string&)>&
        module_named) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no session snapshot ", path));
    return IoError("opening", path);
  }
  struct Closer {
    FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  if (absl::Status st = Verify(f, path); !st.ok()) return st;

  MutexLock lock(&mu_);
  if (table_->size() != 0) {
    return absl::FailedPreconditionError("sessions exist already: restore before the first call");
  }
  Reader r(f);
  char magic[sizeof kMagic];
  r.Get(magic, sizeof magic);
  const uint32_t version = r.Num<uint32_t>();
  if (!r.ok() || std::memcmp(magic, kMagic, sizeof kMagic) != 0 || version != kVersion) {
    return absl::DataLossError(
        absl::StrCat(path, " is not an attnserve session snapshot of version ", kVersion));
  }
  const std::string owner = r.Str();
  const uint32_t page_tokens = r.Num<uint32_t>();
  if (owner != owner_) {
    return absl::FailedPreconditionError(
        absl::StrCat("session snapshot ", path, " holds the sessions of replica '", owner,
                     "', not of this one ('", owner_, "'): their ids name it (--session_owner)"));
  }
  if (page_tokens != static_cast<uint32_t>(pool_->page_tokens())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session snapshot ", path, " has pages of ", page_tokens, " tokens; this server's are of ",
        pool_->page_tokens(), " (--session_page_tokens)"));
  }

  // What the restore holds until it commits, released on any failure: the arenas, the pages
  // (in the file's order; {null, -1} for one the pool had no room for) and the sessions.
  std::vector<Arena*> arenas;
  std::vector<std::pair<Arena*, int32_t>> pages;
  std::vector<std::shared_ptr<Session>> restored;
  const auto fail = [&](absl::Status st) {
    mu_.AssertHeld();  // called with it held, below
    for (const auto& [arena, page] : pages) {
      if (arena != nullptr) pool_->Unref(arena, page);
    }
    for (const auto& s : restored) {
      for (size_t i = s->dropped; i < s->pages.size(); ++i) pool_->Unref(s->arena, s->pages[i]);
      pool_->Release(s->arena);
    }
    for (Arena* a : arenas) pool_->Release(a);
    return st;
  };
  const auto torn = [&] {
    return fail(absl::DataLossError(
        absl::StrCat("session snapshot ", path, " does not parse (its checksum holds)")));
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
  SnapshotStats stats;
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
      if (++stats.lost == 1) stats.why_lost = absl::StrCat("session '", s->id, "': ", why);
      continue;
    }
    pool_->AddUser(s->arena);
    for (size_t j = s->dropped; j < s->pages.size(); ++j) pool_->Ref(s->arena, s->pages[j]);
    restored.push_back(std::move(s));
  }
  if (!r.ok()) return torn();

  // Commit: the pages keep the references of their sessions only (one no session refers to is
  // free again), and the sessions join the table in the order they were created.
  for (const auto& [arena, page] : pages) {
    if (arena == nullptr) continue;
    pool_->Unref(arena, page);
    ++stats.pages;
  }
  for (Arena* a : arenas) pool_->Release(a);
  stats.sessions = static_cast<int64_t>(restored.size());
  stats.bytes =
      std::ftell(f) + static_cast<long>(sizeof kEnd + sizeof(uint64_t) + sizeof(uint32_t));
  for (std::shared_ptr<Session>& s : restored) {
    s->last_used = Now();  // idle from the restore on
    table_->Add(std::move(s));
  }
  return stats;
}

}  // namespace attnserve::server::sessions
