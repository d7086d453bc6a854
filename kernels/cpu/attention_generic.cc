// The portable fallback of the fused attention kernel: the same body with one float per
// "vector", compiled without ISA flags (it runs on any CPU; the compiler may still use the
// baseline SSE2 for scalar float arithmetic). Also the kernel the tests use as a
// plain cross-check of the vector paths.
#include "kernels/cpu/vec_generic.h"

#define ATTNSERVE_CPU_TILES \
  AttentionTiles<GenericOps, /*ScoreKeys=*/4, /*ScoreVecs=*/4, /*PvCols=*/4, /*PvVecs=*/4>
#define ATTNSERVE_CPU_ISA_NAMESPACE generic
#define ATTNSERVE_CPU_KERNEL(make) kGenericAttentionKernel = make(Isa::kGeneric, "generic")
#include "kernels/cpu/attention_kernel_impl.h"
