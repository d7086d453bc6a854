// Buffers that session transfers reuse (session_mover.h sends from one, AcceptSessions gathers
// into one). A transfer is a session's pages in one string: allocated fresh for each move, its
// memory was first touched for each move on both replicas, and page faults were most of a
// move's time (tests/bench/MOVES.md). A few are kept, each of at most kMaxKeptBytes capacity;
// larger transfers use fresh memory. Thread-safe.
#ifndef ATTNSERVE_SERVER_TRANSPORT_TRANSFER_BUFFERS_H_
#define ATTNSERVE_SERVER_TRANSPORT_TRANSFER_BUFFERS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"

namespace attnserve::server {

class TransferBuffers {
 public:
  static constexpr size_t kKept = 2;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;

  // An empty buffer, with the capacity of one given back when there is one.
  std::string Take() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (kept_.empty()) return {};
    std::string b = std::move(kept_.back());
    kept_.pop_back();
    return b;
  }
  // Keeps `buffer`'s memory for a later Take (or frees it: too large, or enough kept).
  void Give(std::string buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    if (buffer.capacity() > kMaxKeptBytes) return;
    buffer.clear();
    MutexLock lock(&mu_);
    if (kept_.size() < kKept) kept_.push_back(std::move(buffer));
  }
  // Frees every kept buffer (the server is idle: its memory goes back to the system).
  void Release() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::string> released;
    MutexLock lock(&mu_);
    released.swap(kept_);
  }

 private:
  Mutex mu_;
  std::vector<std::string> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_TRANSFER_BUFFERS_H_
