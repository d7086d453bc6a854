// How many cores this process may use: the CPUs of its affinity mask, fewer when its cgroup
// limits its CPU time (a Kubernetes CPU limit, a `docker run --cpus`). The CPU backend starts one
// thread per such core by default.
//
// Why not std::thread::hardware_concurrency(): it counts the node's CPUs. A container limited
// to one core on a 64-core node would start 64 compute threads; together they spend the
// container's quota for a 100 ms period in about 1.5 ms, and then every thread of the server,
// gRPC's included, waits out the rest of the period (CFS throttling).
//
// Thread-safety: free functions without shared state; safe from any thread.
#ifndef ATTNSERVE_KERNELS_CPU_AVAILABLE_CORES_H_
#define ATTNSERVE_KERNELS_CPU_AVAILABLE_CORES_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace attnserve::kernels::cpu {

// The CPU limit in cores of a cgroup v2 `cpu.max` ("50000 100000": 0.5). nullopt for "max ..."
// (no limit) or text that does not parse.
std::optional<double> ParseCgroupV2CpuMax(absl::string_view cpu_max);

// The CPU limit in cores of cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` ("10000",
// "100000": 0.1). nullopt for a quota of -1 (no limit) or text that does not parse.
std::optional<double> ParseCgroupV1CpuQuota(absl::string_view quota_us,
                                            absl::string_view period_us);

// Cores from the affinity mask's CPU count and a cgroup limit in cores: the limit rounded up
// (0.1 core is still one thread's worth), at most `affinity_cpus`, at least 1.
int CoresWithin(int affinity_cpus, std::optional<double> limit_cores);

// This process's cores: its affinity mask (sched_getaffinity) within the tightest CPU limit of
// its cgroup, v2 (`cpu.max` of its group) or v1 (`cpu.cfs_quota_us` of its `cpu` group, or of
// the mount's root as a container sees its own group; base/cgroup.h finds them). At least 1.
int AvailableCores();

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_AVAILABLE_CORES_H_
