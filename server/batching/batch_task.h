// What the batcher needs to know about a unit of work: the BatchTask concept.
//
// The batcher is generic over the task type; it never looks inside a task beyond these four
// members and never calls into gRPC. The service's task wraps one attention request and its
// reply path.
//
//   num_tokens()   The task's share of a batch's compute, in tokens. For attention one token is
//                  one query row of one batch item: a request with batch size B and query length
//                  Lq is B * Lq tokens (heads and the key length are the same for every task of a
//                  queue's signature, or scale a request's cost the same way as Lq does, so the
//                  query rows are what packs). max_batch_tokens bounds the sum over a batch.
//                  REQUIRES: >= 0.
//   num_bytes()    Memory the task holds while queued (inputs and reserved outputs), in bytes;
//                  max_queued_bytes bounds the sum over everything queued. REQUIRES: >= 0.
//   deadline()     When the caller stops waiting; absl::InfiniteFuture() when it never does.
//                  A task still queued at its deadline is not computed.
//   IsCancelled()  Whether the caller has gone away (for gRPC: the call was cancelled). Polled
//                  by the batcher from its own threads, so it must be thread-safe (an
//                  std::atomic<bool> is enough) and cheap.
//
// num_tokens(), num_bytes() and deadline() are read once, when the task is scheduled; they must
// not change afterwards.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCH_TASK_H_
#define ATTNSERVE_SERVER_BATCHING_BATCH_TASK_H_

#include <concepts>
#include <cstdint>

#include "absl/time/time.h"

namespace attnserve::batching {

template <typename T>
concept BatchTask = requires(const T& task) {
  { task.num_tokens() } -> std::convertible_to<int64_t>;
  { task.num_bytes() } -> std::convertible_to<int64_t>;
  { task.deadline() } -> std::convertible_to<absl::Time>;
  { task.IsCancelled() } -> std::convertible_to<bool>;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCH_TASK_H_
