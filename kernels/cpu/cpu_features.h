// What the CPU this process runs on supports, read once at run time (cpuid through the
// compiler's builtins), so one binary runs everywhere on x86-64 and uses the widest kernel the
// machine has.
#ifndef ATTNSERVE_KERNELS_CPU_CPU_FEATURES_H_
#define ATTNSERVE_KERNELS_CPU_CPU_FEATURES_H_

#include <string>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/paged_attention_kernel.h"

namespace attnserve::kernels::cpu {

// True when `isa`'s kernel can run here (kGeneric always; kAuto is always true).
bool CpuSupports(Isa isa);

// The widest instruction set with a kernel that this CPU supports.
Isa BestIsa();

// The kernel table of `isa`. REQUIRES: isa != kAuto and CpuSupports(isa).
const AttentionKernel& KernelFor(Isa isa);
// The paged attention kernel table of `isa`; with `bf16_dot`, the one whose BFLOAT16 scores use
// AVX512_BF16 when there is one for isa (kAvx512). REQUIRES: isa != kAuto and CpuSupports(isa),
// and CpuSupports(Bf16Isa::kAvx512Bf16) when bf16_dot.
const PagedAttentionKernel& PagedKernelFor(Isa isa, bool bf16_dot);

// True when the bfloat16 path `isa` can run here (kNone and kAuto always). For kAmx this also
// asks Linux for permission to use the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM), once per
// process; a refusal makes kAmx unsupported.
bool CpuSupports(Bf16Isa isa);
// The best bfloat16 path this CPU supports (kAmx, kAvx512Bf16 or kNone).
Bf16Isa BestBf16Isa();
// The kernel of `isa`. REQUIRES: isa is kAmx or kAvx512Bf16 and CpuSupports(isa).
const Bf16AttentionKernel& Bf16KernelFor(Bf16Isa isa);
// "amx_bf16", "avx512_bf16", "none" or "auto".
const char* Bf16IsaName(Bf16Isa isa);

// "avx512", "avx2", "generic" or "auto".
const char* IsaName(Isa isa);

// The CPU's model name from /proc/cpuinfo, or "unknown cpu".
std::string CpuModelName();

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_CPU_FEATURES_H_
