// The fused attention kernel for AVX2 + FMA (+ F16C for FLOAT16 inputs). Compiled with per-file
// flags (kernels/cpu/CMakeLists.txt); reached only through kAvx2AttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/vec_avx2.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx2 {
namespace {

// 6 keys x 2 vectors = 12 accumulators + 2 query loads + 1 broadcast of the 16 ymm registers.
using Vec = AttentionTiles<Avx2Ops, /*ScoreKeys=*/6, /*ScoreVecs=*/2, /*PvCols=*/6, /*PvVecs=*/2>;

}  // namespace
}  // namespace attnserve::kernels::cpu::avx2

#define ATTNSERVE_CPU_ISA_NAMESPACE avx2
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kAvx2AttentionKernel = avx2::Kernel(Isa::kAvx2, "avx2");
}  // namespace attnserve::kernels::cpu
