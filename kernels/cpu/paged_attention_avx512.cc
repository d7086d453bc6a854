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

#include <cstdint>

#include "kernels/cpu/paged_attention_kernel.h"
#include "kernels/cpu/paged_vec_avx512.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu::avx512p {
namespace {

// FLOAT32 arithmetic for every cache type.
struct PVec : PVecAvx512 {
  static constexpr bool kBf16Dot = false;
};

}  // namespace
}  // namespace attnserve::kernels::cpu::avx512p

#define ATTNSERVE_CPU_ISA_NAMESPACE avx512p
#include "kernels/cpu/paged_attention_impl.h"

namespace attnserve::kernels::cpu {
extern const PagedAttentionKernel kAvx512PagedAttentionKernel = {Isa::kAvx512,
                                                                 "avx512",
                                                                 &avx512p::paged::ScratchFloats,
                                                                 &avx512p::paged::PartialFloats,
                                                                 &avx512p::paged::Run,
                                                                 &avx512p::paged::Combine};
}  // namespace attnserve::kernels::cpu
