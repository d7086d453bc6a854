// `promtool check metrics` (Debian package `prometheus`) on the exposition text, both as
// serialized in-process and as scraped from a live endpoint. Skips when promtool is missing.
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "tests/server/metrics/exposition.h"

namespace attnserve::metrics {
namespace {

// Found by CMake (find_program); empty or "...-NOTFOUND" when promtool was not installed.
std::string Promtool() {
  const std::string path = ATTNSERVE_PROMTOOL;
  return access(path.c_str(), X_OK) == 0 ? path : std::string();
}

// Every family with at least one series, so that promtool lints each of them.
void RecordOneOfEverything(Metrics& metrics) {
  RequestScope(&metrics, Rpc::kAttend).Finish(0);
  RequestScope(&metrics, Rpc::kMultiHeadAttention).Finish(3);
  metrics.RecordDropped(DropReason::kDeadline);
  metrics.SetQueued(2, 4096);
  metrics.ObserveQueueTime(absl::Microseconds(300));
  metrics.ObserveBatch(4, 512);
  metrics.ForBackend("cpu").ObserveCompute(absl::Milliseconds(2), 1e9);
  metrics.ForDevice("cuda:0").SetMemory(1 << 30, 8LL << 30, 1 << 29);
  metrics.SetModuleBytes(1 << 20);
}

void ExpectPromtoolAccepts(std::string_view text) {
  std::string output;
  const int rc = testing::RunWithInput(Promtool() + " check metrics", text, &output);
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output << "\non:\n" << text;
  EXPECT_EQ(output, "") << "promtool printed lint warnings";
}

TEST(PromtoolTest, CheckMetricsAcceptsTheExposition) {
  if (Promtool().empty()) {
    GTEST_SKIP() << "promtool not found (Debian package 'prometheus'); install it to run this";
  }
  auto metrics = Metrics::Create({.version = "0.1.0", .backend = "cpu"});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  RecordOneOfEverything(**metrics);
  ExpectPromtoolAccepts((*metrics)->ExpositionText());
}

TEST(PromtoolTest, CheckMetricsAcceptsALiveScrape) {
  if (Promtool().empty()) {
    GTEST_SKIP() << "promtool not found (Debian package 'prometheus'); install it to run this";
  }
  auto metrics = Metrics::Create(
      {.listen_address = "127.0.0.1:0", .version = "0.1.0", .backend = "cuda", .cuda = true});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  RecordOneOfEverything(**metrics);
  std::string error;
  auto response = testing::HttpGet((*metrics)->listening_port(), "/metrics", &error);
  ASSERT_TRUE(response.has_value()) << error;
  ASSERT_EQ(response->status, 200);
  ExpectPromtoolAccepts(response->body);
}

}  // namespace
}  // namespace attnserve::metrics
