// The host emulation of the CUDA execution model (emu.h).
#include "tests/cuda_emu/emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
// Exported by the TSan runtime (GCC's and clang's), not declared by its public header: the
// current thread's (fiber's) memory accesses are neither checked nor recorded in between.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
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

// The context switch of the fibers (x86-64 System V): saves the callee-saved registers on the
// current stack, stores the stack pointer in *from_sp, loads to_sp and restores the registers
// saved there. A new fiber's stack is laid out (MakeContext) so that the switch "returns" into
// emu_fiber_entry, which calls r13(r12). The floating-point control words are not switched:
// nothing emulated changes them.
#if defined(__x86_64__)
extern "C" void emu_context_switch(void** from_sp, void* to_sp);
extern "C" void emu_fiber_entry();
asm(R"(
  .text
  .p2align 4
  .globl emu_context_switch
  .type emu_context_switch, @function
emu_context_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_context_switch, .-emu_context_switch

  .p2align 4
  .globl emu_fiber_entry
  .type emu_fiber_entry, @function
emu_fiber_entry:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size emu_fiber_entry, .-emu_fiber_entry
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace emu {
namespace {

using attnserve::kernels::cuda::smem_raw;
constexpr size_t kSmemCapacity = sizeof(smem_raw);

// A fiber's stack: the kernels' frames are small (register-sized arrays), the sanitizers' are
// several times larger. A PROT_NONE page below each stack turns an overflow into a fault.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kStackBytes = size_t{1} << 20;
#else
constexpr size_t kStackBytes = size_t{256} << 10;
#endif

CpAsyncMode g_mode = CpAsyncMode::kLandAtIssue;
std::function<bool(const uint3&)> g_block_filter;

struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
  int group;  // -1: not yet committed
};

class Barrier;

// One emulated CUDA thread: its stack and saved context, what it waits for, and its per-thread
// emulation state (warp, lane, cp.async queue).
struct Fiber {
  // Scheduling. A fiber is runnable when it has not finished and is not waiting, or the
  // barrier it waits at has moved past the generation it arrived in. Relaxed atomics: the
  // fibers of a block run on one OS thread, but ThreadSanitizer sees each as a thread of its own
  // and must not take the emulator's bookkeeping for the kernel's data (the kernel's edges are
  // the barriers' release/acquire annotations, Barrier below).
  std::atomic<bool> finished{false};
  std::atomic<const Barrier*> waiting_at{nullptr};
  std::atomic<uint64_t> waiting_generation{0};

  int thread = 0;
  int warp = 0;
  int lane = 0;
  uint64_t collectives = 0;  // selects the slot buffer
  std::deque<PendingCopy> pending;
  int next_group = 0;

  void* sp = nullptr;  // saved stack pointer (x86-64)
#if !defined(__x86_64__)
  ucontext_t context;
#endif
  unsigned char* stack = nullptr;  // lowest usable byte (above the guard page)
#if defined(__SANITIZE_THREAD__)
  void* tsan_fiber = nullptr;
#endif

  bool Runnable() const;
};

// The scheduler of the running launch: the launcher's own context, the block's fibers, and the
// order of the current round.
struct Scheduler {
  Fiber main;  // the launcher (its stack is the OS thread's)
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
  std::vector<std::unique_ptr<Fiber>> fibers;  // kept from block to block and launch to launch
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  std::mt19937 rng{0x5eed};
};
Scheduler* g_sched = nullptr;  // set by the first Launch, under the launch lock

// Switches from `from` (the running context) to `to`; every switch is between the launcher and
// a fiber. `from_finished`: `from` never runs again (ASan then drops its fake stack). Only the
// launcher writes the scheduler's state (the running fiber, threadIdx), and ThreadSanitizer is
// told to ignore those writes: they are the emulator's, not the kernel's, and a fiber reads them
// with no happens-before edge from the launcher (fibers are switched without one).
void SwitchTo(Fiber* from, Fiber* to, bool from_finished = false) {
  const bool from_launcher = from == &g_sched->main;
#if defined(__SANITIZE_THREAD__)
  if (from_launcher) __tsan_ignore_thread_begin();
#endif
  if (from_launcher) {
    g_sched->current = to;
    threadIdx = {static_cast<unsigned>(to->thread), 0, 0};
  }
#if defined(__SANITIZE_ADDRESS__)
  void* fake_stack = nullptr;
  const void* bottom =
      from_launcher ? static_cast<const void*>(to->stack) : g_sched->main_stack_bottom;
  const size_t size = from_launcher ? kStackBytes : g_sched->main_stack_size;
  __sanitizer_start_switch_fiber(from_finished ? nullptr : &fake_stack, bottom, size);
#else
  (void)from_finished;
#endif
#if defined(__x86_64__)
  void* const to_sp = to->sp;
#endif
#if defined(__SANITIZE_THREAD__)
  __tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  emu_context_switch(&from->sp, to_sp);
#else
  swapcontext(&from->context, &to->context);
#endif
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
#if defined(__SANITIZE_THREAD__)
  if (from_launcher) __tsan_ignore_thread_end();
#endif
}

// Gives the processor back to the scheduler (the running fiber waits at a barrier).
void Yield() { SwitchTo(g_sched->current, &g_sched->main); }

// A barrier over a changing set of live threads; a thread that exits stops counting (CUDA:
// exited threads no longer take part in __syncthreads). The last to arrive (or an exit that
// completes the count) moves the generation on, which makes every waiter runnable again.
// ThreadSanitizer's edges are CUDA's: each arrival (and exit) releases, each departure
// acquires, and no other edge joins the fibers of a block.
class Barrier {
 public:
  void SetLive(int n) {
    live_.store(n, std::memory_order_relaxed);
    arrived_.store(0, std::memory_order_relaxed);
  }

  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

  // Returns the number of threads that took part. The last to arrive calls on_last(live) (when
  // given) before it releases the others.
  template <typename OnLast>
  int Arrive(const OnLast& on_last) {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(this);
#endif
    const int live = live_.load(std::memory_order_relaxed);
    const int arrived = arrived_.load(std::memory_order_relaxed) + 1;
    if (arrived == live) {
#if defined(__SANITIZE_THREAD__)
      __tsan_acquire(this);  // on_last reads what every arrival wrote,
#endif
      on_last(live);
#if defined(__SANITIZE_THREAD__)
      __tsan_release(this);  // and every departure reads what on_last wrote
#endif
      Release();
    } else {
      arrived_.store(arrived, std::memory_order_relaxed);
      Fiber* self = g_sched->current;
      self->waiting_generation.store(generation(), std::memory_order_relaxed);
      self->waiting_at.store(this, std::memory_order_relaxed);
      Yield();
    }
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(this);
#endif
    return live;
  }
  int Arrive() {
    return Arrive([](int) {});
  }

  void Exit() {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(this);
#endif
    const int live = live_.load(std::memory_order_relaxed) - 1;
    live_.store(live, std::memory_order_relaxed);
    const int arrived = arrived_.load(std::memory_order_relaxed);
    if (arrived > 0 && arrived == live) Release();
  }

 private:
  void Release() {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<int> live_{0};
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

bool Fiber::Runnable() const {
  if (finished.load(std::memory_order_relaxed)) return false;
  const Barrier* b = waiting_at.load(std::memory_order_relaxed);
  return b == nullptr || b->generation() != waiting_generation.load(std::memory_order_relaxed);
}

struct Warp {
  Barrier barrier;
  Slot slots[2][32];
};

struct BlockState {
  Barrier block_barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  size_t smem_bytes = 0;
};

// ThreadSanitizer's edges between the launcher and a block's fibers: the launcher releases
// g_start_token once the block is set up and each fiber acquires it first; each fiber releases
// g_end_token last and the launcher acquires it after the block. (Fixed addresses: a fiber must
// not read a pointer the launcher wrote to find them.)
[[maybe_unused]] int g_start_token = 0;
[[maybe_unused]] int g_end_token = 0;

BlockState* g_block = nullptr;  // set by Launch before the block's threads start

Fiber& Self() { return *g_sched->current; }

void Land(const PendingCopy& c) { std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes)); }

void FlushAll() {
  for (const PendingCopy& c : Self().pending) Land(c);
  Self().pending.clear();
}

// A fiber's whole life: one CUDA thread of one block.
[[noreturn]] void FiberMain(Fiber* f) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &g_sched->main_stack_bottom, &g_sched->main_stack_size);
#endif
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(&g_start_token);
#endif
  (*g_sched->body)();
  FlushAll();  // copies never waited for still land (they do on the device)
  g_block->warps[static_cast<size_t>(f->warp)]->barrier.Exit();
  g_block->block_barrier.Exit();
#if defined(__SANITIZE_THREAD__)
  __tsan_release(&g_end_token);
#endif
  f->finished.store(true, std::memory_order_relaxed);
  SwitchTo(f, &g_sched->main, /*from_finished=*/true);
  Fail("a finished fiber was resumed");
}

