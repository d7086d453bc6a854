// exp(x) on a vector of the CPU kernels' instruction sets (vec_avx512.h, vec_avx2.h), written once
// over their operations. Internal linkage (an unnamed namespace), as the vec headers, so that each
// unit compiled with its own flags keeps its own copy and no out-of-line copy is shared between
// units built with different instruction sets.
#ifndef ATTNSERVE_KERNELS_CPU_EXP_CEPHES_H_
#define ATTNSERVE_KERNELS_CPU_EXP_CEPHES_H_

namespace attnserve::kernels::cpu {
namespace {

// exp(x) to about 1 ulp (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial,
// 2^n built in the exponent bits); x < -87 (exp(-inf) included) gives exactly 0, NaN gives NaN.
// Ops: Set1, Min and Max (returning the second operand when either is NaN, as MINPS/MAXPS do),
// Mul, Add, Fmadd, Fnmadd, RoundNearest, ScalePow2 (y · 2^n through the exponent bits, n integral
// in [-126, 127]) and ZeroBelow (0 in the lanes where x < bound, ordered: not for NaN).
template <class Ops>
inline typename Ops::V CephesExp(typename Ops::V x) {
  using V = typename Ops::V;
  const V lowest = Ops::Set1(-87.0f);
  // Clamp with x as the second operand, so that NaN propagates (the NaN rule of
  // attention_params.h needs exp(NaN) = NaN).
  const V c = Ops::Max(lowest, Ops::Min(Ops::Set1(88.0f), x));
  const V n = Ops::RoundNearest(Ops::Mul(c, Ops::Set1(1.44269504088896341f)));
  V r = Ops::Fnmadd(n, Ops::Set1(0.693359375f), c);
  r = Ops::Fnmadd(n, Ops::Set1(-2.12194440e-4f), r);
  V poly = Ops::Set1(1.9875691500e-4f);
  poly = Ops::Fmadd(poly, r, Ops::Set1(1.3981999507e-3f));
  poly = Ops::Fmadd(poly, r, Ops::Set1(8.3334519073e-3f));
  poly = Ops::Fmadd(poly, r, Ops::Set1(4.1665795894e-2f));
  poly = Ops::Fmadd(poly, r, Ops::Set1(1.6666665459e-1f));
  poly = Ops::Fmadd(poly, r, Ops::Set1(5.0000001201e-1f));
  const V y = Ops::Fmadd(poly, Ops::Mul(r, r), Ops::Add(r, Ops::Set1(1.0f)));
  return Ops::ZeroBelow(Ops::ScalePow2(y, n), x, lowest);
}

}  // namespace
}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_EXP_CEPHES_H_
