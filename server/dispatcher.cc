#include "server/dispatcher.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnserve::server {

absl::StatusOr<std::unique_ptr<WorkerPoolDispatcher>> WorkerPoolDispatcher::Create(
    const WorkerPoolOptions& options, Executor* executor) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be positive; was ", options.num_threads));
  }
  if (options.max_queued_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_jobs must be positive; was ", options.max_queued_jobs));
  }
  return absl::WrapUnique(new WorkerPoolDispatcher(options, executor));
}

WorkerPoolDispatcher::WorkerPoolDispatcher(const WorkerPoolOptions& options, Executor* executor)
    : options_(options), executor_(executor) {
  for (int i = 0; i < options_.num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

WorkerPoolDispatcher::~WorkerPoolDispatcher() { Shutdown(absl::ZeroDuration()); }

absl::Status WorkerPoolDispatcher::Submit(std::unique_ptr<Job>* job) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return absl::UnavailableError("the server is shutting down");
  if (queue_.size() >= static_cast<size_t>(options_.max_queued_jobs)) {
    return absl::UnavailableError(absl::StrCat("the server is overloaded: ", queue_.size(),
                                               " requests queued; retry with backoff"));
  }
  queue_.push_back(std::move(*job));
  return absl::OkStatus();
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
  }
  for (auto& job : left) {
    job->Finish(absl::UnavailableError("the server shut down before the request was computed"));
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace attnserve::server
