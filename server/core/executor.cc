#include "server/core/executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/batching/batch_queue.h"

namespace attnserve::server {

std::vector<std::unique_ptr<Job>> Executor::Run(std::vector<std::unique_ptr<Job>> batch) {
  if (!batch.empty() && batch.front()->kind == JobKind::kSessionExtend) {
    const absl::Time start = absl::Now();
    for (auto& job : batch) {
      job->timing.compute_start = start;
      if (metrics_ != nullptr) metrics_->ObserveQueueTime(start - job->timing.arrival);
    }
    return RunExtends(std::move(batch), start);
  }
  Answer(Compute(std::move(batch)));
  return {};
}

kernels::Backend* Executor::BackendFor(const Job& job) const {
  return fallback_ != nullptr && job.attention_kind() == kernels::AttentionKind::kLinear ? fallback_
                                                                                         : backend_;
}

Executor::Computed Executor::Compute(std::vector<std::unique_ptr<Job>> batch) {
  const absl::Time start = absl::Now();
  Computed computed;
  std::vector<std::unique_ptr<Job>>& live = computed.jobs;
  live.reserve(batch.size());
  // The batcher dropped what was cancelled or expired when it formed the batch (by
  // batching::Undeliverable, the one rule); whatever the deadline does from here on,
  // Call::Finish counts.
  for (auto& job : batch) {
    job->timing.compute_start = start;
    if (metrics_ != nullptr) metrics_->ObserveQueueTime(start - job->timing.arrival);
    live.push_back(std::move(job));
  }
  if (live.empty()) return computed;

  absl::Status& status = computed.status;
  kernels::Backend* backend = BackendFor(*live.front());  // a batch is of one signature
  if (live.front()->kind == JobKind::kAttend) {
    std::vector<kernels::AttentionParams> params;
    params.reserve(live.size());
    for (const auto& job : live) params.push_back(job->attend);
    status = backend->Attend(params);
  } else {
    std::vector<kernels::MultiHeadParams> params;
    params.reserve(live.size());
    for (const auto& job : live) params.push_back(job->multi_head);
    status = backend->MultiHead(params);
  }
  if (!status.ok()) {
    status = absl::InternalError(
        absl::StrCat("backend ", backend->name(), " failed: ", status.message()));
  }
  const absl::Time end = absl::Now();
  const std::string backend_name = backend->name();
  if (metrics_ != nullptr) {
    int64_t tokens = 0;
    double flops = 0;
    for (const auto& job : live) {
      tokens += job->tokens;
      flops += job->flops;
    }
    metrics_->ObserveBatch(static_cast<int64_t>(live.size()), tokens);
    metrics_->ForBackend(backend_name).ObserveCompute(end - start, status.ok() ? flops : 0);
  }
  for (auto& job : live) {
    job->timing.compute_end = end;
    job->timing.batch_size = static_cast<int>(live.size());
    job->timing.backend = backend_name;
  }
  return computed;
}

void Executor::Answer(Computed computed) {
  for (auto& job : computed.jobs) {
    job->Finish(computed.status);
    job.reset();  // its buffers go now, not after the whole batch has been answered
  }
}

std::vector<std::unique_ptr<Job>> Executor::RunExtends(std::vector<std::unique_ptr<Job>> live,
                                                       absl::Time start) {
  std::vector<std::unique_ptr<Job>> next_chunk;
  std::vector<sessions::ExtendItem*> items;
  sessions::SessionManager* manager = live.front()->session_manager;
  for (const auto& job : live) {
    for (const auto& item : job->session_items) {
      if (item->lease.active() && item->status.ok()) items.push_back(item.get());
    }
  }
  manager->Compute(items, backend_);
  const absl::Time end = absl::Now();
  const std::string backend_name = backend_->name();
  if (metrics_ != nullptr) {
    int64_t tokens = 0;
    for (const auto& job : live) tokens += job->tokens;
    metrics_->ObserveBatch(static_cast<int64_t>(live.size()), tokens);
    metrics_->ForBackend(backend_name).ObserveCompute(end - start, 0);
  }
  for (auto& job : live) {
    job->timing.compute_end = end;
    job->timing.batch_size = static_cast<int>(items.size());
    job->timing.backend = backend_name;
    // An answer that can no longer reach its caller appends nothing: Call::Finish will answer
    // DEADLINE_EXCEEDED or CANCELLED, and the caller must be able to retry.
    const bool deliverable = !batching::Undeliverable(*job, absl::Now()).has_value();
    int64_t pending_tokens = 0;
    for (const auto& item : job->session_items) {
      if (item->pending()) {
        pending_tokens +=
            std::min(item->new_tokens - item->done_rows, manager->options().prefill_chunk_tokens);
      }
    }
    if (pending_tokens > 0 && deliverable) {
      // A prefill's next chunk queues behind what arrived meanwhile (decode steps first).
      job->tokens = pending_tokens;
      next_chunk.push_back(std::move(job));
      continue;
    }
    for (auto& item : job->session_items) item->lease.End(deliverable && item->status.ok());
    job->Finish(job->session_batch ? absl::OkStatus() : job->session_items.front()->status);
    job.reset();
  }
  return next_chunk;
}

}  // namespace attnserve::server
