// server/core/idle_release.h on a fake clock: it releases once the server has been idle (no call
// open and none opened) for the whole `idle`, once per quiet period, never while a call is open,
// and a call arriving restarts the wait. Each step waits for the releaser to be asleep until its
// next look (FakeClock::BlockUntilWaiting) before time moves: nothing depends on real time.
#include "server/core/idle_release.h"

#include <atomic>

#include "gtest/gtest.h"
#include "server/batching/fake_clock.h"

namespace attnserve::server {
namespace {

class IdleReleaserTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kIdle = absl::Seconds(2);
  static constexpr absl::Duration kPeriod = absl::Milliseconds(500);  // idle / 4: its look interval

  IdleReleaser::Activity Activity() { return {open_.load(), opened_.load()}; }

  // Lets the releaser take its next look, `steps` times, and returns the releases then.
  int64_t Step(IdleReleaser& r, int steps = 1) {
    for (int i = 0; i < steps; ++i) {
      next_ += kPeriod;
      EXPECT_TRUE(clock_.BlockUntilWaiting(next_, absl::Minutes(5)));
      clock_.Advance(kPeriod);
    }
    // Asleep again: the look at the time just reached is done.
    EXPECT_TRUE(clock_.BlockUntilWaiting(next_ + kPeriod, absl::Minutes(5)));
    return r.releases();
  }

  batching::FakeClock clock_;
  absl::Time next_ = clock_.Now();
  std::atomic<int64_t> open_{0}, opened_{0}, released_{0};
};

TEST_F(IdleReleaserTest, ReleasesOncePerQuietPeriodAndNeverWhileACallIsOpen) {
  IdleReleaser r(
      kIdle, &clock_, [this] { return Activity(); }, [this] { ++released_; });
  // A fresh server holds nothing to release, however long it idles.
  EXPECT_EQ(Step(r, 8), 0);
  // A call opens and stays open past `idle`: no release.
  opened_ = 1;
  open_ = 1;
  EXPECT_EQ(Step(r, 6), 0);
  // It ends; the next look begins the quiet stretch: released `idle` after it, and only once.
  open_ = 0;
  EXPECT_EQ(Step(r, 3), 0);
  EXPECT_EQ(Step(r, 1), 0);
  EXPECT_EQ(Step(r, 1), 1);
  EXPECT_EQ(Step(r, 10), 1);
  EXPECT_EQ(released_.load(), 1);
  // A call that came and went between two looks restarts the wait: the first look after it
  // sees it, the next begins the quiet stretch, released `idle` after that.
  opened_ = 2;
  EXPECT_EQ(Step(r, 4), 1);
  opened_ = 3;  // another, before the release was due
  EXPECT_EQ(Step(r, 5), 1);
  EXPECT_EQ(Step(r, 1), 2);
  EXPECT_EQ(released_.load(), 2);
}

}  // namespace
}  // namespace attnserve::server
