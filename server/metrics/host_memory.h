// Host memory of this process and the limit it runs under, read from /proc and the cgroup
// file system. Split from Metrics so the parsing is unit-tested on fixed text.
//
// Thread-safety: free functions without shared state; safe from any thread.
#ifndef ATTNSERVE_SERVER_METRICS_HOST_MEMORY_H_
#define ATTNSERVE_SERVER_METRICS_HOST_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace attnserve::metrics {

// Resident set size in bytes from the text of /proc/self/statm ("size resident shared ...",
// in pages). nullopt when the text does not parse.
std::optional<int64_t> ParseStatmResidentBytes(std::string_view statm, int64_t page_bytes);

// "MemTotal:  16318480 kB" line of /proc/meminfo, in bytes; nullopt when absent.
std::optional<int64_t> ParseMeminfoTotalBytes(std::string_view meminfo);

// The content of a cgroup v2 memory.max or v1 memory.limit_in_bytes file, in bytes; nullopt
// for "max" (no limit) or text that does not parse.
std::optional<int64_t> ParseCgroupLimitBytes(std::string_view text);

// This process's resident set size in bytes (/proc/self/statm); 0 when unreadable.
int64_t ReadResidentBytes();

// The memory this process may use before the kernel's OOM killer acts: the tightest of its
// cgroup limit (v2, then v1) and the host's MemTotal; 0 when nothing is readable. Why a
// cgroup limit first: in a container MemTotal is the node's memory, and alerting against it
// would fire only after the container was already killed.
int64_t ReadMemoryLimitBytes();

}  // namespace attnserve::metrics

#endif  // ATTNSERVE_SERVER_METRICS_HOST_MEMORY_H_
