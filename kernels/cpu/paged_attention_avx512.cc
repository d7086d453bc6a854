// The paged attention kernel for AVX-512 (F, DQ, BW, VL; FMA; F16C for FLOAT16 caches, through
// VCVTPH2PS). Compiled with per-file flags (kernels/cpu/CMakeLists.txt); reached only through
// kAvx512PagedAttentionKernel after the run-time check in cpu_features.h.
// GCC 12's own intrinsics (see attention_avx512.cc): the _mm512_undefined_ps placeholders of
// VSHUFF32X4 and VPERMILPS, which it calls "used uninitialized" once Reduce4 is inlined into the
// score loop; clang has no such warning group.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include "kernels/cpu/vec_avx512.h"

// FLOAT32 arithmetic for every cache type. Scores: 8 accumulators + the key vector + query
// loads. P·V: 4 row-heads x 4 vectors = 16 accumulators + 4 value vectors + 1 broadcast of the
// 32 zmm registers (the tiles of paged_attention_avx512bf16.cc too).
#define ATTNSERVE_CPU_TILES PagedTiles<Avx512Ops, /*ScoreRows=*/8, /*PvRows=*/4, /*PvVecs=*/4>
#define ATTNSERVE_CPU_ISA_NAMESPACE avx512p
#define ATTNSERVE_CPU_KERNEL(make) kAvx512PagedAttentionKernel = make(Isa::kAvx512, "avx512")
#include "kernels/cpu/paged_attention_impl.h"