#if !defined(__x86_64__)
void FiberStart() { FiberMain(g_sched->current); }
#endif

// Prepares `f` to start FiberMain(f) at its next switch.
void MakeContext(Fiber* f) {
  EMU_UNPOISON(f->stack, kStackBytes);
#if defined(__x86_64__)
  // Seven words below the top: the six registers emu_context_switch pops (r15, r14, r13 = the
  // entry, r12 = its argument, rbx, rbp) and the return address, emu_fiber_entry. After the
  // `ret` the stack pointer is 16-byte aligned, as the `call` there needs.
  auto* top = reinterpret_cast<uintptr_t*>(f->stack + kStackBytes - 24);
  top[0] = reinterpret_cast<uintptr_t>(&emu_fiber_entry);
  uintptr_t* sp = top - 6;
  sp[0] = 0;                                        // r15
  sp[1] = 0;                                        // r14
  sp[2] = reinterpret_cast<uintptr_t>(&FiberMain);  // r13
  sp[3] = reinterpret_cast<uintptr_t>(f);           // r12
  sp[4] = 0;                                        // rbx
  sp[5] = 0;                                        // rbp
  f->sp = sp;
#else
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = f->stack;
  f->context.uc_stack.ss_size = kStackBytes;
  f->context.uc_link = nullptr;
  makecontext(&f->context, &FiberStart, 0);
#endif
}

