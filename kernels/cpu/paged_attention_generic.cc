// The portable paged attention kernel: the same body with one float per "vector", compiled
// without ISA flags (it runs on any CPU). Also the plain cross-check of the vector paths.
#include "kernels/cpu/vec_generic.h"

#define ATTNSERVE_CPU_TILES PagedTiles<GenericOps, /*ScoreRows=*/4, /*PvRows=*/4, /*PvVecs=*/4>
#define ATTNSERVE_CPU_ISA_NAMESPACE genericp
#define ATTNSERVE_CPU_KERNEL(make) kGenericPagedAttentionKernel = make(Isa::kGeneric, "generic")
#include "kernels/cpu/paged_attention_impl.h"
