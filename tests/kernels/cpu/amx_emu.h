// A host emulation of the AMX tile instructions that the bfloat16 kernel uses, so that its AMX
// path (kernels/cpu/attention_bf16.cc: ConfigureTiles, GemmAmx, RunAmx) runs and is checked on
// machines without AMX. Tests only: the production build never defines the macro below.
//
// How it is used. tests/kernels/cpu/CMakeLists.txt compiles attention_bf16.cc a second time with
// ATTNSERVE_AMX_EMULATION defined (and without -mamx-*); that file then includes this header
// after <immintrin.h>, and the macros at the end replace the six tile intrinsics by calls to the
// functions below, and its kernel table is exported as kAmxEmulatedAttentionKernel (not as
// kAmxAttentionKernel, so the two objects link into one binary). Everything else in the kernel
// (packing, AVX512_BF16 softmax) runs as compiled, so the emulated kernel needs AVX512_BF16.
//
// The machine emulated. Per thread (the tile state is per thread on real hardware too): 8 tile
// registers of 16 rows x 64 bytes and the palette-1 configuration of LDTILECFG (rows and colsb per
// tile). Loads, stores and products honour the configured shapes (a load fills `rows` rows of
// `colsb` bytes and zeroes the rest of the register, a store writes exactly `rows` x `colsb`
// bytes; the bytes touched are plain reads and writes, which AddressSanitizer checks). Misuse that
// faults on real hardware (#GP / #UD) aborts the process with a message naming the instruction,
// the tiles and their shapes: a tile instruction before LDTILECFG or after TILERELEASE, a bad
// configuration (palette other than 0 and 1, non-zero reserved bytes, rows > 16, colsb > 64, a
// tile with only one of rows and colsb zero, tiles 8-15 configured; also a start_row other than
// 0, which is not emulated), a tile index > 7 or an unconfigured tile, and TDPBF16PS operands
// that are not distinct or whose shapes do not chain (colsb not a multiple of 4,
// A.colsb != 4 * B.rows, C.colsb != B.colsb, C.rows != A.rows).
//
// TDPBF16PS arithmetic, exactly the pseudo-code of Intel's SDM (vol. 2, "TDPBF16PS"): for each
// row m of C, two float32 accumulators per output column n start at zero, the even one summing
// A[m].bf16[2k] * B[k].bf16[2n] and the odd one A[m].bf16[2k+1] * B[k].bf16[2n+1] over k, each
// step one float32 FMA (one rounding, to nearest even); then C[m][n] = C[m][n] + (even + odd),
// two float32 adds. Input denormals (the bfloat16 operands and C) are treated as zero and every
// result denormal is flushed to zero (DAZ = FTZ = 1), whatever MXCSR says. (The intrinsics
// guide's shorter description, one running sum in k order, rounds differently; amx_emu_test pins
// the SDM's order, DAZ, FTZ, the shapes and the aborts.) What this cannot tell:
// whether the silicon rounds exactly as the SDM's pseudo-code (the emulated kernel's results are
// checked against float64 within the kernel's error bound, not bit for bit against real AMX),
// NaN payloads, speed, and the operating system's permission (arch_prctl ARCH_REQ_XCOMP_PERM,
// cpu_features.cc), which only a machine with AMX exercises.
#ifndef ATTNSERVE_TESTS_KERNELS_CPU_AMX_EMU_H_
#define ATTNSERVE_TESTS_KERNELS_CPU_AMX_EMU_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_kernel.h"

namespace attnserve::kernels::testing::amx_emu {

// The emulated instructions, on the calling thread's tile state (see above). Each aborts with a
// message where real hardware would fault.
void LoadConfig(const void* config);                           // LDTILECFG
void Release();                                                // TILERELEASE
void Zero(int tile);                                           // TILEZERO
void Load(int tile, const void* base, std::ptrdiff_t stride);  // TILELOADD (stride in bytes)
void Store(int tile, void* base, std::ptrdiff_t stride);       // TILESTORED (stride in bytes)
void DpBf16Ps(int c, int a, int b);                            // TDPBF16PS tmm_c, tmm_a, tmm_b

// TDPBF16PS instructions executed so far by all threads (tests check that the tile path ran).
uint64_t DpBf16PsCount();

}  // namespace attnserve::kernels::testing::amx_emu

namespace attnserve::kernels::cpu {
// The AMX kernel of attention_bf16.cc with its tile instructions emulated (isa kAmx, name
// "amx_bf16_emulated"). Runs where CpuSupports(Bf16Isa::kAvx512Bf16).
extern const Bf16AttentionKernel kAmxEmulatedAttentionKernel;
}  // namespace attnserve::kernels::cpu

#if defined(ATTNSERVE_AMX_EMULATION)
// In the kernel's translation unit, after <immintrin.h>: the intrinsics it uses become calls to
// the emulation; those it does not use fail to compile, so none can slip through to the silicon.
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#undef _tile_storeconfig
#undef _tile_stream_loadd
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
#undef _tile_dpfp16ps
#define _tile_loadconfig(config) ::attnserve::kernels::testing::amx_emu::LoadConfig(config)
#define _tile_release() ::attnserve::kernels::testing::amx_emu::Release()
#define _tile_zero(tile) ::attnserve::kernels::testing::amx_emu::Zero(tile)
#define _tile_loadd(tile, base, stride) \
  ::attnserve::kernels::testing::amx_emu::Load(tile, base, stride)
#define _tile_stored(tile, base, stride) \
  ::attnserve::kernels::testing::amx_emu::Store(tile, base, stride)
#define _tile_dpbf16ps(c, a, b) ::attnserve::kernels::testing::amx_emu::DpBf16Ps(c, a, b)
#define _tile_storeconfig(...) amx_emu_does_not_emulate_tile_storeconfig
#define _tile_stream_loadd(...) amx_emu_does_not_emulate_tile_stream_loadd
#define _tile_dpbssd(...) amx_emu_does_not_emulate_tile_dpbssd
#define _tile_dpbsud(...) amx_emu_does_not_emulate_tile_dpbsud
#define _tile_dpbusd(...) amx_emu_does_not_emulate_tile_dpbusd
#define _tile_dpbuud(...) amx_emu_does_not_emulate_tile_dpbuud
#define _tile_dpfp16ps(...) amx_emu_does_not_emulate_tile_dpfp16ps
#endif  // ATTNSERVE_AMX_EMULATION

#endif  // ATTNSERVE_TESTS_KERNELS_CPU_AMX_EMU_H_
