#include "server/executor.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

void Executor::Run(std::vector<std::unique_ptr<Job>> batch) {
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<Job>> live;
  live.reserve(batch.size());
  // The batcher dropped what was cancelled or expired when it formed the batch (the one place
  // that decides not to compute); whatever the deadline does from here on, Call::Finish counts.
  for (auto& job : batch) {
    job->timing.compute_start = start;
    if (metrics_ != nullptr) metrics_->ObserveQueueTime(start - job->timing.arrival);
    live.push_back(std::move(job));
  }
  if (live.empty()) return;

  absl::Status status;
  if (live.front()->kind == JobKind::kAttend) {
    std::vector<kernels::AttentionParams> params;
    params.reserve(live.size());
    for (const auto& job : live) params.push_back(job->attend);
    status = backend_->Attend(params);
  } else {
    std::vector<kernels::MultiHeadParams> params;
    params.reserve(live.size());
    for (const auto& job : live) params.push_back(job->multi_head);
    status = backend_->MultiHead(params);
  }
  if (!status.ok()) {
    status = absl::InternalError(
        absl::StrCat("backend ", backend_->name(), " failed: ", status.message()));
  }
  const absl::Time end = absl::Now();
  const std::string backend_name = backend_->name();
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
    job->Finish(status);
    job.reset();  // its buffers go now, not after the whole batch has been answered
  }
}

}  // namespace attnserve::server
