// The interface the server computes attention through. One implementation per device family:
// the reference path (kernels/reference.h), the fast CPU path (kernels/cpu/) and CUDA
// (kernels/cuda/).
//
// A call takes a variable-length batch: independent requests of different shapes, computed in
// one call without padding to the longest. Each item is a complete problem (its own B, lengths,
// options); items share nothing but the call.
//
// Batch invariance: the bits an item produces must not depend on the other items of the batch,
// their order, or the number of threads. The server promises this to its callers.
//
// Thread-safety: implementations are thread-safe; Attend and MultiHead may be called
// concurrently from several threads.
#ifndef ATTNSERVE_KERNELS_BACKEND_H_
#define ATTNSERVE_KERNELS_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention_params.h"
#include "kernels/multi_head.h"
#include "kernels/page_store.h"
#include "kernels/paged_attention_params.h"

namespace attnserve::kernels {

struct DeviceInfo {
  std::string name;          // e.g. "cpu: Intel(R) Xeon(R) ... (2 threads, avx512)"
  int64_t memory_bytes = 0;  // total memory of the device, 0 when unknown
};

// Memory of one device at the time of asking, for metrics.
struct DeviceMemory {
  std::string device;      // short stable id, e.g. "cuda:0"
  int64_t used_bytes = 0;  // used on the device by every process
  int64_t total_bytes = 0;
  int64_t pool_bytes = 0;  // held by this backend: its buffers and pages of page stores it made
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Short stable name, reported in Timing.backend and metrics labels ("reference", "cpu",
  // "cuda").
  virtual std::string name() const = 0;
  // The devices this backend computes on.
  virtual std::vector<DeviceInfo> devices() const = 0;
  // Memory of the devices with memory of their own (none for CPU backends). Cheap; called at
  // every metrics scrape.
  virtual std::vector<DeviceMemory> device_memory() const { return {}; }
  // How FLOAT32 requests are computed, one line for GetServerInfo.
  virtual std::string float32_precision() const { return "fp32: float32 arithmetic"; }

  // Whether Attend and MultiHead compute AttentionKind::kLinear items (attention_params.h). A
  // backend without must never be given one (the server gives them to its CPU backend).
  virtual bool supports_linear_attention() const { return true; }
  // Whether PagedAttention takes score modifications (a window, soft-capping, ALiBi:
  // PagedAttentionParams::modifies_scores). The server refuses sessions with them when not.
  virtual bool supports_session_score_mods() const { return true; }

  // Computes every item of `batch`, writing each item's out (and weights when non-null).
  // REQUIRES: every item is valid (the server validates requests before they get here);
  // kernels do not re-check what a request controls. Returns non-OK only for failures of the
  // backend itself (for example a device error); then the contents of the outputs are
  // unspecified and the caller fails the whole batch.
  virtual absl::Status Attend(absl::Span<const AttentionParams> batch) = 0;
  virtual absl::Status MultiHead(absl::Span<const MultiHeadParams> batch) = 0;
  // Computes every projection of `batch` (multi_head.h: the projections of module sessions,
  // whose attention runs through PagedAttention), in the precision of this backend's MultiHead
  // projections for the same input type. Batch invariant as Attend: a row's bits depend on its
  // item alone. Same contract as Attend. The default is the reference (float64 arithmetic,
  // rounded to float32 once).
  virtual absl::Status Project(absl::Span<const ProjectionParams> batch);
  // Attention of the sequences' new queries over their paged KV caches (decode sessions;
  // paged_attention_params.h), writing p.out (and p.lse when non-null). The pages are in
  // p.store when it is set (a store of this backend's NewPageStore), else in host memory; every
  // other pointer of p is host memory. Same contract as Attend: REQUIRES a valid p; non-OK only
  // for failures of the backend itself. The default is the reference (ReferencePagedAttention,
  // float64 arithmetic), which REQUIRES host pages.
  virtual absl::Status PagedAttention(const PagedAttentionParams& p);
  // Memory for the pages of one layout, where this backend's PagedAttention reads them best
  // (page_store.h). The default is host memory (NewHostPageStore).
  virtual absl::StatusOr<std::unique_ptr<PageStore>> NewPageStore(const PageStoreShape& shape);
  // Gives back the memory this backend keeps between calls for its next one (per-thread scratch)
  // and no call is using now; returns the bytes freed. The server calls it once it has been
  // idle for a while (server/server_host.cc). Thread-safe, also while calls run: they keep
  // theirs. The default keeps nothing.
  virtual int64_t ReleaseIdleMemory() { return 0; }
};

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_BACKEND_H_
