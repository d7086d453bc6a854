// The portable paged attention kernel: the same body with one float per "vector", compiled
// without ISA flags (it runs on any CPU). Also the plain cross-check of the vector paths.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/cpu/vec_generic.h"
#include "kernels/cpu/vec_tiles.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::genericp {
namespace {

using PVec = PagedTiles<GenericOps, /*ScoreRows=*/4, /*PvRows=*/4, /*PvVecs=*/4>;

}  // namespace
}  // namespace attnserve::kernels::cpu::genericp

#define ATTNSERVE_CPU_ISA_NAMESPACE genericp
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kGenericPagedAttentionKernel =
    genericp::paged::Kernel(Isa::kGeneric, "generic");
}  // namespace attnserve::kernels::cpu
