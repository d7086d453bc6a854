// Which memory allocator the process runs on, for the log and the metrics.
//
// The servers (attnserve, attnserve-bench-echo) link jemalloc with the settings of
// base/malloc_conf.cc; the sanitizer builds and every other binary run on the C library's
// malloc. Why jemalloc, and why those settings: docs/operations.md ("Memory").
#ifndef ATTNSERVE_BASE_ALLOCATOR_H_
#define ATTNSERVE_BASE_ALLOCATOR_H_

#include <string>

namespace attnserve {

// "jemalloc 5.3.0-0-g54eaed1d... (narenas 1, dirty_decay_ms 10000, background_thread true, ...)"
// when malloc is jemalloc's, else "glibc malloc" (or the sanitizer's: "malloc of the C library
// or a sanitizer"). Reads jemalloc's settings through mallctl, found at run time.
std::string AllocatorDescription();

// Hands the allocator's free pages back to the system now (jemalloc: every arena purged); false
// where malloc is not jemalloc's. For an idle server (server/core/idle_release.h): jemalloc's own
// decay returns them over about 10 s anyway.
bool AllocatorReleaseFreeMemory();

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_ALLOCATOR_H_
