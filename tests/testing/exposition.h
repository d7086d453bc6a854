// Reading one sample out of a Prometheus text exposition, for tests of what the server counts.
#ifndef ATTNSERVE_TESTS_TESTING_EXPOSITION_H_
#define ATTNSERVE_TESTS_TESTING_EXPOSITION_H_

#include <sstream>
#include <string>
#include <vector>

namespace attnserve::testing {

// The value of the first sample of `family` whose label text contains every one of `labels`
// (e.g. {"rpc=\"Attend\"", "code=\"OK\""}), or -1 when there is none.
inline double MetricSample(const std::string& text, const std::string& family,
                           const std::vector<std::string>& labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(family + "{", 0) != 0 && line.rfind(family + " ", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_EXPOSITION_H_
