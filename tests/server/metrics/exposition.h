// Test helpers for the metrics tests: a parser of the Prometheus text exposition format (so
// tests assert on values, not on substrings) and a minimal HTTP/1.0 GET over a TCP socket
// (so the endpoint test needs neither curl nor an HTTP library).
#ifndef ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_
#define ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnserve::metrics::testing {

using LabelSet = std::map<std::string, std::string>;

struct Sample {
  std::string name;  // as written, e.g. "attnserve_request_duration_seconds_bucket"
  LabelSet labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family name -> "counter", "gauge", ...
  std::map<std::string, std::string> helps;  // family name -> help text

  // The value of the sample with exactly these labels; nullopt when there is none.
  std::optional<double> Value(std::string_view name, const LabelSet& labels = {}) const;
  // The cumulative count of histogram `family` with `labels` at bound `le` (compared as a
  // number, so "0.0001" and "1e-04" are the same bound); +Inf for the total.
  std::optional<double> Bucket(std::string_view family, LabelSet labels, double le) const;
  // Every sample called `name`.
  std::vector<const Sample*> All(std::string_view name) const;
};

// Parses `text`; on malformed input returns nullopt and describes the line in *error.
std::optional<Exposition> ParseExposition(std::string_view text, std::string* error);

struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;
};
// GET http://127.0.0.1:port/path with HTTP/1.0 (no chunking, the server closes when done).
// nullopt and *error set on a socket error or a malformed status line.
std::optional<HttpResponse> HttpGet(int port, std::string_view path, std::string* error);

// Runs `command` through /bin/sh with `input` written to a temporary file on its stdin;
// returns its exit status and sets *output to its stdout and stderr.
int RunWithInput(const std::string& command, std::string_view input, std::string* output);

}  // namespace attnserve::metrics::testing

#endif  // ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_
