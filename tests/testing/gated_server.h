// A test fixture for the server under concurrency: a real ServerHost on a free port computing on
// a GatedBackend (gated_backend.h) whose gate the test opens and closes, a Client for it, and
// the metrics the server counts into. Tests wait for events (a call entering the backend, a
// metric reaching a value), never for a time. Header-only: server tests alone include it.
#ifndef ATTNSERVE_TESTS_TESTING_GATED_SERVER_H_
#define ATTNSERVE_TESTS_TESTING_GATED_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"
#include "server/server_host.h"
#include "tests/testing/exposition.h"
#include "tests/testing/gated_backend.h"
#include "tests/testing/requests.h"

namespace attnserve::testing {

// A thread of a gated-server test, joined like a std::thread. One destroyed while still joinable
// (an ASSERT returned from the test early) first opens the gate, so that no call of its can stay
// parked in the backend, then joins: the failed assertion is reported with its message, where a
// joinable std::thread would end the test binary in std::terminate.
class TestThread {
 public:
  TestThread(GatedBackend* gate, std::function<void()> body)
      : gate_(gate), thread_(std::move(body)) {}
  TestThread(TestThread&&) noexcept = default;
  TestThread& operator=(TestThread&&) = delete;
  ~TestThread() {
    if (!thread_.joinable()) return;
    if (gate_ != nullptr) gate_->Open();
    thread_.join();
  }

  void join() { thread_.join(); }

 private:
  GatedBackend* gate_;  // nullptr when the test computes on a backend of its own
  std::thread thread_;
};

class GatedServerTest : public ::testing::Test {
 public:
  // Starts a server computing on `backend` (the gated reference backend, gate_, by default).
  void Start(server::ServerOptions options = {},
             std::unique_ptr<kernels::Backend> backend = nullptr) {
    options.listen_address = "127.0.0.1:0";
    if (backend == nullptr) {
      auto gated = std::make_unique<GatedBackend>();
      gate_ = gated.get();
      backend = std::move(gated);
    }
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, std::move(backend), metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    target_ = "127.0.0.1:" + std::to_string(host_->port());
    // The throttle off: these tests count what reaches the server, and a pushback would hold
    // the next call back for a time (tests/client/throttle_test.cc tests the throttle).
    ClientOptions client_options;
    client_options.throttle.enabled = false;
    client_ = Client::Create(target_, client_options).value();
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();
    host_.reset();
  }

  // Starts `body` on a thread that opens the gate before joining when the test returns early.
  TestThread Spawn(std::function<void()> body) { return TestThread(gate_, std::move(body)); }

  // Closes the gate and parks a request of its own signature in the backend, so the one batch
  // thread is busy and everything sent afterwards stays queued. Returns the blocker's thread
  // (join it after opening the gate).
  TestThread Block() {
    gate_->Close();
    const int calls_before = static_cast<int>(gate_->batch_sizes().size());
    TestThread blocker = Spawn([this] {
      AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, {1, 1, 1, 2, 2, 4, 4}, false, false, 99);
      EXPECT_TRUE(client_->Attend(c.request).ok());
    });
    gate_->AwaitCalls(calls_before + 1);
    return blocker;
  }

  // The sample of `family` with `labels` in the server's exposition text.
  double Metric(const std::string& family, const std::vector<std::string>& labels) {
    return MetricSample(metrics_->ExpositionText(), family, labels);
  }
  // attnserve_requests_dropped_total for one drop reason.
  double Dropped(const std::string& reason) {
    return Metric("attnserve_requests_dropped_total", {"reason=\"" + reason + "\""});
  }
  // Polls until `done()` holds (the server updates its metrics on another thread). The bound
  // only guards against a hang: a loaded machine may take long (5 minutes at most).
  template <typename Done>
  bool Await(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done();
  }
  // Polls until the metric reaches `value`.
  bool AwaitMetric(const std::string& family, const std::vector<std::string>& labels,
                   double value) {
    return Await([&] { return Metric(family, labels) == value; });
  }

 protected:
  GatedBackend* gate_ = nullptr;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
  std::string target_;
  std::unique_ptr<Client> client_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_GATED_SERVER_H_
