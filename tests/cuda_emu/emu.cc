// The host emulation of the CUDA execution model (emu.h).
#include "tests/cuda_emu/emu.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// The kernels' `extern __shared__ unsigned char smem_raw[]` (declared at block scope inside
// namespace attnserve::kernels::cuda) names this array: blocks run one at a time, so one buffer
// serves them all. 228 KiB: the sm_90 per-block maximum.
namespace attnserve::kernels::cuda {
alignas(128) unsigned char smem_raw[228 * 1024];
}  // namespace attnserve::kernels::cuda

namespace emu {
namespace {

using attnserve::kernels::cuda::smem_raw;
constexpr size_t kSmemCapacity = sizeof(smem_raw);
// A barrier that waits longer than this is a deadlock (a barrier not reached by every thread):
// generous, so that a loaded machine or a sanitizer never trips it on a correct kernel.
constexpr absl::Duration kDeadlockTimeout = absl::Seconds(600);

CpAsyncMode g_mode = CpAsyncMode::kLandAtIssue;
std::function<bool(const uint3&)> g_block_filter;

// futex(2) on a 32-bit atomic: WAIT sleeps while the word equals `val` (at most *timeout,
// relative, when given); WAKE wakes up to `val` sleepers.
void FutexOn(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is the atomic's own storage");

// A barrier over a changing set of live threads; a thread that exits stops counting (CUDA:
// exited threads no longer take part in __syncthreads). One atomic word holds (live, arrived),
// so arriving and exiting take no lock; the last to arrive (or an exit that completes the count)
// bumps the generation and wakes the sleepers with one futex call. Waiters sleep on the
// generation itself and return without touching a lock: with a mutex and a condition variable
// (as before) every release woke up to 255 threads to fight over the mutex, and the emulated
// kernels spent most of their time in the kernel's futex code. The happens-before edges
// ThreadSanitizer needs are the atomics' own (acq_rel on the count, release/acquire on the
// generation); the futex only puts threads to sleep.
class Barrier {
 public:
  void SetLive(int n) { state_.store(Pack(n, 0), std::memory_order_relaxed); }

  // Returns the number of threads that took part.
  int Arrive(const char* what) {
    const uint32_t gen = generation_.load(std::memory_order_acquire);
    const uint64_t old = state_.fetch_add(1, std::memory_order_acq_rel);
    const int live = Live(old), arrived = Arrived(old) + 1;
    if (arrived == live) {
      Release(arrived);
      return live;
    }
    Wait(gen, what);
    return live;
  }

  void Exit() {
    const uint64_t old = state_.fetch_sub(uint64_t{1} << 32, std::memory_order_acq_rel);
    const int live = Live(old) - 1, arrived = Arrived(old);
    if (arrived > 0 && arrived == live) Release(arrived);
  }

 private:
  static uint64_t Pack(int live, int arrived) {
    return (uint64_t{static_cast<uint32_t>(live)} << 32) | static_cast<uint32_t>(arrived);
  }
  static int Live(uint64_t s) { return static_cast<int>(s >> 32); }
  static int Arrived(uint64_t s) { return static_cast<int>(s & 0xffffffffu); }

  // Every live thread has arrived and waits for the generation to change: nobody else touches
  // the count until then.
  void Release(int arrived) {
    state_.fetch_sub(static_cast<uint64_t>(arrived), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    FutexOn(&generation_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
  }

  void Wait(uint32_t gen, const char* what) {
    const absl::Time deadline = absl::Now() + kDeadlockTimeout;
    while (generation_.load(std::memory_order_acquire) == gen) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        Fail(std::string(what) + ": deadlock (not every live thread reached the barrier)");
      }
      const timespec ts = absl::ToTimespec(left);
      // Returns at once when the generation has moved on already (EAGAIN), on a wake, a
      // signal or the timeout; the loop checks again either way.
      FutexOn(&generation_, FUTEX_WAIT_PRIVATE, gen, &ts);
    }
  }

  std::atomic<uint64_t> state_{0};  // live << 32 | arrived
  std::atomic<uint32_t> generation_{0};
};

// The OS threads that run a block's CUDA threads, kept from block to block and launch to launch
// (one thread per CUDA thread, all running at once, as before: only their creation is saved).
// Starting a thread per CUDA thread per block cost most of an emulated test's system time:
// clone, a stack mapped and unmapped, a join. Worker t runs CUDA thread t of every block.
// The launcher publishes the block's function with a release increment of each worker's `go`
// word, and the workers publish their work with an acq_rel decrement of `remaining`; the last
// one wakes the launcher through `done`. Those atomics are the happens-before edges (for
// ThreadSanitizer too); the futexes only put threads to sleep. Only the launcher (under the
// launch lock) calls Run.
class Workers {
 public:
  // Runs fn(t) for every t in [0, n), each on its own worker thread, all at once; returns when
  // every one has returned.
  void Run(int n, const std::function<void(int)>& fn) {
    while (static_cast<int>(workers_.size()) < n) {
      workers_.push_back(std::make_unique<Worker>());
      std::thread(&Workers::Main, this, workers_.back().get(),
                  static_cast<int>(workers_.size()) - 1)
          .detach();
    }
    fn_ = &fn;
    remaining_.store(n, std::memory_order_relaxed);
    const uint32_t done = done_.load(std::memory_order_relaxed);
    for (int t = 0; t < n; ++t) {
      Worker& w = *workers_[static_cast<size_t>(t)];
      w.go.fetch_add(1, std::memory_order_release);
      FutexOn(&w.go, FUTEX_WAKE_PRIVATE, 1, nullptr);
    }
    while (done_.load(std::memory_order_acquire) == done) {
      FutexOn(&done_, FUTEX_WAIT_PRIVATE, done, nullptr);
    }
  }

  // A forked child has none of the parent's threads: it starts a pool of its own.
  static Workers*& Instance() {
    static Workers* workers = [] {
      pthread_atfork(nullptr, nullptr, [] { Instance() = new Workers; });
      return new Workers;
    }();
    return workers;
  }

 private:
  struct Worker {
    std::atomic<uint32_t> go{0};
  };

  void Main(Worker* w, int t) {
    uint32_t seen = 0;
    for (;;) {
      while (w->go.load(std::memory_order_acquire) == seen) {
        FutexOn(&w->go, FUTEX_WAIT_PRIVATE, seen, nullptr);
      }
      seen = w->go.load(std::memory_order_acquire);
      (*fn_)(t);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        done_.fetch_add(1, std::memory_order_release);
        FutexOn(&done_, FUTEX_WAKE_PRIVATE, 1, nullptr);
      }
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;  // the launcher's alone
  const std::function<void(int)>* fn_ = nullptr;  // published by `go`
  std::atomic<int> remaining_{0};                 // workers of this run not yet returned
  std::atomic<uint32_t> done_{0};                 // bumped by the last of a run
};

struct Warp {
  Barrier barrier;
  Slot slots[2][32];
};

struct BlockState {
  Barrier block_barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  size_t smem_bytes = 0;
};

BlockState* g_block = nullptr;  // set by Launch before the block's threads start

struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
  int group;  // -1: not yet committed
};

struct ThreadState {
  int warp = 0;
  int lane = 0;
  uint64_t collectives = 0;  // selects the slot buffer
  std::deque<PendingCopy> pending;
  int next_group = 0;
};
thread_local ThreadState t_state;

void Land(const PendingCopy& c) { std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes)); }

void FlushAll() {
  for (const PendingCopy& c : t_state.pending) Land(c);
  t_state.pending.clear();
}

}  // namespace

