// Records known observations into a Metrics without an endpoint, parses the exposition text
// and checks families, types, label sets, counts and bucket counts.
#include "server/metrics/metrics.h"

#include <limits>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/metrics/exposition.h"

namespace attnserve::metrics {
namespace {

using ::testing::ElementsAreArray;
using testing::Exposition;
using testing::LabelSet;
using ::testing::Optional;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::unique_ptr<Metrics> MakeMetrics() {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create({.version = "1.2.3", .backend = "cpu", .cuda = false});
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return std::move(*metrics);
}

Exposition Scrape(const Metrics& metrics) {
  std::string error;
  std::optional<Exposition> parsed = testing::ParseExposition(metrics.ExpositionText(), &error);
  EXPECT_TRUE(parsed.has_value()) << error;
  return parsed.value_or(Exposition{});
}

TEST(MetricsTest, EveryFamilyHasItsType) {
  auto metrics = MakeMetrics();
  // Families labelled by device appear once a device is named (the backend's at Create).
  metrics->ForDevice("cpu");
  const Exposition e = Scrape(*metrics);
  const std::map<std::string, std::string> expected = {
      {"attnserve_request_duration_seconds", "histogram"},
      {"attnserve_requests_total", "counter"},
      {"attnserve_requests_in_flight", "gauge"},
      {"attnserve_requests_dropped_total", "counter"},
      {"attnserve_queued_requests", "gauge"},
      {"attnserve_queued_bytes", "gauge"},
      {"attnserve_queue_duration_seconds", "histogram"},
      {"attnserve_batch_size_requests", "histogram"},
      {"attnserve_batch_size_tokens", "histogram"},
      {"attnserve_compute_duration_seconds", "histogram"},
      {"attnserve_flops_total", "counter"},
      {"attnserve_device_memory_used_bytes", "gauge"},
      {"attnserve_device_memory_total_bytes", "gauge"},
      {"attnserve_device_memory_pool_bytes", "gauge"},
      {"attnserve_host_resident_memory_bytes", "gauge"},
      {"attnserve_host_memory_limit_bytes", "gauge"},
      {"attnserve_module_bytes", "gauge"},
      {"attnserve_build_info", "gauge"},
      {"attnserve_session_pool_pages_used", "gauge"},
      {"attnserve_session_pool_pages_capacity", "gauge"},
      {"attnserve_session_pool_bytes_used", "gauge"},
      {"attnserve_session_pool_bytes_capacity", "gauge"},
      {"attnserve_session_pool_bytes_kept", "gauge"},
      {"attnserve_session_pool_tokens", "gauge"},
      {"attnserve_session_pages_shared", "gauge"},
      {"attnserve_sessions_active", "gauge"},
      {"attnserve_sessions_lost_total", "counter"},
      {"attnserve_sessions_restored_total", "counter"},
      {"attnserve_session_snapshot_bytes_total", "counter"},
      {"attnserve_sessions_moved_total", "counter"},
      {"attnserve_session_move_bytes_total", "counter"},
      {"attnserve_session_move_pause_seconds", "histogram"},
      {"attnserve_session_tokens_appended_total", "counter"},
      {"attnserve_session_extend_duration_seconds", "histogram"},
  };
  for (const auto& [name, type] : expected) {
    ASSERT_TRUE(e.types.contains(name)) << name;
    EXPECT_EQ(e.types.at(name), type) << name;
    EXPECT_FALSE(e.helps.at(name).empty()) << name;
  }
  EXPECT_EQ(e.types.size(), expected.size());
}

TEST(MetricsTest, BuildInfoIsOneWithItsLabels) {
  const Exposition e = Scrape(*MakeMetrics());
  EXPECT_THAT(e.Value("attnserve_build_info",
                      {{"version", "1.2.3"}, {"backend", "cpu"}, {"cuda", "false"}}),
              Optional(1.0));
}

TEST(MetricsTest, RequestsAreCountedByRpcAndCodeAndTimed) {
  auto metrics = MakeMetrics();
  for (int i = 0; i < 3; ++i) metrics->RequestStarted();
  EXPECT_THAT(Scrape(*metrics).Value("attnserve_requests_in_flight"), Optional(3.0));

  metrics->RequestFinished(Rpc::kAttend, 0, absl::Microseconds(30));
  metrics->RequestFinished(Rpc::kAttend, 0, absl::Milliseconds(1));
  metrics->RequestFinished(Rpc::kAttend, 3, absl::Seconds(2));
  const Exposition e = Scrape(*metrics);

  EXPECT_THAT(e.Value("attnserve_requests_in_flight"), Optional(0.0));
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "OK"}}),
              Optional(2.0));
  EXPECT_THAT(
      e.Value("attnserve_requests_total", {{"rpc", "Attend"}, {"code", "INVALID_ARGUMENT"}}),
      Optional(1.0));
  // OK series exist for every rpc from the start; other codes only once seen.
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "GetServerInfo"}, {"code", "OK"}}),
              Optional(0.0));
  EXPECT_EQ(e.All("attnserve_requests_total").size(), static_cast<size_t>(kNumRpcs + 1));

  const std::string h = "attnserve_request_duration_seconds";
  const LabelSet attend = {{"rpc", "Attend"}};
  EXPECT_THAT(e.Value(h + "_count", attend), Optional(3.0));
  EXPECT_THAT(e.Value(h + "_sum", attend), Optional(::testing::DoubleNear(2.00103, 1e-9)));
  EXPECT_THAT(e.Bucket(h, attend, 25e-6), Optional(0.0));
  EXPECT_THAT(e.Bucket(h, attend, 50e-6), Optional(1.0));  // 30 us
  EXPECT_THAT(e.Bucket(h, attend, 800e-6), Optional(1.0));
  EXPECT_THAT(e.Bucket(h, attend, 1.6e-3), Optional(2.0));  // 1 ms
  EXPECT_THAT(e.Bucket(h, attend, 1.6384), Optional(2.0));
  EXPECT_THAT(e.Bucket(h, attend, 3.2768), Optional(3.0));  // 2 s
  EXPECT_THAT(e.Bucket(h, attend, kInf), Optional(3.0));
  EXPECT_THAT(e.Value(h + "_count", {{"rpc", "MultiHeadAttention"}}), Optional(0.0));
}

