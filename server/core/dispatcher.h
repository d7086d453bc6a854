// Where the service hands validated jobs: the dynamic batcher in front of the Executor.
//
// Jobs of one signature (Job::signature: kind, dtype, heads, head dims, module, whether weights
// are returned) are packed into batches by server/batching/batcher.h and computed with one
// backend call per batch. With batching off, every batch holds one job and nothing waits.
#ifndef ATTNSERVE_SERVER_CORE_DISPATCHER_H_
#define ATTNSERVE_SERVER_CORE_DISPATCHER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/batching/batcher.h"
#include "server/core/executor.h"
#include "server/core/job.h"
#include "server/metrics/metrics.h"

namespace attnserve::server {

// Thread-safe.
class Dispatcher : public CancellationListener {
 public:
  virtual ~Dispatcher() = default;

  // Takes the job (its `call` set); it is answered exactly once through Job::Finish, also when
  // it is refused here, with the reason the batcher gave: UNAVAILABLE (queue full, queued bytes
  // over budget, shed for fair share, shutting down: a retry with backoff can pass),
  // RESOURCE_EXHAUSTED (the job alone exceeds the queue's byte budget), DEADLINE_EXCEEDED
  // (already expired, or the queue ahead would outlast its deadline), CANCELLED. Never blocks;
  // must not be called holding a lock that answering a job takes.
  virtual void Submit(std::unique_ptr<Job> job) = 0;

  // A queued job's caller has cancelled: drop cancelled jobs from the queue soon. Never blocks.
  void NotifyCancelled() override = 0;

  // Stops accepting, computes what is queued for up to `grace`, answers what is left
  // UNAVAILABLE and joins the threads. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;

  // Ends Shutdown()'s grace period now (it may be running on another thread): what is still
  // queued is answered UNAVAILABLE at once. Never blocks.
  virtual void EndGracePeriod() = 0;
};

// The batching settings of the server (flags of the same names; GetServerInfo reports them).
struct BatchingOptions {
  // False: every job is computed alone, as soon as a batch thread is free (max_batch_requests 1,
  // no queue delay); the queue limits still apply.
  bool enabled = true;
  batching::BatcherOptions batcher;
  // Jobs of at most this many floating-point operations (Job::flops) are computed on the thread
  // that submits them (gRPC's), as a batch of one, when a batch thread would compute them at
  // once anyway (Batcher::RunNowOrSchedule: nothing queued, a batch thread free, no queue
  // delay). For such jobs the two thread hops (to a batch thread and back) cost more server CPU
  // and context switches than the arithmetic (measured in tests/bench/SERVING.md: at 1e7
  // against 1e6, 0.82x the server CPU of a 1 MFLOP Attend at one caller). The default, 10
  // MFLOP, is at most a few hundred microseconds of one core. 0: every job goes through the
  // batch threads.
  // Sessions' extends always do. Default: 1e7. REQUIRES: >= 0.
  double inline_max_flops = 1e7;
};

class BatchingDispatcher final : public Dispatcher {
 public:
  // Validates the options (INVALID_ARGUMENT naming the field) and starts the batch threads.
  // `executor` computes batches; `metrics` (may be null) gets the queue gauges and drops.
  static absl::StatusOr<std::unique_ptr<BatchingDispatcher>> Create(const BatchingOptions& options,
                                                                    Executor* executor,
                                                                    metrics::Metrics* metrics);
  ~BatchingDispatcher() override;

  void Submit(std::unique_ptr<Job> job) override;
  void NotifyCancelled() override;
  void Shutdown(absl::Duration grace) override;
  void EndGracePeriod() override;

  // The options in force (with batching off: the effective batch of one).
  const batching::BatcherOptions& options() const { return options_; }

 private:
  using Batcher = batching::Batcher<std::string, Job>;
  BatchingDispatcher(const batching::BatcherOptions& options, metrics::Metrics* metrics)
      : options_(options), metrics_(metrics) {}
  // Publishes the queue gauges; runs before every scrape. (Refusals and drops are counted by
  // each job's Call, with the reason the batcher gave.)
  void PublishStats();

  const batching::BatcherOptions options_;
  double inline_max_flops_ = 0;
  Executor* executor_ = nullptr;
  metrics::Metrics* const metrics_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<metrics::Metrics::ScrapeHook> scrape_hook_;
};

// The metrics label of a batcher's drop reason.
metrics::DropReason ToMetrics(batching::DropReason why);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_DISPATCHER_H_
