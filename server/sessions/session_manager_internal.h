// The parts of SessionManager shared by its files: session_manager.cc (create, fork, close,
// describe, list over the session table, session_table.h), session_lease.cc (an extend's lease:
// the reservation of its pages as a transaction, committed or rolled back), pool_shares.cc (the
// pool's usage, tenants' shares, eviction), extend_runner.cc (Compute: the new keys and values
// into the pages, the attention in chunks, the projections of module sessions) and
// linear_extend.cc (linear-attention sessions' state). Not for use outside server/sessions/.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_INTERNAL_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_INTERNAL_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "kernels/multi_head.h"
#include "kernels/page_store.h"
#include "server/sessions/kv_pool.h"
#include "server/sessions/session_table.h"

namespace attnserve::server::sessions {

// The loss reason of sessions whose pages were on a device the backend re-initialised.
inline constexpr absl::string_view kDeviceReset = "device reset";

// A failure of the backend itself, for an extend (extend_runner.cc).
absl::Status BackendFailure(const kernels::Backend& backend, const absl::Status& status);
// A failure of the pool's store (a device's) for session `id`: the session is lost when the
// store lost its pages (the device was re-initialised), else the extend fails as a failure of
// the backend.
absl::Status StoreFailure(const absl::Status& status, const kernels::PageStore& store,
                          const kernels::Backend& backend, const std::string& id);

// Pages of a linear-attention session's state in its float32 layout (linear_extend.cc): z and
// the D rows of S of each kv head, one per slot.
inline int64_t LinearStatePages(const PageLayout& layout) {
  return (int64_t{layout.head_dim} + layout.page_size - 1) / layout.page_size;
}

// Ids: "<owner>/<instance>/<key>" (session_ids.cc).
inline constexpr int kMaxIdChars = 256;
// A fresh instance name for this process: a restarted server knows its predecessor's ids.
std::string RandomInstance();
struct ParsedId {
  absl::string_view owner, instance, key;
};
// A fresh key: 128 bits from the system's CSPRNG, as 32 lowercase hex digits.
std::string RandomKey();
// The parts of a well-formed id; INVALID_ARGUMENT naming what is wrong otherwise.
absl::StatusOr<ParsedId> ParseId(absl::string_view id);

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_MANAGER_INTERNAL_H_
