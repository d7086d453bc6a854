#include "server/dispatcher.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::StatusOr<std::unique_ptr<BatchingDispatcher>> BatchingDispatcher::Create(
    const BatchingOptions& options, Executor* executor, metrics::Metrics* metrics) {
  batching::BatcherOptions batcher_options = options.batcher;
  if (!options.enabled) {
    batcher_options.max_batch_requests = 1;
    batcher_options.max_queue_delay = absl::ZeroDuration();
  }
  std::unique_ptr<BatchingDispatcher> d(new BatchingDispatcher(batcher_options, metrics));
  auto batcher = Batcher::Create(
      batcher_options,
      [executor](const std::string&, Batcher::Batch batch) { executor->Run(std::move(batch)); },
      [metrics](std::unique_ptr<Job> job, absl::Status status) {
        // gRPC cancels a call whose deadline passes, so an expired job usually arrives here as
        // cancelled; answer and count it as what it is.
        if (status.code() == absl::StatusCode::kCancelled && job->deadline_at <= absl::Now()) {
          status = absl::DeadlineExceededError(
              "the deadline passed while the request was queued; it was not computed");
        }
        if (metrics != nullptr) {
          switch (status.code()) {
            case absl::StatusCode::kDeadlineExceeded:
              metrics->RecordDropped(metrics::DropReason::kDeadline);
              break;
            case absl::StatusCode::kCancelled:
              metrics->RecordDropped(metrics::DropReason::kCancelled);
              break;
            default:
              metrics->RecordDropped(metrics::DropReason::kShutdown);
          }
        }
        job->Finish(std::move(status));
      });
  if (!batcher.ok()) return batcher.status();
  d->batcher_ = *std::move(batcher);
  if (metrics != nullptr) d->scrape_hook_ = metrics->OnScrape([p = d.get()] { p->PublishStats(); });
  return d;
}

BatchingDispatcher::~BatchingDispatcher() {
  scrape_hook_.reset();  // before the batcher it reads
  Shutdown(absl::ZeroDuration());
}

absl::Status BatchingDispatcher::Submit(std::unique_ptr<Job>* job) {
  // The signature copy is needed: Schedule moves the job out of *job on success.
  const std::string key = (*job)->signature;
  return batcher_->Schedule(key, job);
}

void BatchingDispatcher::NotifyCancelled() { batcher_->NotifyCancelled(); }

void BatchingDispatcher::Shutdown(absl::Duration grace) { batcher_->Shutdown(grace); }

void BatchingDispatcher::EndGracePeriod() { batcher_->EndGracePeriod(); }

void BatchingDispatcher::PublishStats() {
  const batching::BatcherStats now = batcher_->stats();
  batching::MutexLock lock(&published_mu_);
  metrics_->RecordDropped(metrics::DropReason::kQueueFull,
                          now.refused_queue_full - published_.refused_queue_full);
  metrics_->RecordDropped(metrics::DropReason::kQueueBytes,
                          now.refused_bytes - published_.refused_bytes);
  metrics_->RecordDropped(metrics::DropReason::kShutdown,
                          now.refused_shutdown - published_.refused_shutdown);
  metrics_->SetQueued(now.queued_requests, now.queued_bytes);
  published_ = now;
}

}  // namespace attnserve::server
