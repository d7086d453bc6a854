#include "server/core/dispatcher.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::StatusOr<std::unique_ptr<BatchingDispatcher>> BatchingDispatcher::Create(
    const BatchingOptions& options, Executor* executor, metrics::Metrics* metrics) {
  batching::BatcherOptions batcher_options = options.batcher;
  if (!options.enabled) {
    batcher_options.max_batch_requests = 1;
    batcher_options.max_queue_delay = absl::ZeroDuration();
  }
  if (!(options.inline_max_flops >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("inline_max_flops must be >= 0; was ", options.inline_max_flops));
  }
  std::unique_ptr<BatchingDispatcher> d(new BatchingDispatcher(batcher_options, metrics));
  d->inline_max_flops_ = options.inline_max_flops;
  d->executor_ = executor;
  auto batcher = Batcher::Create(
      batcher_options,
      // A prefill's next chunk is queued again here, behind what arrived meanwhile.
      [d = d.get()](const std::string&, Batcher::Batch batch) {
        for (auto& job : d->executor_->Run(std::move(batch))) d->Submit(std::move(job));
      },
      [](std::unique_ptr<Job> job, absl::Status status, batching::DropReason why) {
        job->Finish(std::move(status), ToMetrics(why));
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

metrics::DropReason ToMetrics(batching::DropReason why) {
  switch (why) {
    case batching::DropReason::kExpired:
      return metrics::DropReason::kDeadline;
    case batching::DropReason::kCancelled:
      return metrics::DropReason::kCancelled;
    case batching::DropReason::kQueueFull:
      return metrics::DropReason::kQueueFull;
    case batching::DropReason::kQueueBytes:
    case batching::DropReason::kTooLarge:
      return metrics::DropReason::kQueueBytes;
    case batching::DropReason::kUnmeetable:
      return metrics::DropReason::kUnmeetable;
    case batching::DropReason::kFairShare:
      return metrics::DropReason::kFairShare;
    case batching::DropReason::kShutdown:
    case batching::DropReason::kInvalid:
      break;
  }
  return metrics::DropReason::kShutdown;
}

void BatchingDispatcher::Submit(std::unique_ptr<Job> job) {
  // The signature copy is needed: Schedule moves the job out on success.
  const std::string key = job->signature;
  batching::DropReason why;
  const bool cheap = job->kind != JobKind::kSessionExtend && job->flops <= inline_max_flops_;
  if (!cheap) {
    if (absl::Status s = batcher_->Schedule(key, &job, &why); !s.ok()) {
      job->Finish(std::move(s), ToMetrics(why));
    }
    return;
  }
  // Computed here, it is answered after the batch slot is free again: another tiny job that
  // arrives while this one's answer is sent computes at once instead of queueing for a batch
  // thread.
  Executor::Computed computed;
  absl::Status s = batcher_->RunNowOrSchedule(
      key, &job,
      [&](const std::string&, Batcher::Batch batch) {
        computed = executor_->Compute(std::move(batch));
      },
      &why);
  if (!s.ok()) {
    job->Finish(std::move(s), ToMetrics(why));
    return;
  }
  Executor::Answer(std::move(computed));
}

void BatchingDispatcher::NotifyCancelled() { batcher_->NotifyCancelled(); }

void BatchingDispatcher::Shutdown(absl::Duration grace) { batcher_->Shutdown(grace); }

void BatchingDispatcher::EndGracePeriod() { batcher_->EndGracePeriod(); }

void BatchingDispatcher::PublishStats() {
  const batching::BatcherStats now = batcher_->stats();
  metrics_->SetQueued(now.queued_requests, now.queued_bytes);
}

}  // namespace attnserve::server
