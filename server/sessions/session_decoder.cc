#include "server/sessions/session_decoder.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/sessions/session_manager_internal.h"

namespace attnserve::server::sessions {

absl::Status TransferDecoder::Torn() const {
  return absl::DataLossError(absl::StrCat(what_, " does not parse (its checksum holds)"));
}

absl::Status TransferDecoder::HeadLocked(TransferReader& r) {
  m_.mu_.AssertHeld();
  char magic[sizeof kTransferMagic];
  r.Get(magic, sizeof magic);
  const uint32_t version = r.Num<uint32_t>();
  std::string owner = r.Str();
  const uint32_t page_tokens = r.Num<uint32_t>();
  const uint32_t n_layouts = r.Num<uint32_t>();
  std::vector<PageLayout> layouts;
  for (uint32_t i = 0; i < n_layouts && r.ok() && i < 4096; ++i) {
    PageLayout l;
    l.num_kv_heads = r.Num<int32_t>();
    l.head_dim = r.Num<int32_t>();
    l.v_head_dim = r.Num<int32_t>();
    l.dtype = static_cast<kernels::DType>(r.Num<uint8_t>());
    l.page_size = static_cast<int>(page_tokens);
    layouts.push_back(l);
  }
  const uint64_t n_pages = r.Num<uint64_t>();
  if (!r.ok()) {
    // Either more bytes are on their way (an import) or the transfer ends here (torn): the
    // caller knows which.
    return absl::OutOfRangeError(absl::StrCat(what_, " ends inside its header"));
  }
  if (std::memcmp(magic, kTransferMagic, sizeof kTransferMagic) != 0) {
    return absl::DataLossError(absl::StrCat(what_, " is not an attnserve session transfer"));
  }
  if (version < kOldestTransferVersion || version > kTransferVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(what_, " is of version ", version, "; this server reads versions ",
                     kOldestTransferVersion, " to ", kTransferVersion,
                     " (a snapshot or transfer written by another release of attnserve)"));
  }
  if (page_tokens != static_cast<uint32_t>(m_.pool_->page_tokens())) {
    return absl::FailedPreconditionError(
        absl::StrCat(what_, " has pages of ", page_tokens, " tokens; this server's are of ",
                     m_.pool_->page_tokens(), " (--session_page_tokens)"));
  }
  if (layouts.size() != n_layouts) return Torn();
  for (const PageLayout& l : layouts) {
    if (l.num_kv_heads < 1 || l.head_dim < 1 || l.v_head_dim < 1) return Torn();
  }
  for (const PageLayout& l : layouts) {
    auto arena = m_.pool_->Acquire(l);
    if (!arena.ok()) {
      AbandonLocked();
      return arena.status();
    }
    arenas_.push_back(*arena);
  }
  owner_ = std::move(owner);
  version_ = version;
  n_records_ = n_pages;
  return absl::OkStatus();
}

