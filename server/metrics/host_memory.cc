#include "server/metrics/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <string>

#include "base/cgroup.h"
#include "base/file.h"

namespace attnserve::metrics {
namespace {

std::string_view TrimSpace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

std::optional<int64_t> ParseStatmResidentBytes(std::string_view statm, int64_t page_bytes) {
  statm = TrimSpace(statm);
  const size_t first_space = statm.find(' ');
  if (first_space == std::string_view::npos) return std::nullopt;
  std::string_view rest = statm.substr(first_space + 1);
  std::optional<int64_t> pages = ParseInt(rest.substr(0, rest.find(' ')));
  if (!pages) return std::nullopt;
  return *pages * page_bytes;
}

std::optional<int64_t> ParseMeminfoTotalBytes(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemTotal:";
  size_t at = meminfo.find(kKey);
  if (at == std::string_view::npos || (at != 0 && meminfo[at - 1] != '\n')) return std::nullopt;
  std::string_view line = meminfo.substr(at + kKey.size());
  line = line.substr(0, line.find('\n'));
  line = TrimSpace(line);
  if (line.size() < 3 || line.substr(line.size() - 3) != " kB") return std::nullopt;
  std::optional<int64_t> kib = ParseInt(TrimSpace(line.substr(0, line.size() - 3)));
  if (!kib) return std::nullopt;
  return *kib * 1024;
}

std::optional<int64_t> ParseCgroupLimitBytes(std::string_view text) {
  text = TrimSpace(text);
  if (text == "max") return std::nullopt;
  return ParseInt(text);
}

int64_t ReadResidentBytes() {
  return ParseStatmResidentBytes(ReadFileOrEmpty("/proc/self/statm"), sysconf(_SC_PAGESIZE))
      .value_or(0);
}

int64_t ReadMemoryLimitBytes() {
  std::optional<int64_t> limit = ParseMeminfoTotalBytes(ReadFileOrEmpty("/proc/meminfo"));
  auto tighten = [&limit](std::optional<int64_t> candidate) {
    // v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages); min() discards it.
    if (candidate && *candidate > 0) limit = limit ? std::min(*limit, *candidate) : *candidate;
  };
  const std::string cgroups = ReadFileOrEmpty("/proc/self/cgroup");
  if (std::optional<std::string> dir = CgroupV2Dir(cgroups)) {
    tighten(ParseCgroupLimitBytes(ReadFileOrEmpty(*dir + "memory.max")));
  }
  // cgroup v1, as mounted inside a container (the group is the root of the mount).
  tighten(ParseCgroupLimitBytes(ReadFileOrEmpty("/sys/fs/cgroup/memory/memory.limit_in_bytes")));
  return limit.value_or(0);
}

}  // namespace attnserve::metrics
