// The decode sessions' settings (SessionOptions: the attnserve flags named session_*) and what
// one tenant may hold of them (TenantShares). server/sessions/session_manager.h uses them.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_OPTIONS_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "server/batching/clock.h"

namespace attnserve::kernels {
class Backend;
}

namespace attnserve::server::sessions {

enum class WhenFull { kEvictLru, kRefuse };

// What one tenant may hold of the sessions and the pool (server/transport/auth.h: the tenants
// file's sessions=, share= and max_share=). The defaults are no limit and no guarantee.
struct TenantShares {
  int64_t max_sessions = 0;  // 0: only the server's max_sessions
  // Fractions of the pool's bytes: a tenant holding at most `guaranteed` never loses a session
  // to another tenant's need for pages (eviction takes from tenants above theirs first, and
  // only from them); an extend that would take it over `max` is refused RESOURCE_EXHAUSTED.
  double guaranteed = 0.0;
  double max = 1.0;
  // Pinned sessions: at most this fraction of the pool's bytes (within the server's
  // max_pinned_fraction for all tenants together).
  double max_pinned = 1.0;
  // Calls in flight at once (server/core/tenant_calls.h); 0: no limit.
  int64_t max_in_flight = 0;
};

// The sessions' settings (flags of the attnserve binary with the same names, prefixed
// "session_"; GetServerInfo.sessions reports them).
struct SessionOptions {
  // ---- Affect behaviour ----
  // Bytes of the KV pool (K and V of every session). Default: 1 GiB. REQUIRES: > 0.
  int64_t pool_bytes = int64_t{1} << 30;
  // Tokens per page. Default: 128. REQUIRES: 1..4096.
  // Not the 16 common on GPUs: a decode step reads a page as one run per kv head (page_tokens x D
  // elements: 32 KiB of FLOAT16 at D = 128), and scattered runs read slower the shorter they are:
  // side by side, the CPU decode kernel read 16-bit caches faster with pages of 64 tokens than
  // of 16, and with 128 than with 64 on most machines (tests/bench/DECODE.md has the figures).
  // The cost: a session's last page is half empty on average (page_tokens / 2 tokens of K and V
  // per session), and a fork copies up to a page at the first write to a shared last page.
  int page_tokens = 128;
  // When an extend needs pages the pool does not have. Default: evict LRU idle sessions.
  WhenFull when_full = WhenFull::kEvictLru;
  // A session unused this long is lost (expired); the longest a session may ask for.
  // Default: 10 minutes. REQUIRES: > 0.
  absl::Duration idle_ttl = absl::Minutes(10);
  // Pinned sessions hold at most this fraction of pool_bytes. Default: 0.5. REQUIRES: 0..1.
  double max_pinned_fraction = 0.5;
  // Most sessions held at once (Limits.max_sessions). Default: 65536. REQUIRES: > 0.
  int64_t max_sessions = 65536;
  // The most new tokens of one extend computed in one batch: a longer prefill is computed a
  // chunk per batch and goes back to the queue between chunks, so that decode steps queued
  // meanwhile are not held up by it for longer than a chunk. Default: 512. REQUIRES: > 0.
  int64_t prefill_chunk_tokens = 512;
  // Longest session in tokens (Limits.max_sequence_length). Default: 65536. REQUIRES: > 0.
  int64_t max_session_tokens = 65536;
  // Lost ids remembered (beyond it the oldest answer NOT_FOUND). Default: 65536.
  int64_t remembered_lost = 65536;
  // Distinct head layouts (kv heads, head dims, dtype) the pool serves at once. Default: 16.
  int max_layouts = 16;
  // The replica's address in session ids; set by the server host (host:port) when empty.
  std::string owner;
  // The shares of a tenant (called with the manager's lock held: must not call back into it).
  // Null: every tenant has the defaults.
  std::function<TenantShares(const std::string& tenant)> shares_of;
  // A tenant's metrics label (bounded; server/metrics/metrics.h). Same rules as shares_of.
  // Null: "anonymous" for "", "other" otherwise.
  std::function<std::string(const std::string& tenant)> tenant_label;

  // ---- Injected ----
  // The clock of idle times. Not owned. Default: nullptr, the wall clock.
  batching::Clock* clock = nullptr;
  // The backend the extends compute on (Compute's): the pages live where its NewPageStore puts
  // them (device memory for CUDA). Not owned; outlives the manager. Default: nullptr, host
  // memory.
  kernels::Backend* backend = nullptr;
};

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_OPTIONS_H_
