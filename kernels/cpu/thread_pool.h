// A fixed pool of worker threads running parallel loops. One pool per CpuBackend.
//
// Thread-safety: ParallelFor may be called from several threads at once; the loops then share
// the workers (first come, first served) and each caller also works on its own loop, so a loop
// always progresses even when every worker is busy elsewhere. The pool makes no promise about
// which thread runs which index: callers that need reproducible results make every index's
// work independent of the thread (CpuBackend does).
#ifndef ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_
#define ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "base/mutex.h"

namespace attnserve::kernels::cpu {

class ThreadPool {
 public:
  // Starts num_threads - 1 workers (the calling thread of ParallelFor is the last one).
  // REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  // Joins the workers. REQUIRES: no ParallelFor in progress.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), on the workers and the calling thread, and returns when
  // all have finished. fn must not throw.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
    ParallelFor(n, num_threads(), fn);
  }
  // The same on at most `max_threads` threads, the calling thread included (1: all on the
  // caller, no worker woken): for loops whose work would not pay for waking more
  // (CpuBackend::ThreadsFor). REQUIRES: max_threads >= 1.
  void ParallelFor(int64_t n, int max_threads, absl::FunctionRef<void(int64_t)> fn);

 private:
  struct Loop;
  void WorkerMain();
  // Claims and runs indices of `loop` until none is left.
  static void Drain(Loop& loop);

  Mutex mu_;
  CondVar work_;  // loops_ gained a loop, or stopping_ was set
  std::deque<std::shared_ptr<Loop>> loops_ ABSL_GUARDED_BY(mu_);  // loops with indices left
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_
