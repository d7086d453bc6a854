#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace attnserve::kernels::cpu {

struct ThreadPool::Loop {
  Loop(int64_t n, int helpers, absl::FunctionRef<void(int64_t)> fn)
      : n(n), fn(fn), helpers_left(helpers) {}
  const int64_t n;
  const absl::FunctionRef<void(int64_t)> fn;
  int helpers_left;              // workers that may still join; guarded by the pool's mu_
  std::atomic<int64_t> next{0};  // the next unclaimed index
  Mutex mu;
  CondVar all_done;
  int64_t done ABSL_GUARDED_BY(mu) = 0;  // indices finished
};

ThreadPool::ThreadPool(int num_threads) {
  workers_.reserve(num_threads - 1);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this] { WorkerMain(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.NotifyAll();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain(Loop& loop) {
  int64_t finished = 0;
  for (int64_t i = loop.next.fetch_add(1); i < loop.n; i = loop.next.fetch_add(1)) {
    loop.fn(i);
    ++finished;
  }
  if (finished > 0) {
    MutexLock lock(&loop.mu);
    loop.done += finished;
    if (loop.done == loop.n) loop.all_done.NotifyAll();
  }
}

void ThreadPool::WorkerMain() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && loops_.empty()) work_.Wait(&mu_);
      if (loops_.empty()) return;  // stopping, with nothing left to do
      loop = loops_.front();
      // A loop whose indices are all claimed, or with as many helpers as it may have, leaves
      // the queue; its owner waits for the rest.
      if (loop->next.load() >= loop->n || loop->helpers_left == 0) {
        loops_.pop_front();
        continue;
      }
      if (--loop->helpers_left == 0) loops_.pop_front();
    }
    Drain(*loop);
  }
}

void ThreadPool::ParallelFor(int64_t n, int max_threads, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return;
  // The calling thread takes one index: at most n - 1 workers are of use.
  const int64_t workers = static_cast<int64_t>(workers_.size());
  const int64_t helpers = std::min({n - 1, int64_t{max_threads} - 1, workers});
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto loop = std::make_shared<Loop>(n, static_cast<int>(helpers), fn);
  {
    MutexLock lock(&mu_);
    loops_.push_back(loop);
  }
  // Waking every worker for fewer helpers (a pool of 16 for a loop of 2) has every idle worker
  // switch in, find the indices taken and sleep again, on every loop; one wake-up each for as
  // many as can help, then, costs less (tests/bench/RESULTS.md, "The thread pool's hand-off").
  // All of them: one call.
  if (helpers == workers) {
    work_.NotifyAll();
  } else {
    for (int64_t i = 0; i < helpers; ++i) work_.NotifyOne();
  }
  Drain(*loop);
  {
    MutexLock lock(&mu_);
    for (auto it = loops_.begin(); it != loops_.end(); ++it) {
      if (*it == loop) {
        loops_.erase(it);
        break;
      }
    }
  }
  MutexLock lock(&loop->mu);
  while (loop->done != loop->n) loop->all_done.Wait(&loop->mu);
}

}  // namespace attnserve::kernels::cpu
