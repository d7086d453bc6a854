#include "kernels/cpu/cpu_features.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace attnserve::kernels::cpu {
namespace {

#if defined(ATTNSERVE_CPU_X86_KERNELS)
// CPUID leaf `leaf`, subleaf `sub`: {eax, ebx, ecx, edx}. For the features some compiler's
// __builtin_cpu_supports does not know (clang 14: f16c, avx512bf16; GCC 12: amx).
struct CpuidRegs {
  unsigned eax, ebx, ecx, edx;
};
CpuidRegs Cpuid(unsigned leaf, unsigned sub) {
  CpuidRegs r;
  __asm__("cpuid" : "=a"(r.eax), "=b"(r.ebx), "=c"(r.ecx), "=d"(r.edx) : "a"(leaf), "c"(sub));
  return r;
}
bool HasF16c() { return (Cpuid(1, 0).ecx >> 29 & 1) != 0; }  // leaf 1, ECX bit 29
#endif

}  // namespace

bool CpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kGeneric:
      return true;
#if defined(ATTNSERVE_CPU_X86_KERNELS)
    case Isa::kAvx2:
      // F16C widens FLOAT16 inputs; every CPU with AVX2 and FMA has it.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case Isa::kAvx512:
      // The kernel uses F (and DQ through the compiler's choices) plus FMA.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
#else
    case Isa::kAvx2:
    case Isa::kAvx512:
      return false;
#endif
  }
  return false;
}

Isa BestIsa() {
  if (CpuSupports(Isa::kAvx512)) return Isa::kAvx512;
  if (CpuSupports(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kGeneric;
}

const AttentionKernel& KernelFor(Isa isa) {
#if defined(ATTNSERVE_CPU_X86_KERNELS)
  if (isa == Isa::kAvx512) return kAvx512AttentionKernel;
  if (isa == Isa::kAvx2) return kAvx2AttentionKernel;
#endif
  (void)isa;
  return kGenericAttentionKernel;
}

const PagedAttentionKernel& PagedKernelFor(Isa isa, bool bf16_dot) {
#if defined(ATTNSERVE_CPU_X86_KERNELS)
  if (isa == Isa::kAvx512) {
    return bf16_dot ? kAvx512Bf16PagedAttentionKernel : kAvx512PagedAttentionKernel;
  }
  if (isa == Isa::kAvx2) return kAvx2PagedAttentionKernel;
#endif
  (void)isa;
  (void)bf16_dot;
  return kGenericPagedAttentionKernel;
}

namespace {

#if defined(ATTNSERVE_CPU_X86_KERNELS)
// Linux keeps AMX tile data off until a process asks (since 5.16): without this, the first tile
// instruction faults.
bool RequestAmxPermission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// AVX512_BF16: CPUID leaf 7, subleaf 1, EAX bit 5.
bool HasAvx512Bf16() { return CpuSupports(Isa::kAvx512) && (Cpuid(7, 1).eax >> 5 & 1) != 0; }

// AMX-BF16 and AMX-TILE: CPUID leaf 7, subleaf 0, EDX bits 22 and 24.
bool HasAmxBf16() {
  const unsigned edx = Cpuid(7, 0).edx;
  return (edx >> 22 & 1) != 0 && (edx >> 24 & 1) != 0;
}
#endif

}  // namespace

bool CpuSupports(Bf16Isa isa) {
  switch (isa) {
    case Bf16Isa::kAuto:
    case Bf16Isa::kNone:
      return true;
#if defined(ATTNSERVE_CPU_X86_KERNELS)
    case Bf16Isa::kAvx512Bf16:
      return HasAvx512Bf16();
    case Bf16Isa::kAmx:
      return HasAvx512Bf16() && HasAmxBf16() && RequestAmxPermission();
#else
    case Bf16Isa::kAvx512Bf16:
    case Bf16Isa::kAmx:
      return false;
#endif
  }
  return false;
}

Bf16Isa BestBf16Isa() {
  if (CpuSupports(Bf16Isa::kAmx)) return Bf16Isa::kAmx;
  if (CpuSupports(Bf16Isa::kAvx512Bf16)) return Bf16Isa::kAvx512Bf16;
  return Bf16Isa::kNone;
}

const Bf16AttentionKernel& Bf16KernelFor(Bf16Isa isa) {
#if defined(ATTNSERVE_CPU_X86_KERNELS)
  if (isa == Bf16Isa::kAmx) return kAmxAttentionKernel;
  return kAvx512Bf16AttentionKernel;
#else
  (void)isa;
  __builtin_trap();  // REQUIRES CpuSupports(isa), never true here
#endif
}

const char* Bf16IsaName(Bf16Isa isa) {
  switch (isa) {
    case Bf16Isa::kAuto:
      return "auto";
    case Bf16Isa::kNone:
      return "none";
    case Bf16Isa::kAvx512Bf16:
      return "avx512_bf16";
    case Bf16Isa::kAmx:
      return "amx_bf16";
  }
  return "unknown";
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "unknown cpu";
}

}  // namespace attnserve::kernels::cpu
