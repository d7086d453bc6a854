// Computes batches of Jobs on a backend and answers each job.
#ifndef ATTNSERVE_SERVER_CORE_EXECUTOR_H_
#define ATTNSERVE_SERVER_CORE_EXECUTOR_H_

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "kernels/backend.h"
#include "server/core/job.h"
#include "server/metrics/metrics.h"

namespace attnserve::server {

// Thread-safe (the backends are). Does not own the backends.
class Executor {
 public:
  // Computes on `backend`, and linear attention on `fallback` when it is set (a backend that
  // lacks it: kernels::Backend::supports_linear_attention). `metrics` may be null (no metrics
  // recorded).
  Executor(kernels::Backend* backend, kernels::Backend* fallback, metrics::Metrics* metrics)
      : backend_(backend), fallback_(fallback), metrics_(metrics) {}

  // Computes `batch` (jobs of one signature, so one kind) with one backend call, fills each
  // job's timing and calls Finish on every job: OK, or the backend's error for all of them.
  // (The batcher has already dropped jobs that were cancelled or expired.) Records queue time,
  // batch size, compute time and floating-point operations in the metrics. Returns the session
  // extends whose prefill has another chunk to compute, unanswered, their `tokens` set to that
  // chunk's: the caller (the dispatcher) queues them again.
  [[nodiscard]] std::vector<std::unique_ptr<Job>> Run(std::vector<std::unique_ptr<Job>> batch);

  // Run() in two steps, for a caller that computes on its own thread and answers once it has
  // let others compute (Batcher::RunNowOrSchedule): Compute() records the metrics and fills the
  // timing; Answer() calls Finish on every job. Not for session extends (Run() only).
  struct Computed {
    std::vector<std::unique_ptr<Job>> jobs;  // empty: nothing to answer
    absl::Status status;                     // for every job
  };
  Computed Compute(std::vector<std::unique_ptr<Job>> batch);
  static void Answer(Computed computed);

 private:
  // Session extends (JobKind::kSessionExtend): computed by their SessionManager, committed or
  // rolled back, answered.
  std::vector<std::unique_ptr<Job>> RunExtends(std::vector<std::unique_ptr<Job>> live,
                                               absl::Time start);

  // The backend for a batch of `job`'s signature (one kind of attention a batch).
  kernels::Backend* BackendFor(const Job& job) const;

  kernels::Backend* backend_;
  kernels::Backend* fallback_;
  metrics::Metrics* metrics_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_EXECUTOR_H_
