// The fused attention kernel for AVX-512 (F, DQ; FMA). Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx512AttentionKernel after the run-time
// check in cpu_features.h.
// GCC 12 warns that the _mm512_undefined_* placeholders inside its own intrinsics "may be used
// uninitialized" (a false positive of its headers).
#if !defined(__clang__)  // clang has no such warning (and warns about the unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/cpu/vec_avx512.h"

// 6 keys x 4 vectors (64 query rows) = 24 accumulators + 4 query loads + 1 broadcast of the 32
// zmm registers.
#define ATTNSERVE_CPU_TILES \
  AttentionTiles<Avx512Ops, /*ScoreKeys=*/6, /*ScoreVecs=*/4, /*PvCols=*/6, /*PvVecs=*/4>
#define ATTNSERVE_CPU_ISA_NAMESPACE avx512
#define ATTNSERVE_CPU_KERNEL(make) kAvx512AttentionKernel = make(Isa::kAvx512, "avx512")
#include "kernels/cpu/attention_kernel_impl.h"
