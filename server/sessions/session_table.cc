#include "server/sessions/session_table.h"

#include <utility>

namespace attnserve::server::sessions {

void SessionTable::Add(std::shared_ptr<Session> s) {
  Session& ref = *s;
  ref.serial = next_serial_++;
  ref.lru = lru_.insert(lru_.end(), &ref);
  by_serial_.emplace(ref.serial, &ref);
  by_tenant_[ref.tenant].emplace(ref.serial, &ref);
  if (ref.pinned) {
    ++pinned_sessions_;
    pinned_bytes_ += ref.bytes();
  }
  by_id_.emplace(ref.id, std::move(s));
  ScheduleExpiry(ref);
}

std::shared_ptr<Session> SessionTable::Remove(const Session& s, absl::string_view lost_reason) {
  auto it = by_id_.find(s.id);
  if (it == by_id_.end()) return nullptr;
  std::shared_ptr<Session> held = std::move(it->second);
  by_id_.erase(it);
  by_serial_.erase(s.serial);
  if (auto t = by_tenant_.find(s.tenant); t != by_tenant_.end()) {
    t->second.erase(s.serial);
    if (t->second.empty()) by_tenant_.erase(t);
  }
  lru_.erase(s.lru);
  if (s.pinned) {
    pinned_bytes_ -= s.bytes();
    --pinned_sessions_;
  }
  if (!lost_reason.empty()) Remember(s.id, LostId{std::string(lost_reason), s.tenant, ""});
  return held;
}

void SessionTable::RememberMoved(const std::string& id, const std::string& tenant,
                                 const std::string& moved_to) {
  Remember(id, LostId{"moved", tenant, moved_to});
}

void SessionTable::Remember(const std::string& id, LostId lost) {
  if (auto [it, added] = lost_.emplace(id, lost); added) {
    lost_order_.push_back(id);
  } else {
    it->second = std::move(lost);
  }
  while (static_cast<int64_t>(lost_order_.size()) > remembered_lost_) {
    lost_.erase(lost_order_.front());
    lost_order_.pop_front();
  }
}

std::shared_ptr<Session> SessionTable::Find(const std::string& id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

const SessionTable::LostId* SessionTable::FindLost(const std::string& id) const {
  auto it = lost_.find(id);
  return it == lost_.end() ? nullptr : &it->second;
}

const SessionTable::Ordered* SessionTable::of(const std::string& tenant) const {
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? nullptr : &it->second;
}

void SessionTable::Touch(Session& s, absl::Time now) {
  s.last_used = now;
  lru_.splice(lru_.end(), lru_, s.lru);
  ScheduleExpiry(s);
}

void SessionTable::ScheduleExpiry(Session& s) {
  s.expiry_stamp = ++next_expiry_stamp_;
  expiry_.push(Expiry{s.last_used + s.ttl, s.expiry_stamp, s.id});
  // Every use pushes an entry and leaves the previous one stale: rebuilt from the sessions when
  // stale ones outnumber live ones several times over (amortised O(1) a use).
  if (expiry_.size() > 4 * by_id_.size() + 1024) {
    std::vector<Expiry> live;
    live.reserve(by_id_.size());
    for (const auto& [id, session] : by_id_) {
      live.push_back(Expiry{session->last_used + session->ttl, session->expiry_stamp, id});
    }
    expiry_ = decltype(expiry_)(std::greater<Expiry>(), std::move(live));
  }
}

std::vector<std::shared_ptr<Session>> SessionTable::Due(absl::Time now) {
  // A stale entry (the session was used since, or is gone) is dropped; so is a busy session's.
  std::vector<std::shared_ptr<Session>> due;
  while (!expiry_.empty() && expiry_.top().at <= now) {
    const Expiry e = expiry_.top();
    expiry_.pop();
    auto it = by_id_.find(e.id);
    if (it == by_id_.end() || it->second->expiry_stamp != e.stamp || it->second->busy) continue;
    due.push_back(it->second);
  }
  return due;
}

}  // namespace attnserve::server::sessions
