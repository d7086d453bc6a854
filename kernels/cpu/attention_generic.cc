// The portable fallback of the fused attention kernel: the same body with one float per
// "vector", compiled without ISA flags (it runs on any CPU; the compiler may still use the
// baseline SSE2 for scalar float arithmetic). Also the kernel the tests use as a
// plain cross-check of the vector paths.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/vec_generic.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::generic {
namespace {

using Vec =
    AttentionTiles<GenericOps, /*ScoreKeys=*/4, /*ScoreVecs=*/4, /*PvCols=*/4, /*PvVecs=*/4>;

}  // namespace
}  // namespace attnserve::kernels::cpu::generic

#define ATTNSERVE_CPU_ISA_NAMESPACE generic
#include "kernels/cpu/attention_kernel_impl.h"

namespace attnserve::kernels::cpu {
extern const AttentionKernel kGenericAttentionKernel = generic::Kernel(Isa::kGeneric, "generic");
}  // namespace attnserve::kernels::cpu