void SetCpAsyncMode(CpAsyncMode mode) { g_mode = mode; }
void SetBlockFilter(std::function<bool(const uint3&)> keep) { g_block_filter = std::move(keep); }
CpAsyncMode GetCpAsyncMode() { return g_mode; }

void Fail(const std::string& message) {
  std::fprintf(stderr, "CUDA emulation: %s (block %u,%u,%u thread %u)\n", message.c_str(),
               blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
  std::fflush(stderr);
  std::abort();
}

unsigned char* SharedBase() { return smem_raw; }
size_t SharedSize() { return g_block != nullptr ? g_block->smem_bytes : 0; }

unsigned char* SharedAt(uint32_t addr, int bytes, int align, const char* what) {
  if (addr % static_cast<uint32_t>(align) != 0) {
    Fail(std::string(what) + ": shared address " + std::to_string(addr) + " not aligned to " +
         std::to_string(align));
  }
  if (static_cast<size_t>(addr) + static_cast<size_t>(bytes) > SharedSize()) {
    Fail(std::string(what) + ": shared address " + std::to_string(addr) + " + " +
         std::to_string(bytes) + " past the launched " + std::to_string(SharedSize()) + " bytes");
  }
  return smem_raw + addr;
}

int LaneId() { return t_state.lane; }

const Slot* WarpExchange(const Slot& mine) {
  Warp& w = *g_block->warps[static_cast<size_t>(t_state.warp)];
  const int buf = static_cast<int>(t_state.collectives++ & 1);
  w.slots[buf][t_state.lane] = mine;
  const int participants = w.barrier.Arrive("warp collective");
  if (participants != 32) {
    Fail("warp collective (op " + std::to_string(mine.op) + ") with only " +
         std::to_string(participants) + " live lanes");
  }
  for (int l = 0; l < 32; ++l) {
    if (w.slots[buf][l].op != mine.op) {
      Fail("warp collective: lane " + std::to_string(t_state.lane) + " issued op " +
           std::to_string(mine.op) + ", lane " + std::to_string(l) + " op " +
           std::to_string(w.slots[buf][l].op));
    }
  }
  return w.slots[buf];
}

void SyncThreads() { g_block->block_barrier.Arrive("__syncthreads"); }

void SyncWarp(unsigned mask) {
  if (mask != 0xffffffffu) Fail("__syncwarp: only the full mask is emulated");
  Warp& w = *g_block->warps[static_cast<size_t>(t_state.warp)];
  if (w.barrier.Arrive("__syncwarp") != 32) Fail("__syncwarp with exited lanes");
}

void CpAsync(void* dst, const void* src, int bytes) {
  PendingCopy c{dst, src, bytes, -1};
  if (g_mode == CpAsyncMode::kLandAtIssue) {
    Land(c);
  } else {
    t_state.pending.push_back(c);
  }
}

void CpAsyncCommit() {
  const int group = t_state.next_group++;
  for (PendingCopy& c : t_state.pending) {
    if (c.group < 0) c.group = group;
  }
}

void CpAsyncWait(int n) {
  // Groups g <= newest - n must have landed; uncommitted copies are not waited for.
  const int newest = t_state.next_group - 1;
  std::deque<PendingCopy> keep;
  for (const PendingCopy& c : t_state.pending) {
    if (c.group >= 0 && c.group <= newest - n) {
      Land(c);
    } else {
      keep.push_back(c);
    }
  }
  t_state.pending.swap(keep);
}

void Launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  // One launch at a time: the running block's state (g_block, the shared memory) is global, and
  // two host threads may launch at once (the backend's workers).
  static attnserve::Mutex* launch_mu = new attnserve::Mutex;
  attnserve::MutexLock launch_lock(launch_mu);
  if (smem_bytes > kSmemCapacity) Fail("launch: dynamic shared memory above 228 KiB");
  // CUDA's launch limits (compute capability 8.x/9.x): a grid the device would reject with
  // cudaErrorInvalidConfiguration is rejected here too.
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u) {
    Fail("launch: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
         std::to_string(grid.z) + ") beyond CUDA's limits (2^31 - 1, 65535, 65535)");
  }
  if (block.x * block.y * block.z > 1024u) Fail("launch: more than 1024 threads per block");
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (threads % 32 != 0 || block.y != 1 || block.z != 1) {
    Fail("launch: the emulator runs 1-D blocks of whole warps");
  }
  const int num_warps = threads / 32;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        if (g_block_filter && !g_block_filter(uint3{bx, by, bz})) continue;
        BlockState state;
        state.smem_bytes = smem_bytes;
        state.block_barrier.SetLive(threads);
        for (int w = 0; w < num_warps; ++w) {
          state.warps.push_back(std::make_unique<Warp>());
          state.warps.back()->barrier.SetLive(32);
        }
        EMU_UNPOISON(smem_raw, kSmemCapacity);
        std::memset(smem_raw, 0xff, smem_bytes);
        EMU_POISON(smem_raw + smem_bytes, kSmemCapacity - smem_bytes);
        g_block = &state;
        Workers::Instance()->Run(threads, [&](int t) {
          threadIdx = {static_cast<unsigned>(t), 0, 0};
          blockIdx = {bx, by, bz};
          blockDim = block;
          gridDim = grid;
          t_state = ThreadState{};
          t_state.warp = t / 32;
          t_state.lane = t % 32;
          body();
          FlushAll();  // copies never waited for still land (they do on the device)
          Warp& w = *state.warps[static_cast<size_t>(t / 32)];
          w.barrier.Exit();
          state.block_barrier.Exit();
        });
        g_block = nullptr;
        EMU_UNPOISON(smem_raw, kSmemCapacity);
      }
    }
  }
}

}  // namespace emu
