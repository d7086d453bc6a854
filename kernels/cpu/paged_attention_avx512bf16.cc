// The paged attention kernel for AVX-512 with AVX512_BF16: as paged_attention_avx512.cc, except
// that the scores of BFLOAT16 caches over bfloat16 queries are VDPBF16PS dot products. Compiled
// with per-file flags; reached only through kAvx512Bf16PagedAttentionKernel when the backend's
// 16-bit path is on (cpu_backend.h: BFLOAT16 requests take it when the CPU has one). GCC 12's own
// intrinsics (see attention_avx512.cc): the _mm512_undefined_ps placeholders of VSHUFF32X4 and
// VPERMILPS, which it calls "used uninitialized" once Reduce4 is inlined into the score loop; clang
// has no such warning group.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/vec_avx512.h"
#include "kernels/cpu/vec_tiles.h"

namespace attnserve::kernels::cpu {
namespace {

// The scores of BFLOAT16 caches by VDPBF16PS (32 products per instruction, pairs summed into
// float32 lanes; the products of two bfloat16 are exact in float32), everything else as the
// AVX-512 kernel.
struct Avx512Bf16PagedTiles : PagedTiles<Avx512Ops, /*ScoreRows=*/8, /*PvRows=*/4, /*PvVecs=*/4> {
  static constexpr bool kBf16Dot = true;
  static constexpr int kPairWidth = 32;  // bfloat16 elements per Bh
  using Bh = __m512bh;
  static Bh LoadPairs(const uint16_t* p) { return reinterpret_cast<Bh>(_mm512_loadu_si512(p)); }
  // The first n elements (0 <= n <= 32), the rest zero.
  static Bh LoadPairsN(const uint16_t* p, int n) {
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1);
    return reinterpret_cast<Bh>(_mm512_maskz_loadu_epi16(m, p));
  }
  static V DotBf16(V acc, Bh a, Bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

}  // namespace
}  // namespace attnserve::kernels::cpu

#define ATTNSERVE_CPU_TILES Avx512Bf16PagedTiles
#define ATTNSERVE_CPU_ISA_NAMESPACE avx512bf16p
#define ATTNSERVE_CPU_KERNEL(make) \
  kAvx512Bf16PagedAttentionKernel = make(Isa::kAvx512, "avx512_bf16")
#include "kernels/cpu/paged_attention_impl.h"
