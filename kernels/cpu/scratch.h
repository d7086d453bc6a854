// Per-thread scratch memory of the CPU backend's calls and tasks, kept between calls and given
// back when the server is idle.
//
// A buffer allocated and freed on every call is faulted in on every call: the allocator returns
// a large block's pages soon after it is freed (measured: about 15% of the bf16 attention at
// (4, 1024, 512, 8); 2,300 faults per MultiHeadAttention of 48 x 256 tokens on the demo module).
// So each thread keeps one buffer per use for its next call, up to kKeepBytes; larger ones are
// returned at once. ReleaseIdleScratch() frees the kept buffers no call holds, so that an idle
// server gives their memory back (server/server_host.cc calls it, through
// kernels::Backend::ReleaseIdleMemory, once no call has arrived for a while).
//
// Thread-safe: a thread's buffers are its own; ReleaseIdleScratch may run on any thread at any
// time and takes only the buffers no ScratchBuffer holds.
#ifndef ATTNSERVE_KERNELS_CPU_SCRATCH_H_
#define ATTNSERVE_KERNELS_CPU_SCRATCH_H_

#include <cstdint>

namespace attnserve::kernels::cpu {

// What a buffer is for: one kept buffer per thread and use, and a use is held by one
// ScratchBuffer at a time on its thread (uses nest: a multi-head call holds kMultiHead while its
// attention holds kPackedKv and its tasks kTask).
enum class ScratchUse { kTask = 0, kPackedKv = 1, kMultiHead = 2 };
inline constexpr int kNumScratchUses = 3;

// Buffers above this are not kept: allocated and freed with the call.
inline constexpr int64_t kKeepBytes = int64_t{64} << 20;

// A 64-byte aligned buffer of at least `bytes` bytes (contents unspecified), the calling thread's
// `use` buffer while the object lives. Holding a use twice on one thread aborts (a bug).
class ScratchBuffer {
 public:
  ScratchBuffer(ScratchUse use, int64_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  char* data() const { return data_; }
  float* floats() const { return reinterpret_cast<float*>(data_); }

 private:
  int use_;
  bool kept_;
  char* data_;
};

// Frees every kept buffer no ScratchBuffer holds; returns the bytes freed.
int64_t ReleaseIdleScratch();
// The bytes kept over all threads now and held by no ScratchBuffer.
int64_t KeptScratchBytes();

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_SCRATCH_H_
