// A validated request on its way to a backend: views of the request's input bytes, output
// buffers, the kernel parameters pointing into them, and how to answer the caller.
//
// A Job is built from a proto request by request_builder.h (which validates everything a
// caller controls), computed by an Executor as part of a batch, and answered exactly once
// through its Call (server/core/call.h).
#ifndef ATTNSERVE_SERVER_CORE_JOB_H_
#define ATTNSERVE_SERVER_CORE_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "kernels/attention_params.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"
#include "server/core/call.h"
#include "server/core/module_registry.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_manager.h"

namespace attnserve::server {

// Where a job's time went (filled by the Executor, reported as the proto Timing).
struct JobTiming {
  absl::Time arrival;        // request parsed and validated
  absl::Time compute_start;  // its batch started computing
  absl::Time compute_end;    // its batch finished
  int batch_size = 0;
  std::string backend;
};

// kSessionExtend: ExtendSession (one item) or ExtendSessions (one item per step).
enum class JobKind { kAttend, kMultiHead, kSessionExtend };

struct Job {
  JobKind kind = JobKind::kAttend;
  kernels::DType dtype = kernels::DType::kFloat32;  // of inputs and outputs on the wire

  // The request whose tensor bytes the kernel parameters' inputs view, as they came in (no
  // copy, no conversion: each backend converts where it computes). Set by the service; the
  // request builders leave it to the caller, whose request must then outlive the job.
  std::shared_ptr<const google::protobuf::Message> request;
  int64_t input_bytes = 0;  // of those views

  // Owned buffers; params point into them (and into `request` and `module`).
  std::vector<uint8_t> mask;  // BOOL mask as sent
  std::vector<int32_t> key_lengths;
  std::vector<float> alibi_slopes;       // [H] when options.alibi is set
  std::vector<float> out;                // dense output
  std::vector<float> weights;            // dense [B, H, Lq, Lk] when asked for
  std::shared_ptr<const Module> module;  // kMultiHead only

  kernels::AttentionParams attend;      // kAttend
  kernels::MultiHeadParams multi_head;  // kMultiHead
  // The kind of attention a kAttend or kMultiHead job computes.
  kernels::AttentionKind attention_kind() const {
    return kind == JobKind::kAttend ? attend.kind : multi_head.kind;
  }

  // kSessionExtend: the extends, each holding its session's lease (or failed validation, with
  // its status set and no lease); `session_batch` for ExtendSessions (per-item results, the job
  // itself OK). The manager computes them (SessionManager::Compute).
  std::vector<std::unique_ptr<sessions::ExtendItem>> session_items;
  bool session_batch = false;
  sessions::SessionManager* session_manager = nullptr;

  // Shapes of the outputs, for the response.
  std::vector<int64_t> out_shape;
  std::vector<int64_t> weights_shape;  // empty when weights were not asked for

  // Batching signature: jobs may share a batch only when their signatures are equal.
  std::string signature;
  int64_t tokens = 0;  // query rows: B·Lq (the unit of max_batch_tokens)
  int64_t bytes = 0;   // memory the job holds while queued (inputs and outputs)
  double flops = 0;

  JobTiming timing;

  // The request this job computes: its deadline, cancellation, metrics and its one answer.
  // Set by the service before the job is submitted (request_builder leaves it null).
  std::unique_ptr<Call> call;

  // The batcher's task concept (server/batching/batch_task.h).
  bool IsCancelled() const { return call != nullptr && call->IsCancelled(); }
  absl::Time deadline() const {
    return call != nullptr ? call->deadline() : absl::InfiniteFuture();
  }
  int64_t num_tokens() const { return tokens; }
  int64_t num_bytes() const { return bytes; }
  uint64_t owner() const { return call != nullptr ? call->caller().connection() : 0; }

  // Answers the caller (exactly once; later calls are ignored). On OK the outputs and timing
  // are final. `drop`: why the job was not computed, from whoever decided it.
  // Sessions' leases end first (rolled back unless the executor committed them), so that the
  // caller's next extend, sent as soon as this answer arrives, finds the session free.
  void Finish(absl::Status status, std::optional<metrics::DropReason> drop = std::nullopt) {
    for (auto& item : session_items) item->lease.End(false);
    if (call != nullptr) call->Finish(std::move(status), this, drop);
  }
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_JOB_H_
