#include "kernels/cpu/cpu_features.h"

#include <fstream>
#include <string>

namespace attnserve::kernels::cpu {

bool CpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kGeneric:
      return true;
#if defined(ATTNSERVE_CPU_X86_KERNELS)
    case Isa::kAvx2:
      // F16C widens FLOAT16 inputs; every CPU with AVX2 and FMA has it.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
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
