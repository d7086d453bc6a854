// The drain's one object (server/core/drain.h): its counts, its listeners and its waits, each
// wait ended by an event of the test (another thread's EndRead, CallClosed or Cut), never by a
// timing window.
#include "server/core/drain.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

struct Counting : Drain::Listener {
  int told = 0;
  void OnDrain() override { ++told; }
};

TEST(DrainTest, BeginTellsEachJoinedListenerOnceAndLaterOnesAreRefused) {
  Drain drain;
  Counting a, b, gone;
  EXPECT_FALSE(drain.Join(&a));
  EXPECT_FALSE(drain.Join(&b));
  EXPECT_FALSE(drain.Join(&gone));
  drain.Leave(&gone);
  EXPECT_FALSE(drain.draining());
  drain.Begin();
  EXPECT_TRUE(drain.draining());
  EXPECT_EQ(a.told, 1);
  EXPECT_EQ(b.told, 1);
  EXPECT_EQ(gone.told, 0);
  Counting late;
  EXPECT_TRUE(drain.Join(&late));  // must end at once; never told
  drain.Begin();                   // a second Begin tells nobody again
  EXPECT_EQ(a.told, 1);
  EXPECT_EQ(late.told, 0);
  drain.Leave(&late);  // not joined: no-op
}

TEST(DrainTest, CountsCallsForTheIdleReleaserAndWaitsForTheLastOne) {
  Drain drain;
  drain.CallOpened();
  drain.CallOpened();
  EXPECT_EQ(drain.activity().open, 2);
  EXPECT_EQ(drain.activity().opened, 2);
  EXPECT_EQ(drain.AwaitNoCalls(absl::InfinitePast()), 2);  // a passed deadline: at once
  std::thread closer([&] {
    drain.CallClosed();
    drain.CallClosed();
  });
  EXPECT_EQ(drain.AwaitNoCalls(absl::InfiniteFuture()), 0);
  closer.join();
  EXPECT_EQ(drain.activity().open, 0);
  EXPECT_EQ(drain.activity().opened, 2);
}

// A read counted before the drain began is one the drain waits for (the call is served); one
// counted after is told to refuse its call. The python drain test's early calls, counted in
// flight, were once refused by a later look at draining().
TEST(DrainTest, BeginReadSaysWhetherTheDrainHadBegun) {
  Drain drain;
  EXPECT_FALSE(drain.BeginRead());
  drain.Begin();
  EXPECT_TRUE(drain.BeginRead());
  drain.EndRead();
  std::thread reader([&] { drain.EndRead(); });
  drain.AwaitReads(absl::InfiniteFuture());  // waited for both
  reader.join();
}

TEST(DrainTest, AwaitReadsReturnsOnTheLastReadOrWhenCut) {
  Drain drain;
  EXPECT_FALSE(drain.BeginRead());
  std::thread reader([&] { drain.EndRead(); });
  drain.AwaitReads(absl::InfiniteFuture());  // returns once the read ended
  reader.join();

  EXPECT_FALSE(drain.BeginRead());  // a read that never ends
  drain.CallOpened();
  std::thread cutter([&] { drain.Cut(absl::InfinitePast()); });
  drain.AwaitReads(absl::InfiniteFuture());                  // returns at the cut
  EXPECT_EQ(drain.AwaitNoCalls(absl::InfiniteFuture()), 1);  // bounded by the cut's deadline
  cutter.join();
}

}  // namespace
}  // namespace attnserve::server
