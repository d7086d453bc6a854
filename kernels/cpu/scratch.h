// Per-thread scratch memory of the CPU backend's tasks.
#ifndef ATTNSERVE_KERNELS_CPU_SCRATCH_H_
#define ATTNSERVE_KERNELS_CPU_SCRATCH_H_

#include <cstdint>

namespace attnserve::kernels::cpu {

// A 64-byte aligned buffer of at least `floats` floats belonging to the calling thread, grown on
// demand and kept for its next call (contents unspecified). One buffer per thread: a task holds
// it only while it runs, and the backend's tasks (attention, projections, paged attention) never
// nest on one thread.
float* ThreadScratch(int64_t floats);

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_SCRATCH_H_
