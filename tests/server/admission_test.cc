// server/core/admission.h: the gate's arithmetic on injected times, against expectations worked out
// by hand from its contract ((in_flight + 1) x interval against kTimeoutShare of the time left).
#include "server/core/admission.h"

#include "gtest/gtest.h"
#include "server/batching/pushback.h"

namespace attnserve::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
absl::Time At(int ms) { return kT0 + absl::Milliseconds(ms); }

TEST(AdmissionGateTest, AdmitsAnyCallWhenNothingIsInFlight) {
  AdmissionGate gate;
  // Even an already expired deadline: the gate alone never locks the server shut.
  EXPECT_TRUE(gate.Admit(At(0), At(0)).ok());
  EXPECT_EQ(gate.in_flight(), 1);
  gate.Done(At(100));
  EXPECT_EQ(gate.in_flight(), 0);
  EXPECT_EQ(gate.interval(), absl::Milliseconds(100));
  // Idle for a second: the first call of a new busy period is admitted whatever the interval.
  EXPECT_TRUE(gate.Admit(At(1100), At(1101)).ok());
}

TEST(AdmissionGateTest, RefusesWhenTheCallsAheadOutlastTheShareOfItsTimeout) {
  AdmissionGate gate;
  ASSERT_TRUE(gate.Admit(At(0), absl::InfiniteFuture()).ok());
  gate.Done(At(10));  // interval 10 ms; the busy period ended
  ASSERT_TRUE(gate.Admit(At(20), absl::InfiniteFuture()).ok());  // starts a new one at 20
  ASSERT_TRUE(gate.Admit(At(20), absl::InfiniteFuture()).ok());
  ASSERT_TRUE(gate.Admit(At(20), absl::InfiniteFuture()).ok());
  EXPECT_EQ(gate.in_flight(), 3);
  // A fourth waits about (3 + 1) x 10 ms = 40 ms: admitted with 80 ms left (share 0.5: 40),
  // refused with 79 ms left.
  ASSERT_EQ(AdmissionGate::kTimeoutShare, 0.5);
  absl::Status refused = gate.Admit(At(20), At(99));
  EXPECT_EQ(refused.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(refused.message().find("3 calls ahead"), std::string::npos) << refused.message();
  // Pushback: until a call with 79 ms left would be admitted (40 - 39.5 ms), at least one
  // interval (10 ms).
  EXPECT_EQ(batching::PushbackMs(refused), 10);
  EXPECT_EQ(gate.in_flight(), 3);  // a refused call is not in flight
  // With 20 ms left: 40 - 10 = 30 ms, after which three calls ahead would have been answered.
  EXPECT_EQ(batching::PushbackMs(gate.Admit(At(20), At(40))), 30);
  EXPECT_TRUE(gate.Admit(At(20), At(100)).ok());
  EXPECT_EQ(gate.in_flight(), 4);
}

TEST(AdmissionGateTest, IntervalIsAnAverageOfTheTimesBetweenAnswersWhileBusy) {
  AdmissionGate gate;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(gate.Admit(At(0), absl::InfiniteFuture()).ok());
  gate.Done(At(20));  // first answer: the interval is the first sample, 20 ms
  EXPECT_EQ(gate.interval(), absl::Milliseconds(20));
  gate.Done(At(60));  // 40 ms after the previous answer
  const double w = AdmissionGate::kWeight;
  EXPECT_EQ(gate.interval(), (1 - w) * absl::Milliseconds(20) + w * absl::Milliseconds(40));
}

}  // namespace
}  // namespace attnserve::server
