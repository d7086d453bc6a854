// Where this process's cgroups are, from the text of /proc/self/cgroup: the memory limit
// (server/metrics/host_memory.h) and the CPU limit (kernels/cpu/available_cores.h) are read from
// files under those paths. Split out so both parse the file one way, tested on fixed text.
//
// Thread-safety: pure functions.
#ifndef ATTNSERVE_BASE_CGROUP_H_
#define ATTNSERVE_BASE_CGROUP_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace attnserve {

// The path of the process's cgroup v2 group ("0::/a/b" gives "/a/b"); nullopt on a cgroup
// v1-only host.
inline std::optional<std::string> CgroupV2Path(absl::string_view proc_self_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) return std::string(line);
  }
  return std::nullopt;
}

// The directory of the process's cgroup v2 group, with its trailing '/' ("0::/a/b" gives
// "/sys/fs/cgroup/a/b/", where its cpu.max and memory.max are); nullopt on a cgroup v1-only
// host.
inline std::optional<std::string> CgroupV2Dir(absl::string_view proc_self_cgroup) {
  std::optional<std::string> path = CgroupV2Path(proc_self_cgroup);
  if (!path) return std::nullopt;
  std::string dir = "/sys/fs/cgroup" + *path;
  if (dir.back() != '/') dir += '/';
  return dir;
}

// The path of the process's group in the cgroup v1 hierarchy that has `controller`
// ("4:cpu,cpuacct:/a/b" gives "/a/b" for "cpu", not for "cpuset"; the path may hold ':');
// nullopt when no hierarchy has it.
inline std::optional<std::string> CgroupV1Path(absl::string_view proc_self_cgroup,
                                               absl::string_view controller) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    for (absl::string_view c : absl::StrSplit(fields[1], ',')) {
      if (c == controller) return std::string(fields[2]);
    }
  }
  return std::nullopt;
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_CGROUP_H_
