// The paged attention kernel for AVX2 + FMA + F16C. Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx2PagedAttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include "kernels/cpu/vec_avx2.h"

// P·V: 4 row-heads x 2 vectors = 8 accumulators + 2 value vectors + 1 broadcast of 16 ymm.
#define ATTNSERVE_CPU_TILES PagedTiles<Avx2Ops, /*ScoreRows=*/4, /*PvRows=*/4, /*PvVecs=*/2>
#define ATTNSERVE_CPU_ISA_NAMESPACE avx2p
#define ATTNSERVE_CPU_KERNEL(make) kAvx2PagedAttentionKernel = make(Isa::kAvx2, "avx2")
#include "kernels/cpu/paged_attention_impl.h"
