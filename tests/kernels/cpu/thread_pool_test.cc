// ThreadPool (kernels/cpu/thread_pool.h): every index of a loop runs exactly once, on the
// workers and the calling thread, also with several loops at once; a loop wakes the workers it
// can use, and no more threads than a capped loop may have. Events, not timing: a test that waits
// does so for a condition, with a generous bound that only a broken pool reaches.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "gtest/gtest.h"

namespace attnserve::kernels::cpu {
namespace {

// Runs fn(i) for i in [0, n) on `pool` and counts how often each index ran.
std::vector<int> Counts(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  pool.ParallelFor(n, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return out;
}

TEST(ThreadPoolTest, EveryIndexRunsOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 100, 1000}) {
      EXPECT_EQ(Counts(pool, n), std::vector<int>(static_cast<size_t>(n), 1))
          << threads << " threads, n " << n;
    }
  }
}

// Loops from several threads at once share the workers; each finishes with its own indices run
// once each.
TEST(ThreadPoolTest, ConcurrentLoopsEachRunEveryIndexOnce) {
  ThreadPool pool(3);
  constexpr int kCallers = 4;
  constexpr int kLoops = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int l = 0; l < kLoops; ++l) {
        const int64_t n = 1 + (c * 7 + l) % 13;
        if (Counts(pool, n) != std::vector<int>(static_cast<size_t>(n), 1)) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Runs a loop of n indices on at most max_threads threads of `pool`, each index waiting until
// all n have started: a condition only n threads at once can meet. The wait is bounded (60 s),
// which only a pool that gave the loop fewer threads reaches. Returns the indices that did.
int IndicesLeftShortHanded(ThreadPool& pool, int n, int max_threads) {
  Mutex mu;
  CondVar all_started;
  int started = 0;
  std::atomic<int> short_handed{0};
  pool.ParallelFor(n, max_threads, [&](int64_t) {
    MutexLock lock(&mu);
    if (++started == n) all_started.NotifyAll();
    const absl::Time bound = absl::Now() + absl::Seconds(60);
    while (started < n && absl::Now() < bound) all_started.WaitWithDeadline(&mu, bound);
    if (started < n) short_handed.fetch_add(1);
  });
  return short_handed.load();
}

// A loop of two on a large pool gets a worker beside its caller. (A pool that woke no worker for
// it would leave the caller waiting until the bound, and the test would fail.)
TEST(ThreadPoolTest, ALoopOfTwoWakesAWorker) {
  ThreadPool pool(8);
  for (int round = 0; round < 50; ++round) {
    ASSERT_EQ(IndicesLeftShortHanded(pool, 2, pool.num_threads()), 0)
        << "round " << round << ": an index ran without a second thread";
  }
}

// A loop capped at one thread runs every index on its caller; one capped at k never runs on
// more than k threads, however many workers are idle, and still runs each index once.
TEST(ThreadPoolTest, ALoopRunsOnAtMostItsMaxThreads) {
  ThreadPool pool(8);
  for (int max_threads : {1, 2, 3, 8, 100}) {
    for (int round = 0; round < 20; ++round) {
      Mutex mu;
      std::vector<std::thread::id> ids;
      std::vector<int> runs(64, 0);
      pool.ParallelFor(64, max_threads, [&](int64_t i) {
        MutexLock lock(&mu);
        ++runs[static_cast<size_t>(i)];
        if (std::find(ids.begin(), ids.end(), std::this_thread::get_id()) == ids.end()) {
          ids.push_back(std::this_thread::get_id());
        }
      });
      ASSERT_EQ(runs, std::vector<int>(64, 1)) << "max_threads " << max_threads;
      ASSERT_LE(static_cast<int>(ids.size()), max_threads) << "round " << round;
      if (max_threads == 1) {
        ASSERT_EQ(ids, std::vector<std::thread::id>{std::this_thread::get_id()});
      }
    }
  }
}

// A capped loop still gets the helpers it may have: with max_threads 3 on a pool of 8, three
// indices that each wait for the other two to start can finish (a pool that woke no worker or
// one would leave them waiting until the bound).
TEST(ThreadPoolTest, ACappedLoopWakesAsManyAsItMayUse) {
  ThreadPool pool(8);
  for (int round = 0; round < 50; ++round) {
    ASSERT_EQ(IndicesLeftShortHanded(pool, 3, 3), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace attnserve::kernels::cpu
