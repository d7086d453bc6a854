// kernels/cpu/scratch.h: a thread's kept buffers are reused by its next call, larger ones are not
// kept, ReleaseIdleScratch frees only what no call holds (also another thread's, while that
// thread is between calls), and holding one use twice on a thread aborts.
#include "kernels/cpu/scratch.h"

#include <atomic>
#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::kernels::cpu {
namespace {

TEST(ScratchTest, KeptReusedAndReleasedOnlyWhenNotHeld) {
  ReleaseIdleScratch();
  char* first;
  {
    ScratchBuffer a(ScratchUse::kPackedKv, 1 << 20);
    first = a.data();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    // Held: neither counted as idle nor freed.
    EXPECT_EQ(KeptScratchBytes(), 0);
    EXPECT_EQ(ReleaseIdleScratch(), 0);
    a.data()[(1 << 20) - 1] = 1;  // still ours (ASan would see a freed buffer)
  }
  EXPECT_EQ(KeptScratchBytes(), 1 << 20);
  {
    ScratchBuffer again(ScratchUse::kPackedKv, 1000);  // smaller: the same buffer
    EXPECT_EQ(again.data(), first);
    ScratchBuffer other(ScratchUse::kTask, 4096);  // another use: a buffer of its own
    EXPECT_NE(other.data(), first);
  }
  EXPECT_EQ(ReleaseIdleScratch(), (1 << 20) + 4096);
  EXPECT_EQ(KeptScratchBytes(), 0);
  {
    ScratchBuffer big(ScratchUse::kMultiHead, kKeepBytes + 1);  // not kept
    big.data()[kKeepBytes] = 1;
  }
  EXPECT_EQ(KeptScratchBytes(), 0);
}

TEST(ScratchTest, AnotherThreadsIdleBuffersAreReleasedToo) {
  ReleaseIdleScratch();
  std::thread worker([] { ScratchBuffer b(ScratchUse::kTask, 12345); });
  worker.join();  // the thread is gone: its buffers went with it
  EXPECT_EQ(KeptScratchBytes(), 0);
  std::atomic<int> step{0};
  std::thread idle([&] {
    { ScratchBuffer b(ScratchUse::kTask, 4096); }
    step = 1;
    while (step.load() != 2) std::this_thread::yield();  // between calls, buffer kept
    ScratchBuffer b(ScratchUse::kTask, 4096);            // after the release: a fresh one
    b.data()[4095] = 1;
  });
  while (step.load() != 1) std::this_thread::yield();
  EXPECT_EQ(ReleaseIdleScratch(), 4096);
  step = 2;
  idle.join();
}

TEST(ScratchDeathTest, HoldingAUseTwiceAborts) {
  EXPECT_DEATH(
      {
        ScratchBuffer a(ScratchUse::kTask, 64);
        ScratchBuffer b(ScratchUse::kTask, 64);
      },
      "held twice");
}

}  // namespace
}  // namespace attnserve::kernels::cpu
