// Helper of prometheus_e2e_test.py: serves /metrics on 127.0.0.1 (a free port, printed as
// "port=N" on stdout) after recording a known set of requests, and exits at EOF on stdin.
//
// Usage: serve_for_prometheus REQUESTS
// Records REQUESTS Attend requests with server times spread evenly over [1 ms, 3 ms], so the
// test knows the count exactly and the range any quantile must fall in.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

#include "server/metrics/metrics.h"

int main(int argc, char** argv) {
  using attnserve::metrics::Metrics;
  if (argc != 2 || std::atoi(argv[1]) < 1) {
    std::cerr << "usage: serve_for_prometheus REQUESTS (a positive count)\n";
    return 2;
  }
  const int requests = std::atoi(argv[1]);
  auto metrics = Metrics::Create(
      {.listen_address = "127.0.0.1:0", .version = "e2e", .backend = "cpu", .cuda = false});
  if (!metrics.ok()) {
    std::cerr << metrics.status() << "\n";
    return 1;
  }
  for (int i = 0; i < requests; ++i) {
    (*metrics)->RequestStarted();
    const double ms = 1.0 + 2.0 * i / std::max(1, requests - 1);
    (*metrics)->RequestFinished(attnserve::metrics::Rpc::kAttend, 0,
                                absl::Microseconds(static_cast<int64_t>(ms * 1000)));
  }
  (*metrics)->SetModuleBytes(1 << 20);
  std::cout << "port=" << (*metrics)->listening_port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
