// Calls in flight per tenant (server/transport/auth.h), against each tenant's limit: the
// tenants file's in_flight=<n> (sessions::TenantShares::max_in_flight). A tenant at its limit is
// refused RESOURCE_EXHAUSTED at once, before its request is read, so that one tenant's burst
// cannot fill the queue that every tenant shares. Thread-safe.
#ifndef ATTNSERVE_SERVER_CORE_TENANT_CALLS_H_
#define ATTNSERVE_SERVER_CORE_TENANT_CALLS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/mutex.h"

namespace attnserve::server {

class TenantCalls {
 public:
  // `limit_of(tenant)`: its most calls in flight, 0 for no limit. Null: no tenant has one.
  // `on_refused(tenant)` (may be null) hears of each refusal (the metrics).
  explicit TenantCalls(std::function<int64_t(const std::string& tenant)> limit_of,
                       std::function<void(const std::string& tenant)> on_refused = nullptr)
      : limit_of_(std::move(limit_of)), on_refused_(std::move(on_refused)) {}

  // OK, or RESOURCE_EXHAUSTED naming the limit. *counted: the call was counted (a tenant with
  // a limit), and Release must follow, once.
  absl::Status Acquire(const std::string& tenant, bool* counted) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::function<int64_t(const std::string&)> limit_of_;
  const std::function<void(const std::string&)> on_refused_;
  Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_TENANT_CALLS_H_
