// The paged attention kernel for AVX2 + FMA + F16C. Compiled with per-file flags
// (kernels/cpu/CMakeLists.txt); reached only through kAvx2PagedAttentionKernel after the run-time
// check in cpu_features.h.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/cpu/vec_avx2.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx2p {
namespace {

// P·V: 4 row-heads x 2 vectors = 8 accumulators + 2 value vectors + 1 broadcast of 16 ymm.
using PVec = PagedTiles<Avx2Ops, /*ScoreRows=*/4, /*PvRows=*/4, /*PvVecs=*/2>;

}  // namespace
}  // namespace attnserve::kernels::cpu::avx2p

#define ATTNSERVE_CPU_ISA_NAMESPACE avx2p
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kAvx2PagedAttentionKernel =
    avx2p::paged::Kernel(Isa::kAvx2, "avx2");
}  // namespace attnserve::kernels::cpu