TEST(MetricsTest, DurationBucketsAreTheDocumentedOnes) {
  auto metrics = MakeMetrics();
  const Exposition e = Scrape(*metrics);
  std::vector<double> bounds;
  for (const testing::Sample* s : e.All("attnserve_queue_duration_seconds_bucket")) {
    bounds.push_back(std::strtod(s->labels.at("le").c_str(), nullptr));
  }
  std::vector<double> expected = DurationBucketsSeconds();
  expected.push_back(kInf);
  ASSERT_EQ(bounds.size(), expected.size());
  for (size_t i = 0; i < bounds.size(); ++i) EXPECT_DOUBLE_EQ(bounds[i], expected[i]) << i;
  EXPECT_DOUBLE_EQ(expected.front(), 25e-6);
  EXPECT_GT(expected[expected.size() - 2], 20.0);  // tens of seconds
  EXPECT_THAT(BatchRequestsBuckets(),
              ElementsAreArray({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}));
}

TEST(MetricsTest, UnknownCodesReadAsUnknown) {
  auto metrics = MakeMetrics();
  metrics->RequestStarted();
  metrics->RequestFinished(Rpc::kLoadModule, 99, absl::Milliseconds(5));
  metrics->RequestStarted();
  metrics->RequestFinished(Rpc::kLoadModule, -1, absl::Milliseconds(5));
  EXPECT_THAT(Scrape(*metrics).Value("attnserve_requests_total",
                                     {{"rpc", "LoadModule"}, {"code", "UNKNOWN"}}),
              Optional(2.0));
  EXPECT_EQ(CodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(CodeName(static_cast<int>(absl::StatusCode::kResourceExhausted)), "RESOURCE_EXHAUSTED");
}

TEST(MetricsTest, DroppedByReasonAllPresentFromTheStart) {
  auto metrics = MakeMetrics();
  metrics->RecordDropped(DropReason::kQueueFull);
  metrics->RecordDropped(DropReason::kQueueFull);
  metrics->RecordDropped(DropReason::kShutdown, 5);
  const Exposition e = Scrape(*metrics);
  const std::string name = "attnserve_requests_dropped_total";
  EXPECT_THAT(e.Value(name, {{"reason", "queue_full"}}), Optional(2.0));
  EXPECT_THAT(e.Value(name, {{"reason", "shutdown"}}), Optional(5.0));
  EXPECT_THAT(e.Value(name, {{"reason", "queue_bytes"}}), Optional(0.0));
  EXPECT_THAT(e.Value(name, {{"reason", "deadline"}}), Optional(0.0));
  EXPECT_THAT(e.Value(name, {{"reason", "cancelled"}}), Optional(0.0));
}

TEST(MetricsTest, QueueAndBatches) {
  auto metrics = MakeMetrics();
  metrics->SetQueued(7, 7 << 20);
  metrics->ObserveQueueTime(absl::Microseconds(100));
  metrics->ObserveBatch(3, 300);
  metrics->ObserveBatch(1024, 1 << 22);
  const Exposition e = Scrape(*metrics);
  EXPECT_THAT(e.Value("attnserve_queued_requests"), Optional(7.0));
  EXPECT_THAT(e.Value("attnserve_queued_bytes"), Optional(double{7 << 20}));
  EXPECT_THAT(e.Bucket("attnserve_queue_duration_seconds", {}, 50e-6), Optional(0.0));
  EXPECT_THAT(e.Bucket("attnserve_queue_duration_seconds", {}, 100e-6), Optional(1.0));
  const std::string r = "attnserve_batch_size_requests";
  EXPECT_THAT(e.Bucket(r, {}, 2), Optional(0.0));
  EXPECT_THAT(e.Bucket(r, {}, 4), Optional(1.0));
  EXPECT_THAT(e.Bucket(r, {}, 512), Optional(1.0));
  EXPECT_THAT(e.Bucket(r, {}, 1024), Optional(2.0));  // a full batch lands on its bound
  EXPECT_THAT(e.Value(r + "_sum"), Optional(1027.0));
  const std::string t = "attnserve_batch_size_tokens";
  EXPECT_THAT(e.Bucket(t, {}, 256), Optional(0.0));
  EXPECT_THAT(e.Bucket(t, {}, 512), Optional(1.0));
  EXPECT_THAT(e.Bucket(t, {}, double{1 << 22}), Optional(2.0));
  EXPECT_THAT(e.Value(t + "_count"), Optional(2.0));
}

TEST(MetricsTest, ComputeAndFlopsByBackend) {
  auto metrics = MakeMetrics();
  BackendMetrics& cpu = metrics->ForBackend("cpu");
  EXPECT_EQ(&cpu, &metrics->ForBackend("cpu"));
  cpu.ObserveCompute(absl::Milliseconds(10), 1e9);
  cpu.ObserveCompute(absl::Milliseconds(10), 1e9);
  metrics->ForBackend("reference").ObserveCompute(absl::Seconds(1), 5e6);
  const Exposition e = Scrape(*metrics);
  EXPECT_THAT(e.Value("attnserve_flops_total", {{"backend", "cpu"}}), Optional(2e9));
  EXPECT_THAT(e.Value("attnserve_flops_total", {{"backend", "reference"}}), Optional(5e6));
  EXPECT_THAT(e.Value("attnserve_compute_duration_seconds_count", {{"backend", "cpu"}}),
              Optional(2.0));
  EXPECT_THAT(e.Bucket("attnserve_compute_duration_seconds", {{"backend", "cpu"}}, 6.4e-3),
              Optional(0.0));
  EXPECT_THAT(e.Bucket("attnserve_compute_duration_seconds", {{"backend", "cpu"}}, 12.8e-3),
              Optional(2.0));
}

TEST(MetricsTest, ScrapeHookSetsDeviceMemoryUntilDestroyed) {
  auto metrics = MakeMetrics();
  int calls = 0;
  DeviceMetrics& gpu = metrics->ForDevice("cuda:0");
  auto hook = metrics->OnScrape([&] {
    ++calls;
    gpu.SetMemory(int64_t{3} << 30, int64_t{80} << 30, int64_t{2} << 30);
  });
  const Exposition e = Scrape(*metrics);
  EXPECT_EQ(calls, 1);
  const LabelSet dev = {{"device", "cuda:0"}};
  EXPECT_THAT(e.Value("attnserve_device_memory_used_bytes", dev), Optional(double{3LL << 30}));
  EXPECT_THAT(e.Value("attnserve_device_memory_total_bytes", dev), Optional(double{80LL << 30}));
  EXPECT_THAT(e.Value("attnserve_device_memory_pool_bytes", dev), Optional(double{2LL << 30}));
  hook.reset();
  Scrape(*metrics);
  EXPECT_EQ(calls, 1);
}

TEST(MetricsTest, HostMemoryIsReadAtScrapeTime) {
  auto metrics = MakeMetrics();
  metrics->SetModuleBytes(12345);
  const Exposition e = Scrape(*metrics);
  const double rss = e.Value("attnserve_host_resident_memory_bytes").value_or(0);
  const double limit = e.Value("attnserve_host_memory_limit_bytes").value_or(0);
  EXPECT_GT(rss, 1 << 20);  // a test binary with gtest and prometheus-cpp is over 1 MiB
  EXPECT_GE(limit, rss);
  EXPECT_THAT(e.Value("attnserve_module_bytes"), Optional(12345.0));

  // Touch 64 MiB: the next scrape must see it without any refresh call.
  std::vector<char> ballast(64 << 20, 1);
  const double grown = Scrape(*metrics).Value("attnserve_host_resident_memory_bytes").value_or(0);
  EXPECT_GE(grown, rss + (60 << 20)) << ballast[12345];
}

TEST(MetricsTest, RequestScopeCountsEveryRequestOnce) {
  auto metrics = MakeMetrics();
  {
    RequestScope scope(metrics.get(), Rpc::kListModules);
    EXPECT_THAT(Scrape(*metrics).Value("attnserve_requests_in_flight"), Optional(1.0));
    scope.Finish(5);  // NOT_FOUND
    scope.Finish(0);  // ignored
  }
  { RequestScope forgotten(metrics.get(), Rpc::kListModules); }
  const Exposition e = Scrape(*metrics);
  EXPECT_THAT(e.Value("attnserve_requests_in_flight"), Optional(0.0));
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "ListModules"}, {"code", "NOT_FOUND"}}),
              Optional(1.0));
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "ListModules"}, {"code", "UNKNOWN"}}),
              Optional(1.0));
  EXPECT_THAT(e.Value("attnserve_requests_total", {{"rpc", "ListModules"}, {"code", "OK"}}),
              Optional(0.0));
  EXPECT_THAT(e.Value("attnserve_request_duration_seconds_count", {{"rpc", "ListModules"}}),
              Optional(2.0));
}

