// What the request fuzz targets share: the server's own validation
// (server/transport/request_builder.h) with small limits, so that every accepted request is also
// computed (on the reference backend) in a few milliseconds. A request the builder accepts must
// compute without error: its params describe memory the job owns or views (AddressSanitizer checks
// every read and write).
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_REQUESTS_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_REQUESTS_H_

#include <memory>

#include "attnserve/v1/attention.pb.h"
#include "kernels/reference.h"
#include "server/core/module_registry.h"
#include "server/transport/request_builder.h"

namespace attnserve::fuzz {

inline const server::Limits& FuzzLimits() {
  static const server::Limits limits = [] {
    server::Limits l;
    l.max_tensor_elements = 4096;
    l.max_sequence_length = 64;
    return l;
  }();
  return limits;
}

// Holds the demo module (d_model 64, 4 heads), named "demo".
inline const server::ModuleRegistry& FuzzModules() {
  static const server::ModuleRegistry* modules = [] {
    auto* r = new server::ModuleRegistry;
    if (!r->Add(server::DemoModule(), /*replace=*/false).ok()) __builtin_trap();
    return r;
  }();
  return *modules;
}

inline void Compute(const server::Job& job) {
  kernels::ReferenceBackend backend;
  const absl::Status s = job.kind == server::JobKind::kAttend ? backend.Attend({job.attend})
                                                              : backend.MultiHead({job.multi_head});
  if (!s.ok()) __builtin_trap();  // validated, yet the backend refused it
}

inline void BuildAndCompute(const v1::AttendRequest& request) {
  auto job = server::BuildAttendJob(request, FuzzLimits());
  if (job.ok()) Compute(**job);
}

inline void BuildAndCompute(const v1::MultiHeadAttentionRequest& request) {
  auto job = server::BuildMultiHeadJob(request, FuzzModules(), FuzzLimits());
  if (job.ok()) Compute(**job);
}

}  // namespace attnserve::fuzz

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_REQUESTS_H_
