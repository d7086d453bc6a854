// A host emulation of the CUDA execution model, enough to run the real kernel headers of
// kernels/cuda/ as plain C++ (README.md in this folder: how, and what it cannot catch).
//
// The kernel headers are compiled with tests/cuda_emu/shim first on the include path: its
// cuda_fp16.h / cuda_bf16.h give the 16-bit types, and its kernels/cuda/device_utils.h replaces
// the inline-PTX wrappers (cp.async, ldmatrix, mma, shuffles) by emulations written from the
// PTX ISA's fragment tables. This header gives the CUDA keywords and built-ins the kernel bodies
// use (__global__, threadIdx, __syncthreads, __shfl_xor_sync, ...), and the launch.
//
// Execution model: a launch runs its blocks one at a time; a block runs one fiber per CUDA
// thread, all on the launching OS thread. A fiber runs until it waits at a barrier or a warp
// collective (or returns); the scheduler then switches to another runnable one, in a
// pseudo-random order that changes every round. __syncthreads is a barrier over the block's live
// threads; warp collectives meet at a per-warp barrier and exchange values through a
// double-buffered slot array, and the last lane to arrive checks that all 32 lanes are live and
// issued the same operation. Under ThreadSanitizer each fiber is a thread of its own and the
// barriers are its only happens-before edges, exactly those CUDA promises. Misuse (a collective
// with exited or diverging lanes, an out-of-range or misaligned shared address, a deadlock)
// prints a message and aborts the process.
#ifndef ATTNSERVE_TESTS_CUDA_EMU_EMU_H_
#define ATTNSERVE_TESTS_CUDA_EMU_EMU_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

// CUDA keywords.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
// Per emulated thread: the scheduler sets threadIdx whenever it switches to a fiber.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

// Where the bytes of cp.async land: at issue, or only when the issuing thread waits for their
// group (exposes a missing wait: readers then see the NaN fill, and TSan a race).
enum class CpAsyncMode { kLandAtIssue, kLandAtWait };
void SetCpAsyncMode(CpAsyncMode mode);
CpAsyncMode GetCpAsyncMode();

// Runs body once per thread of every block of `grid`, blocks one after another, with
// `smem_bytes` of dynamic shared memory (filled with 0xff bytes, a NaN in every float type, at
// each block's start; the bytes past it poisoned under ASan and rejected by the emulated ops).
void Launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

// Runs only the blocks for which `keep(blockIdx)` is true in later launches (nullptr: all), so
// that a test can check a few blocks of a very large grid (the other outputs stay unwritten).
void SetBlockFilter(std::function<bool(const uint3&)> keep);

// Aborts with a message (emulation misuse or a kernel bug the emulator detected).
[[noreturn]] void Fail(const std::string& message);

// The dynamic shared memory of the running block.
unsigned char* SharedBase();
size_t SharedSize();
// Checks that [addr, addr + bytes) lies in the launched shared memory and is aligned to `align`.
unsigned char* SharedAt(uint32_t addr, int bytes, int align, const char* what);

// Warp collectives. Each lane passes its own operand words; after all 32 lanes arrived (with
// the same op), `all` holds every lane's words, or, with `combine`, what the last lane to arrive
// made of them: combine(all) runs once per collective, before any lane returns, and may
// overwrite every lane's slot with that lane's result (an mma computes the warp's product once
// instead of once per lane).
inline constexpr int kSlotWords = 10;
struct Slot {
  int op = 0;
  uint32_t w[kSlotWords] = {};
};
// Returns a pointer to the 32 slots of this collective (valid until this lane's next call).
const Slot* WarpExchange(const Slot& mine, void (*combine)(Slot* all) = nullptr);
int LaneId();

// Operation ids of the collectives (the slot's op).
enum Op : int {
  kOpShflXor = 1,
  kOpShfl,
  kOpLdMatrixX4,
  kOpLdMatrixX4Trans,
  kOpMmaF16,
  kOpMmaBF16,
};

// cp.async: queue a copy of `bytes` from src (global) to dst (shared) by this thread.
void CpAsync(void* dst, const void* src, int bytes);
void CpAsyncCommit();
void CpAsyncWait(int n);  // all but the newest n committed groups have landed

void SyncThreads();
void SyncWarp(unsigned mask);

}  // namespace emu

inline void __syncthreads() { emu::SyncThreads(); }
// Single roundings without contraction into a fused multiply-add (host code compiled for the
// baseline x86-64 has no FMA instruction to contract into).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::SyncWarp(mask); }

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  if (mask != 0xffffffffu) emu::Fail("__shfl_xor_sync: only the full mask is emulated");
  emu::Slot s;
  s.op = emu::kOpShflXor;
  __builtin_memcpy(&s.w[0], &v, 4);
  const emu::Slot* all = emu::WarpExchange(s);
  float r;
  __builtin_memcpy(&r, &all[(emu::LaneId() ^ lane_mask) & 31].w[0], 4);
  return r;
}
inline float __shfl_sync(unsigned mask, float v, int src_lane) {
  if (mask != 0xffffffffu) emu::Fail("__shfl_sync: only the full mask is emulated");
  emu::Slot s;
  s.op = emu::kOpShfl;
  __builtin_memcpy(&s.w[0], &v, 4);
  const emu::Slot* all = emu::WarpExchange(s);
  float r;
  __builtin_memcpy(&r, &all[src_lane & 31].w[0], 4);
  return r;
}

// A generic pointer into shared memory -> its shared-window address (offset from the base).
inline size_t __cvta_generic_to_shared(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < emu::SharedBase() || c > emu::SharedBase() + emu::SharedSize()) {
    emu::Fail("__cvta_generic_to_shared: pointer outside the launched shared memory");
  }
  return static_cast<size_t>(c - emu::SharedBase());
}

#endif  // ATTNSERVE_TESTS_CUDA_EMU_EMU_H_