TEST(MetricsTest, ConcurrentRecordingLosesNothing) {
  auto metrics = MakeMetrics();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        metrics->RequestStarted();
        // Codes cycle so that the lazily made {rpc, code} children race on creation.
        metrics->RequestFinished(Rpc::kAttend, (t + i) % kNumCodes, absl::Microseconds(i));
        metrics->ForBackend("cpu").ObserveCompute(absl::Microseconds(1), 2.0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const Exposition e = Scrape(*metrics);
  double total = 0;
  for (const testing::Sample* s : e.All("attnserve_requests_total")) total += s->value;
  EXPECT_EQ(total, kThreads * kPerThread);
  EXPECT_EQ(e.All("attnserve_requests_total").size(),
            static_cast<size_t>(kNumRpcs - 1 + kNumCodes));
  EXPECT_THAT(e.Value("attnserve_requests_in_flight"), Optional(0.0));
  EXPECT_THAT(e.Value("attnserve_flops_total", {{"backend", "cpu"}}),
              Optional(2.0 * kThreads * kPerThread));
}

TEST(MetricsTest, CreateRejectsBadOptions) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create({.http_threads = 0});
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(metrics.status().message(), ::testing::HasSubstr("was 0"));
}

}  // namespace
}  // namespace attnserve::metrics