std::unique_ptr<Fiber> NewFiber() {
  auto f = std::make_unique<Fiber>();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) Fail("cannot map a fiber stack");
  mprotect(mem, page, PROT_NONE);
  f->stack = static_cast<unsigned char*>(mem) + page;
#if defined(__SANITIZE_THREAD__)
  f->tsan_fiber = __tsan_create_fiber(0);
#endif
  return f;
}

// Runs one block: every fiber from the start of `body` to its end. Each round visits the
// runnable fibers in a fresh pseudo-random order (fixed seed: every run the same), and each
// runs until it waits at a barrier or warp collective, or returns. Random rounds, not a fixed
// order: a missing barrier between two warps shows only when the reader runs before the writer,
// and with a fixed order the same pair would always run the same way round.
void RunBlock(int threads) {
  Scheduler& s = *g_sched;
  while (static_cast<int>(s.fibers.size()) < threads) s.fibers.push_back(NewFiber());
  std::vector<Fiber*> order;
  for (int t = 0; t < threads; ++t) {
    Fiber* f = s.fibers[static_cast<size_t>(t)].get();
    f->finished.store(false, std::memory_order_relaxed);
    f->waiting_at.store(nullptr, std::memory_order_relaxed);
    f->thread = t;
    f->warp = t / 32;
    f->lane = t % 32;
    f->collectives = 0;
    f->pending.clear();
    f->next_group = 0;
    MakeContext(f);
    order.push_back(f);
  }
#if defined(__SANITIZE_THREAD__)
  __tsan_release(&g_start_token);  // everything above, and the block's set-up, to the fibers
#endif
  int left = threads;
  while (left > 0) {
    std::shuffle(order.begin(), order.end(), s.rng);
    bool ran = false;
    for (Fiber* f : order) {
      if (!f->Runnable()) continue;
      f->waiting_at.store(nullptr, std::memory_order_relaxed);
      ran = true;
      SwitchTo(&s.main, f);
      if (f->finished.load(std::memory_order_relaxed)) --left;
    }
    if (!ran) {
      threadIdx = {static_cast<unsigned>(order.front()->thread), 0, 0};
      Fail("deadlock: every live thread waits at a barrier that not every live thread reached");
    }
    order.erase(
        std::remove_if(order.begin(), order.end(),
                       [](Fiber* f) { return f->finished.load(std::memory_order_relaxed); }),
        order.end());
  }
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

int LaneId() { return Self().lane; }

const Slot* WarpExchange(const Slot& mine, void (*combine)(Slot* all)) {
  Fiber& self = Self();
  Warp& w = *g_block->warps[static_cast<size_t>(self.warp)];
  Slot* slots = w.slots[self.collectives++ & 1];
  slots[self.lane] = mine;
  // The last lane to arrive has seen every lane's operands: it checks that all 32 took part
  // with the same operation, and combines them before it releases the others.
  w.barrier.Arrive([&](int participants) {
    if (participants != 32) {
      Fail("warp collective (op " + std::to_string(mine.op) + ") with only " +
           std::to_string(participants) + " live lanes");
    }
    for (int l = 0; l < 32; ++l) {
      if (slots[l].op != mine.op) {
        Fail("warp collective: lane " + std::to_string(self.lane) + " issued op " +
             std::to_string(mine.op) + ", lane " + std::to_string(l) + " op " +
             std::to_string(slots[l].op));
      }
    }
    if (combine != nullptr) combine(slots);
  });
  return slots;
}

void SyncThreads() { g_block->block_barrier.Arrive(); }

void SyncWarp(unsigned mask) {
  if (mask != 0xffffffffu) Fail("__syncwarp: only the full mask is emulated");
  Warp& w = *g_block->warps[static_cast<size_t>(Self().warp)];
  if (w.barrier.Arrive() != 32) Fail("__syncwarp with exited lanes");
}

void CpAsync(void* dst, const void* src, int bytes) {
  PendingCopy c{dst, src, bytes, -1};
  if (g_mode == CpAsyncMode::kLandAtIssue) {
    Land(c);
  } else {
    Self().pending.push_back(c);
  }
}

void CpAsyncCommit() {
  Fiber& self = Self();
  const int group = self.next_group++;
  for (PendingCopy& c : self.pending) {
    if (c.group < 0) c.group = group;
  }
}

void CpAsyncWait(int n) {
  // Groups g <= newest - n must have landed; uncommitted copies are not waited for.
  Fiber& self = Self();
  const int newest = self.next_group - 1;
  std::deque<PendingCopy> keep;
  for (const PendingCopy& c : self.pending) {
    if (c.group >= 0 && c.group <= newest - n) {
      Land(c);
    } else {
      keep.push_back(c);
    }
  }
  self.pending.swap(keep);
}

void Launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  // One launch at a time: the running block's state (g_block, the shared memory, the
  // scheduler) is global, and two host threads may launch at once (the backend's workers).
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
  // The fibers and their stacks are kept for the next launch of any host thread.
  static Scheduler* scheduler = new Scheduler;
  {
    // The emulator's own state, read by the fibers of the last launch as they finished (after
    // their last edge to the launcher): not the kernel's data.
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_begin();
    scheduler->main.tsan_fiber = __tsan_get_current_fiber();
#endif
    g_sched = scheduler;
    scheduler->body = &body;
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_end();
#endif
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
        blockIdx = {bx, by, bz};
        blockDim = block;
        gridDim = grid;
        g_block = &state;
        RunBlock(threads);
#if defined(__SANITIZE_THREAD__)
        __tsan_acquire(&g_end_token);
#endif
        g_block = nullptr;
        EMU_UNPOISON(smem_raw, kSmemCapacity);
      }
    }
  }
}

}  // namespace emu
