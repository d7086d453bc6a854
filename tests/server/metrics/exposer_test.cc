// Serves /metrics through the real prometheus-cpp Exposer on 127.0.0.1 (an ephemeral port) and
// fetches it over HTTP, also while other threads record as fast as they can.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "tests/server/metrics/exposition.h"

namespace attnserve::metrics {
namespace {

using testing::Exposition;
using ::testing::HasSubstr;
using ::testing::Optional;

std::unique_ptr<Metrics> ServeOnLoopback() {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create({.listen_address = "127.0.0.1:0", .version = "test", .backend = "cpu"});
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (!metrics.ok()) return nullptr;
  EXPECT_GT((*metrics)->listening_port(), 0);
  return std::move(*metrics);
}

Exposition Fetch(int port) {
  std::string error;
  std::optional<testing::HttpResponse> response = testing::HttpGet(port, "/metrics", &error);
  EXPECT_TRUE(response.has_value()) << error;
  if (!response) return {};
  EXPECT_EQ(response->status, 200) << response->headers;
  EXPECT_THAT(response->headers, HasSubstr("text/plain"));
  std::optional<Exposition> parsed = testing::ParseExposition(response->body, &error);
  EXPECT_TRUE(parsed.has_value()) << error;
  return parsed.value_or(Exposition{});
}

TEST(ExposerTest, ServesWhatWasRecorded) {
  auto metrics = ServeOnLoopback();
  ASSERT_NE(metrics, nullptr);
  metrics->RequestStarted();
  metrics->RequestFinished(Rpc::kAttend, 0, absl::Milliseconds(3));
  metrics->ForDevice("cpu").SetMemory(1, 2, 3);
  const Exposition e = Fetch(metrics->listening_port());
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "OK"}}),
              Optional(1.0));
  EXPECT_THAT(e.Value("attnserve_request_duration_seconds_count", {{"rpc", "Attend"}}),
              Optional(1.0));
  EXPECT_THAT(e.Value("attnserve_device_memory_pool_bytes", {{"device", "cpu"}}), Optional(3.0));
  EXPECT_GT(e.Value("attnserve_host_resident_memory_bytes").value_or(0), 0);
}

TEST(ExposerTest, ScrapesRunTheHooks) {
  auto metrics = ServeOnLoopback();
  ASSERT_NE(metrics, nullptr);
  std::atomic<int> calls = 0;
  auto hook = metrics->OnScrape([&] { calls.fetch_add(1); });
  Fetch(metrics->listening_port());
  Fetch(metrics->listening_port());
  EXPECT_EQ(calls.load(), 2);
}

TEST(ExposerTest, PortInUseIsUnavailable) {
  auto first = ServeOnLoopback();
  ASSERT_NE(first, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(first->listening_port());
  absl::StatusOr<std::unique_ptr<Metrics>> second = Metrics::Create({.listen_address = address});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(address));
}

TEST(ExposerTest, StaysCorrectWhileOtherThreadsRecord) {
  auto metrics = ServeOnLoopback();
  ASSERT_NE(metrics, nullptr);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::atomic<int> running = kThreads;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        RequestScope scope(metrics.get(), Rpc::kAttend);
        metrics->SetQueued(i % 17, i);
        metrics->ObserveQueueTime(absl::Microseconds(i % 1000));
        metrics->ObserveBatch(1 + i % 64, 1 + i);
        metrics->ForBackend("cpu").ObserveCompute(absl::Microseconds(50), 1000.0);
        metrics->ForDevice("dev" + std::to_string(t)).SetMemory(i, 2 * i, i / 2);
        scope.Finish(i % 10 == 0 ? 8 : 0);
      }
      running.fetch_sub(1);
    });
  }

  // Scrape until the writers are done (and at least 5 times): every scrape parses, its
  // histograms are self-consistent, counters never go backwards, and each answers promptly.
  const int port = metrics->listening_port();
  double last_total = 0;
  int scrapes = 0;
  double slowest_s = 0;
  while (running.load() > 0 || scrapes < 5) {
    const auto start = std::chrono::steady_clock::now();
    const Exposition e = Fetch(port);
    slowest_s = std::max(
        slowest_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    ++scrapes;
    const testing::LabelSet attend = {{"rpc", "Attend"}};
    const double count = e.Value("attnserve_request_duration_seconds_count", attend).value_or(-1);
    EXPECT_THAT(e.Bucket("attnserve_request_duration_seconds", attend,
                         std::numeric_limits<double>::infinity()),
                Optional(count));
    const double total =
        e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "OK"}}).value_or(-1);
    EXPECT_GE(total, last_total);
    last_total = total;
    const double in_flight = e.Value("attnserve_requests_in_flight").value_or(-1);
    EXPECT_GE(in_flight, 0);
    EXPECT_LE(in_flight, kThreads);
    if (HasFailure()) break;
  }
  for (std::thread& writer : writers) writer.join();
  EXPECT_LT(slowest_s, 2.0) << "slowest of " << scrapes << " scrapes";
  RecordProperty("scrapes", scrapes);

  const Exposition e = Fetch(port);
  const double n = kThreads * kPerThread;
  EXPECT_THAT(e.Value("attnserve_request_duration_seconds_count", {{"rpc", "Attend"}}),
              Optional(n));
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "OK"}}),
              Optional(n * 0.9));
  EXPECT_THAT(
      e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "RESOURCE_EXHAUSTED"}}),
      Optional(n * 0.1));
  EXPECT_THAT(e.Value("attnserve_requests_in_flight"), Optional(0.0));
  EXPECT_THAT(e.Value("attnserve_batch_size_requests_count"), Optional(n));
  EXPECT_THAT(e.Value("attnserve_flops_total", {{"backend", "cpu"}}), Optional(1000.0 * n));
}

}  // namespace
}  // namespace attnserve::metrics
