#include "kernels/cpu/available_cores.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/cgroup.h"
#include "base/file.h"

namespace attnserve::kernels::cpu {
namespace {

// quota / period in cores, from their decimal text; nullopt unless both parse and are positive.
std::optional<double> Cores(absl::string_view quota, absl::string_view period) {
  int64_t q = 0, p = 0;
  if (!absl::SimpleAtoi(quota, &q) || !absl::SimpleAtoi(period, &p) || q <= 0 || p <= 0) {
    return std::nullopt;
  }
  return static_cast<double>(q) / static_cast<double>(p);
}

std::optional<double> Tightest(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The group's cgroup v1 CPU limit, from the files in `dir`.
std::optional<double> V1Limit(const std::string& dir) {
  return ParseCgroupV1CpuQuota(ReadFileOrEmpty(dir + "/cpu.cfs_quota_us"),
                               ReadFileOrEmpty(dir + "/cpu.cfs_period_us"));
}

}  // namespace

std::optional<double> ParseCgroupV2CpuMax(absl::string_view cpu_max) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ');
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  return Cores(fields[0], fields[1]);
}

std::optional<double> ParseCgroupV1CpuQuota(absl::string_view quota_us,
                                            absl::string_view period_us) {
  return Cores(quota_us, period_us);
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

  const std::string cgroups = ReadFileOrEmpty("/proc/self/cgroup");
  std::optional<double> limit;
  if (std::optional<std::string> dir = CgroupV2Dir(cgroups)) {
    limit = ParseCgroupV2CpuMax(ReadFileOrEmpty(*dir + "cpu.max"));
  }
  // cgroup v1: the group this process is in, and the mount's root, which is the group itself
  // inside a container (whose /proc/self/cgroup names the host's path).
  const std::string mount = "/sys/fs/cgroup/cpu";
  if (std::optional<std::string> path = CgroupV1Path(cgroups, "cpu"); path && *path != "/") {
    limit = Tightest(limit, V1Limit(mount + *path));
  }
  limit = Tightest(limit, V1Limit(mount));
  return CoresWithin(affinity, limit);
}

}  // namespace attnserve::kernels::cpu
