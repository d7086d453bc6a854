#include "tests/server/metrics/exposition.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

namespace attnserve::metrics::testing {
namespace {

bool ParseLabels(std::string_view& rest, LabelSet* labels) {
  // rest starts just after '{'.
  while (true) {
    if (rest.empty()) return false;
    if (rest.front() == '}') {
      rest.remove_prefix(1);
      return true;
    }
    const size_t eq = rest.find('=');
    if (eq == std::string_view::npos || eq + 1 >= rest.size() || rest[eq + 1] != '"') {
      return false;
    }
    std::string key(rest.substr(0, eq));
    rest.remove_prefix(eq + 2);
    std::string value;
    while (true) {
      if (rest.empty()) return false;
      const char c = rest.front();
      rest.remove_prefix(1);
      if (c == '"') break;
      if (c == '\\') {
        if (rest.empty()) return false;
        const char e = rest.front();
        rest.remove_prefix(1);
        value += e == 'n' ? '\n' : e;
      } else {
        value += c;
      }
    }
    if (!labels->emplace(std::move(key), std::move(value)).second) return false;
    if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
  }
}

}  // namespace

std::optional<Exposition> ParseExposition(std::string_view text, std::string* error) {
  Exposition out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    auto fail = [&](const char* why) {
      *error = "line " + std::to_string(line_no) + ": " + why + ": " + std::string(line);
      return std::nullopt;
    };
    if (line.empty()) continue;
    if (line.front() == '#') {
      // "# TYPE name type" and "# HELP name text"; other comments are allowed and ignored.
      for (auto [prefix, map] : {std::pair{std::string_view("# TYPE "), &out.types},
                                 std::pair{std::string_view("# HELP "), &out.helps}}) {
        if (line.substr(0, prefix.size()) != prefix) continue;
        std::string_view rest = line.substr(prefix.size());
        const size_t sp = rest.find(' ');
        if (sp == std::string_view::npos) return fail("malformed comment");
        (*map)[std::string(rest.substr(0, sp))] = std::string(rest.substr(sp + 1));
      }
      continue;
    }
    Sample sample;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos || name_end == 0) return fail("no metric name");
    sample.name = std::string(line.substr(0, name_end));
    std::string_view rest = line.substr(name_end);
    if (rest.front() == '{') {
      rest.remove_prefix(1);
      if (!ParseLabels(rest, &sample.labels)) return fail("malformed labels");
    }
    if (rest.empty() || rest.front() != ' ') return fail("no value");
    rest.remove_prefix(1);
    const std::string value(rest.substr(0, rest.find(' ')));  // a timestamp may follow
    char* end = nullptr;
    sample.value = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) return fail("malformed value");
    out.samples.push_back(std::move(sample));
  }
  return out;
}

std::optional<double> Exposition::Value(std::string_view name, const LabelSet& labels) const {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

std::optional<double> Exposition::Bucket(std::string_view family, LabelSet labels,
                                         double le) const {
  const std::string name = std::string(family) + "_bucket";
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    LabelSet rest = s.labels;
    auto it = rest.find("le");
    if (it == rest.end()) continue;
    const double bound = std::strtod(it->second.c_str(), nullptr);
    rest.erase(it);
    const bool same =
        std::isinf(le) ? std::isinf(bound) : std::abs(bound - le) <= 1e-9 * std::abs(le);
    if (rest == labels && same) return s.value;
  }
  return std::nullopt;
}

std::vector<const Sample*> Exposition::All(std::string_view name) const {
  std::vector<const Sample*> out;
  for (const Sample& s : samples) {
    if (s.name == name) out.push_back(&s);
  }
  return out;
}

std::optional<HttpResponse> HttpGet(int port, std::string_view path, std::string* error) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = std::string("connect: ") + std::strerror(errno);
    close(fd);
    return std::nullopt;
  }
  const std::string request = "GET " + std::string(path) + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      *error = std::string("send: ") + std::strerror(errno);
      close(fd);
      return std::nullopt;
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buffer[16384];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) {
      *error = std::string("recv: ") + std::strerror(errno);
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    raw.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = raw.find("\r\n\r\n");
  if (raw.substr(0, 9) != "HTTP/1.1 " && raw.substr(0, 9) != "HTTP/1.0 ") {
    *error = "no HTTP status line in: " + raw.substr(0, 200);
    return std::nullopt;
  }
  if (header_end == std::string::npos) {
    *error = "no end of headers in: " + raw.substr(0, 200);
    return std::nullopt;
  }
  HttpResponse response;
  response.status = std::atoi(raw.c_str() + 9);
  response.headers = raw.substr(0, header_end);
  response.body = raw.substr(header_end + 4);
  return response;
}

int RunWithInput(const std::string& command, std::string_view input, std::string* output) {
  char path[] = "/tmp/attnserve_metrics_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return -1;
  close(fd);
  std::ofstream(path, std::ios::binary) << input;
  const std::string full = command + " < " + path + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) {
    unlink(path);
    return -1;
  }
  output->clear();
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  unlink(path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace attnserve::metrics::testing
