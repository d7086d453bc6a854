// The fused attention kernel for AVX2 + FMA (+ F16C for FLOAT16 inputs). Compiled with per-file
// flags (kernels/cpu/CMakeLists.txt); reached only through kAvx2AttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include "kernels/cpu/vec_avx2.h"

// 6 keys x 2 vectors = 12 accumulators + 2 query loads + 1 broadcast of the 16 ymm registers.
#define ATTNSERVE_CPU_TILES \
  AttentionTiles<Avx2Ops, /*ScoreKeys=*/6, /*ScoreVecs=*/2, /*PvCols=*/6, /*PvVecs=*/2>
#define ATTNSERVE_CPU_ISA_NAMESPACE avx2
#define ATTNSERVE_CPU_KERNEL(make) kAvx2AttentionKernel = make(Isa::kAvx2, "avx2")
#include "kernels/cpu/attention_kernel_impl.h"
