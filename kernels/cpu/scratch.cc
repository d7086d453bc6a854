#include "kernels/cpu/scratch.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace attnserve::kernels::cpu {
namespace {

char* Allocate(int64_t n) {
  return static_cast<char*>(::operator new[](static_cast<size_t>(n), std::align_val_t{64}));
}
void Free(char* p) {
  if (p != nullptr) ::operator delete[](p, std::align_val_t{64});
}

// One kept buffer. state: kFree (no holder), kHeld (its thread's ScratchBuffer has it), kTaking
// (ReleaseIdleScratch is freeing it). Only the owning thread moves kFree -> kHeld, only
// ReleaseIdleScratch kFree -> kTaking, so data and size are touched by one side at a time.
struct Slot {
  static constexpr int kFree = 0, kHeld = 1, kTaking = 2;
  std::atomic<int> state{kFree};
  char* data = nullptr;
  int64_t size = 0;
};

struct ThreadSlots;

// Every thread's slots, for ReleaseIdleScratch.
struct Registry {
  Mutex mu;
  std::vector<ThreadSlots*> threads ABSL_GUARDED_BY(mu);
};
Registry& TheRegistry() {
  static Registry* registry = new Registry;  // never destroyed: threads may outlive statics
  return *registry;
}

struct ThreadSlots {
  Slot slots[kNumScratchUses];
  ThreadSlots() {
    Registry& r = TheRegistry();
    MutexLock lock(&r.mu);
    r.threads.push_back(this);
  }
  ~ThreadSlots() {
    Registry& r = TheRegistry();
    MutexLock lock(&r.mu);
    for (size_t i = 0; i < r.threads.size(); ++i) {
      if (r.threads[i] == this) {
        r.threads[i] = r.threads.back();
        r.threads.pop_back();
        break;
      }
    }
    for (Slot& s : slots) Free(s.data);
  }
};
thread_local ThreadSlots t_slots;

}  // namespace

ScratchBuffer::ScratchBuffer(ScratchUse use, int64_t bytes) : use_(static_cast<int>(use)) {
  Slot& s = t_slots.slots[use_];
  int expected = Slot::kFree;
  while (!s.state.compare_exchange_weak(expected, Slot::kHeld, std::memory_order_acquire)) {
    if (expected == Slot::kHeld) {
      std::fprintf(stderr, "ScratchBuffer: use %d held twice on one thread\n", use_);
      std::abort();
    }
    expected = Slot::kFree;
    std::this_thread::yield();  // ReleaseIdleScratch is freeing it: a moment
  }
  kept_ = bytes <= kKeepBytes;
  if (kept_) {
    if (s.size < bytes) {
      Free(s.data);
      s.data = Allocate(bytes);
      s.size = bytes;
    }
    data_ = s.data;
  } else {
    s.state.store(Slot::kFree, std::memory_order_release);
    data_ = Allocate(bytes);
  }
}

ScratchBuffer::~ScratchBuffer() {
  if (kept_) {
    t_slots.slots[use_].state.store(Slot::kFree, std::memory_order_release);
  } else {
    Free(data_);
  }
}

namespace {

// Calls visit(slot) for every slot no thread holds, each taken (kTaking) for the call so that
// its thread cannot use it meanwhile, under the registry's lock.
template <typename Visit>
void ForEachFreeSlot(Visit visit) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  for (ThreadSlots* t : r.threads) {
    for (Slot& s : t->slots) {
      int expected = Slot::kFree;
      if (!s.state.compare_exchange_strong(expected, Slot::kTaking, std::memory_order_acquire)) {
        continue;
      }
      visit(s);
      s.state.store(Slot::kFree, std::memory_order_release);
    }
  }
}

}  // namespace

int64_t ReleaseIdleScratch() {
  int64_t freed = 0;
  ForEachFreeSlot([&](Slot& s) {
    freed += s.size;
    Free(s.data);
    s.data = nullptr;
    s.size = 0;
  });
  return freed;
}

int64_t KeptScratchBytes() {
  // Read only under the slot's own protocol: a held slot's size may change under its thread.
  int64_t bytes = 0;
  ForEachFreeSlot([&](Slot& s) { bytes += s.size; });
  return bytes;
}

}  // namespace attnserve::kernels::cpu
