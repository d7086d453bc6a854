// The batcher's options, its counters, and the validation Batcher::Create() runs.
//
// What each knob trades (for docs/operations.md, "Tuning the batcher"):
//   max_batch_requests, max_batch_tokens  Bigger batches amortise per-call overhead and fill
//       wide hardware better, but a batch finishes only when its slowest item does, so a big
//       batch adds latency to the small requests in it.
//   max_queue_delay  The latency a lone request pays, at most, to wait for company. 0 turns
//       waiting off (a batch still forms from whatever queued while the threads were busy).
//   max_queued_requests, max_queued_bytes  How much overload is absorbed as queueing delay
//       before callers are told to back off. Deeper queues smooth bursts but, under sustained
//       overload, only make every answer later.
//   num_batch_threads  Batches of one batcher computed at once. More threads overlap batches
//       (useful when a backend call does not use the whole device); fewer keep batches larger.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCHER_OPTIONS_H_
#define ATTNSERVE_SERVER_BATCHING_BATCHER_OPTIONS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/batching/clock.h"
#include "server/batching/cost_model.h"

namespace attnserve::batching {

struct BatcherOptions {
  // ---- Affect behaviour ----

  // The most tasks in one batch. Default: 32. REQUIRES: > 0.
  int max_batch_requests = 32;

  // The most tokens (see batch_task.h: query rows, B * Lq per request) in one batch. Tasks are
  // packed in arrival order; a task that would take a batch over the limit starts the next
  // batch, and a task larger than the limit on its own is computed alone, in a batch of one.
  // Default: 4096. REQUIRES: > 0.
  int64_t max_batch_tokens = 4096;

  // The longest the oldest task of a batch waits for the batch to fill before the batch
  // leaves anyway (it leaves earlier when full, or when a task's deadline requires it; see
  // cost_model.h). Default: 2 ms. REQUIRES: >= 0.
  absl::Duration max_queue_delay = absl::Milliseconds(2);

  // The most tasks queued (scheduled and not yet taken into a batch), summed over every
  // signature's queue. Schedule() refuses more with UNAVAILABLE. Default: 1024. REQUIRES: > 0.
  int max_queued_requests = 1024;

  // The most bytes (Task::num_bytes()) queued, summed over every signature's queue. Schedule()
  // refuses a task that would go over with UNAVAILABLE, and a task larger than the whole budget
  // with RESOURCE_EXHAUSTED. Default: 1 GiB. REQUIRES: > 0.
  int64_t max_queued_bytes = int64_t{1} << 30;

  // ---- Affect performance ----

  // Threads that run process_batch; at most this many batches of one batcher are computed at
  // once. Default: 1. REQUIRES: 1..1024.
  int num_batch_threads = 1;

  // ---- Injected ----

  // The clock the batcher reads and waits on. Not owned; must outlive the batcher.
  // Default: nullptr, the wall clock (a RealClock the batcher owns).
  Clock* clock = nullptr;

  // The estimate of a batch's compute time behind deadline-driven dispatch. Used by this
  // batcher alone (not thread-safe). Default: nullptr, an EwmaCostModel with its defaults.
  std::shared_ptr<BatchCostModel> cost_model;
};

// OK, or INVALID_ARGUMENT naming the first bad field and its value
// ("max_batch_requests must be positive; was 0").
absl::Status ValidateBatcherOptions(const BatcherOptions& options);

// Counters since the batcher was created, and the queue's gauges at the time of the snapshot.
// Every task given to Schedule() is counted exactly once: in one refused_* counter (the caller
// kept it) or in `scheduled`; and every scheduled task, once handed over, in exactly one of
// processed, expired, cancelled, shut_down or shed (or it is still queued or on its way to a
// callback). Metrics names for these should be in base units (…_total, …_bytes).
struct BatcherStats {
  // Schedule() outcomes.
  int64_t scheduled = 0;           // OK: the batcher took the task.
  int64_t refused_queue_full = 0;  // UNAVAILABLE: max_queued_requests reached.
  int64_t refused_bytes = 0;       // UNAVAILABLE or RESOURCE_EXHAUSTED: max_queued_bytes.
  int64_t refused_shutdown = 0;    // UNAVAILABLE: Shutdown() had started.
  int64_t refused_expired = 0;     // DEADLINE_EXCEEDED: the deadline had passed already.
  int64_t refused_cancelled = 0;   // CANCELLED: the task was cancelled already.
  int64_t refused_invalid = 0;     // INVALID_ARGUMENT: null task, negative size.
  int64_t refused_unmeetable = 0;  // DEADLINE_EXCEEDED: the queue ahead outlasts the deadline.

  // What became of scheduled tasks.
  int64_t batches = 0;        // process_batch calls.
  int64_t processed = 0;      // Tasks handed to process_batch.
  int64_t ran_on_caller = 0;  // Of those, computed by RunNowOrSchedule's caller (batches of 1).
  int64_t expired = 0;        // reject(DEADLINE_EXCEEDED): deadline passed while queued.
  int64_t cancelled = 0;      // reject(CANCELLED): cancelled while queued.
  int64_t shut_down = 0;      // reject(UNAVAILABLE): still queued when the grace period ended.
  int64_t shed = 0;           // reject(UNAVAILABLE): shed from a full queue for a lighter owner.

  // Gauges.
  int64_t queued_requests = 0;
  int64_t queued_bytes = 0;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCHER_OPTIONS_H_
