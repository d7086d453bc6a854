// Where the service hands validated jobs: a queue in front of the Executor.
//
// Two implementations: WorkerPoolDispatcher (each job computed alone by a fixed pool of
// threads) and, with batching on, the dynamic batcher (server/batching/).
#ifndef ATTNSERVE_SERVER_DISPATCHER_H_
#define ATTNSERVE_SERVER_DISPATCHER_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/executor.h"
#include "server/job.h"
#include "server/metrics/metrics.h"

namespace attnserve::server {

// Thread-safe.
class Dispatcher {
 public:
  virtual ~Dispatcher() = default;

  // Queues `*job` and returns OK, taking ownership (*job becomes null); the job is then answered
  // exactly once through Job::Finish. Never blocks. On error (queue full: UNAVAILABLE; shutting
  // down: UNAVAILABLE) *job is left with the caller, unanswered.
  virtual absl::Status Submit(std::unique_ptr<Job>* job) = 0;

  // Stops accepting, computes what is queued for up to `grace`, answers what is left
  // UNAVAILABLE and joins the threads. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;
};

struct WorkerPoolOptions {
  // Threads computing jobs. REQUIRES >= 1. Default: 1 (the backend parallelises inside a job).
  int num_threads = 1;
  // Jobs queued before Submit refuses with UNAVAILABLE. REQUIRES >= 1. Default: 1024.
  int max_queued_jobs = 1024;
};

// Computes each job alone (batch of one), in arrival order.
class WorkerPoolDispatcher final : public Dispatcher {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerPoolDispatcher>> Create(
      const WorkerPoolOptions& options, Executor* executor, metrics::Metrics* metrics);
  ~WorkerPoolDispatcher() override;

  absl::Status Submit(std::unique_ptr<Job>* job) override;
  void Shutdown(absl::Duration grace) override;

 private:
  WorkerPoolDispatcher(const WorkerPoolOptions& options, Executor* executor,
                       metrics::Metrics* metrics);
  void WorkerLoop();
  void PublishQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerPoolOptions options_;
  Executor* const executor_;
  metrics::Metrics* const metrics_;  // may be null
  std::vector<std::thread> threads_;

  absl::Mutex mu_;
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // workers exit once set and the queue is drained
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_DISPATCHER_H_