absl::Status TransferDecoder::MoreRecords(uint64_t n) {
  ++records_taken_;
  if (n > (uint64_t{1} << 40)) return Torn();
  n_records_ += n;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<size_t, size_t>> TransferDecoder::PageBytes(uint32_t layout) const {
  if (layout >= arenas_.size()) return Torn();
  const PageLayout& l = arenas_[layout]->layout();
  return std::make_pair(static_cast<size_t>(l.k_page_bytes()),
                        static_cast<size_t>(l.v_page_bytes()));
}

TransferDecoder::Target TransferDecoder::NextPageLocked(uint32_t layout) {
  m_.mu_.AssertHeld();
  Arena* arena = arenas_[layout];
  ++records_taken_;
  std::vector<int32_t> got;
  if (!m_.pool_->Allocate(arena, 1, &got)) {  // a smaller pool than the sender's
    pages_.emplace_back(nullptr, -1);
    return {};
  }
  pages_.emplace_back(arena, got[0]);
  return {arena->store(), got[0]};
}

absl::Status TransferDecoder::SessionsLocked(TransferReader& r) {
  m_.mu_.AssertHeld();
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
    if (!r.ok() || n_slopes > (1u << 16)) return Torn();
    for (uint32_t j = 0; j < n_slopes; ++j) s->mods.alibi_slopes.push_back(r.Num<float>());
    s->kind = static_cast<kernels::AttentionKind>(r.Num<uint8_t>());
    s->feature_map = static_cast<kernels::FeatureMap>(r.Num<uint8_t>());
    s->pinned = r.Num<uint8_t>() != 0;
    s->ttl = absl::Microseconds(r.Num<int64_t>());
    s->parent_id = r.Str();
    s->length = r.Num<int64_t>();
    s->dropped = r.Num<int64_t>();
    const uint32_t n = r.Num<uint32_t>();
    if (!r.ok() || li >= arenas_.size() || n > pages_.size() + static_cast<uint64_t>(s->dropped) ||
        s->dropped < 0 || s->dropped > n) {
      return Torn();
    }
    s->arena = arenas_[li];
    s->pages.resize(n);
    std::string why;
    for (uint32_t j = 0; j < n; ++j) {
      const uint64_t ref = r.Num<uint64_t>();
      if (j < s->dropped) {
        if (ref != kNoPage) return Torn();
        s->pages[j] = kDroppedPage;
      } else if (ref >= pages_.size() ||
                 (pages_[ref].first != nullptr && pages_[ref].first != s->arena)) {
        return Torn();
      } else if (pages_[ref].first == nullptr) {
        why = "the pool has no room for its pages";
      } else {
        s->pages[j] = pages_[ref].second;
      }
    }
    if (version_ >= 3) {
      const uint32_t n_aliases = r.Num<uint32_t>();
      if (!r.ok() || n_aliases > Session::kMaxAliases) return Torn();
      for (uint32_t j = 0; j < n_aliases; ++j) s->aliases.push_back(r.Str());
    }
    if (!r.ok()) return Torn();
    if (!s->module_name.empty()) {
      std::shared_ptr<const kernels::MultiHeadWeights> w = module_named_(s->module_name);
      if (w == nullptr) {
        why = absl::StrCat("module '", s->module_name, "' is not loaded");
      } else if (ModuleChecksum(*w) != module_crc) {
        why = absl::StrCat("module '", s->module_name, "' has other weights");
      }
      s->module = std::move(w);
    }
    if (!why.empty()) {
      if (++stats_.lost == 1) stats_.why_lost = absl::StrCat("session '", s->id, "': ", why);
      continue;
    }
    m_.pool_->AddUser(s->arena);
    for (size_t j = s->dropped; j < s->pages.size(); ++j) m_.pool_->Ref(s->arena, s->pages[j]);
    sessions_.push_back(std::move(s));
  }
  return r.ok() ? absl::OkStatus() : Torn();
}

std::vector<std::shared_ptr<Session>> TransferDecoder::CommitLocked() {
  m_.mu_.AssertHeld();
  // The pages keep the references of their sessions only (one no session refers to is free
  // again), the arenas their sessions' use.
  for (const auto& [arena, page] : pages_) {
    if (arena == nullptr) continue;
    m_.pool_->Unref(arena, page);
    ++stats_.pages;
  }
  pages_.clear();
  for (Arena* a : arenas_) m_.pool_->Release(a);
  arenas_.clear();
  stats_.sessions = static_cast<int64_t>(sessions_.size());
  return std::move(sessions_);
}

void TransferDecoder::AbandonLocked() {
  m_.mu_.AssertHeld();
  for (const auto& [arena, page] : pages_) {
    if (arena != nullptr) m_.pool_->Unref(arena, page);
  }
  pages_.clear();
  for (const auto& s : sessions_) {
    for (size_t i = s->dropped; i < s->pages.size(); ++i) m_.pool_->Unref(s->arena, s->pages[i]);
    m_.pool_->Release(s->arena);
  }
  sessions_.clear();
  for (Arena* a : arenas_) m_.pool_->Release(a);
  arenas_.clear();
}

}  // namespace attnserve::server::sessions
