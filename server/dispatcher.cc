#include "server/dispatcher.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnserve::server {

absl::StatusOr<std::unique_ptr<WorkerPoolDispatcher>> WorkerPoolDispatcher::Create(
    const WorkerPoolOptions& options, Executor* executor, metrics::Metrics* metrics) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be positive; was ", options.num_threads));
  }
  if (options.max_queued_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_jobs must be positive; was ", options.max_queued_jobs));
  }
  return absl::WrapUnique(new WorkerPoolDispatcher(options, executor, metrics));
}

WorkerPoolDispatcher::WorkerPoolDispatcher(const WorkerPoolOptions& options, Executor* executor,
                                           metrics::Metrics* metrics)
    : options_(options), executor_(executor), metrics_(metrics) {
  for (int i = 0; i < options_.num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

WorkerPoolDispatcher::~WorkerPoolDispatcher() { Shutdown(absl::ZeroDuration()); }

absl::Status WorkerPoolDispatcher::Submit(std::unique_ptr<Job>* job) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) {
    if (metrics_ != nullptr) metrics_->RecordDropped(metrics::DropReason::kShutdown);
    return absl::UnavailableError("the server is shutting down");
  }
  if (queue_.size() >= static_cast<size_t>(options_.max_queued_jobs)) {
    if (metrics_ != nullptr) metrics_->RecordDropped(metrics::DropReason::kQueueFull);
    return absl::UnavailableError(absl::StrCat("the server is overloaded: ", queue_.size(),
                                               " requests queued; retry with backoff"));
  }
  queued_bytes_ += (*job)->bytes;
  queue_.push_back(std::move(*job));
  PublishQueue();
  return absl::OkStatus();
}

void WorkerPoolDispatcher::PublishQueue() {
  if (metrics_ != nullptr) metrics_->SetQueued(static_cast<int64_t>(queue_.size()), queued_bytes_);
}

void WorkerPoolDispatcher::WorkerLoop() {
  while (true) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPoolDispatcher* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
            return !d->queue_.empty() || d->stop_;
          },
          this));
      if (queue_.empty()) return;  // stop_ and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= job->bytes;
      PublishQueue();
    }
    std::vector<std::unique_ptr<Job>> batch;
    batch.push_back(std::move(job));
    executor_->Run(std::move(batch));
  }
}

void WorkerPoolDispatcher::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_ && threads_.empty()) return;
    accepting_ = false;
    // Let the workers drain the queue until the grace period ends.
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::deque<std::unique_ptr<Job>>* q) { return q->empty(); },
                             &queue_),
                         grace);
    stop_ = true;
  }
  // Answer what the grace period left, outside the lock (Finish calls into gRPC).
  std::deque<std::unique_ptr<Job>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
    queued_bytes_ = 0;
    PublishQueue();
  }
  if (metrics_ != nullptr && !left.empty()) {
    metrics_->RecordDropped(metrics::DropReason::kShutdown, static_cast<int64_t>(left.size()));
  }
  for (auto& job : left) {
    job->Finish(absl::UnavailableError("the server shut down before the request was computed"));
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace attnserve::server
