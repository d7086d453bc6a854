#include "kernels/cpu/available_cores.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "base/file.h"

namespace attnserve::kernels::cpu {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

// `text` cut at each `separator`, empty pieces kept.
std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> pieces;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string_view::npos;
       at = text.find(separator, start)) {
    pieces.push_back(text.substr(start, at - start));
    start = at + 1;
  }
  pieces.push_back(text.substr(start));
  return pieces;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  s = Trim(s);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

// quota / period in cores; nullopt unless both are positive.
std::optional<double> Cores(std::optional<int64_t> quota, std::optional<int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::string ReadOrEmpty(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  return text.ok() ? *std::move(text) : std::string();
}

std::optional<double> Tightest(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The group's cgroup v1 CPU limit, from the files in `dir`.
std::optional<double> V1Limit(const std::string& dir) {
  return ParseCgroupV1CpuQuota(ReadOrEmpty(dir + "/cpu.cfs_quota_us"),
                               ReadOrEmpty(dir + "/cpu.cfs_period_us"));
}

}  // namespace

std::optional<double> ParseCgroupV2CpuMax(std::string_view cpu_max) {
  const std::vector<std::string_view> fields = Split(Trim(cpu_max), ' ');
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  return Cores(ParseInt(fields[0]), ParseInt(fields[1]));
}

std::optional<double> ParseCgroupV1CpuQuota(std::string_view quota_us, std::string_view period_us) {
  return Cores(ParseInt(quota_us), ParseInt(period_us));
}

std::optional<std::string> ParseCgroupV1CpuPath(std::string_view proc_self_cgroup) {
  for (std::string_view line : Split(proc_self_cgroup, '\n')) {
    // hierarchy-id:controller,controller:path (the path may itself hold ':')
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    for (std::string_view controller : Split(line.substr(first + 1, second - first - 1), ',')) {
      if (controller == "cpu") return std::string(line.substr(second + 1));
    }
  }
  return std::nullopt;
}

int CoresWithin(int affinity_cpus, std::optional<double> limit_cores) {
  int cores = std::max(1, affinity_cpus);
  if (limit_cores && *limit_cores > 0) {
    cores = std::min(cores, static_cast<int>(std::ceil(std::min(*limit_cores, 1e6))));
  }
  return std::max(1, cores);
}

int AvailableCores() {
  int affinity = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = CPU_COUNT(&set);

  const std::string cgroups = ReadOrEmpty("/proc/self/cgroup");
  std::optional<double> limit;
  for (std::string_view line : Split(cgroups, '\n')) {
    if (line.substr(0, 3) == "0::") {  // cgroup v2: the group's own cpu.max
      std::string dir = "/sys/fs/cgroup" + std::string(line.substr(3));
      if (dir.back() != '/') dir += '/';
      limit = Tightest(limit, ParseCgroupV2CpuMax(ReadOrEmpty(dir + "cpu.max")));
    }
  }
  // cgroup v1: the group this process is in, and the mount's root, which is the group itself
  // inside a container (whose /proc/self/cgroup names the host's path).
  const std::string mount = "/sys/fs/cgroup/cpu";
  if (std::optional<std::string> path = ParseCgroupV1CpuPath(cgroups); path && *path != "/") {
    limit = Tightest(limit, V1Limit(mount + *path));
  }
  limit = Tightest(limit, V1Limit(mount));
  return CoresWithin(affinity, limit);
}

}  // namespace attnserve::kernels::cpu
