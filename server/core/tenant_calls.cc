#include "server/core/tenant_calls.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::Status TenantCalls::Acquire(const std::string& tenant, bool* counted) {
  *counted = false;
  const int64_t limit = limit_of_ ? limit_of_(tenant) : 0;
  if (limit <= 0) return absl::OkStatus();
  int64_t held;
  {
    MutexLock lock(&mu_);
    int64_t& n = in_flight_[tenant];
    held = n;
    if (n < limit) {
      ++n;
      *counted = true;
      return absl::OkStatus();
    }
  }
  if (on_refused_) on_refused_(tenant);
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant '", tenant, "' has ", held, " calls in flight, its limit (in_flight=", limit,
      " in the tenants file); wait for answers before sending more"));
}

void TenantCalls::Release(const std::string& tenant) {
  MutexLock lock(&mu_);
  auto it = in_flight_.find(tenant);
  if (it == in_flight_.end()) return;
  if (--it->second <= 0) in_flight_.erase(it);
}

}  // namespace attnserve::server
