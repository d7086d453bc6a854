#include "kernels/cpu/projection.h"

#include <cblas.h>
#include <omp.h>

#include <cstring>

#include "oneapi/dnnl/dnnl.hpp"
#include "oneapi/dnnl/dnnl_version.h"

namespace attnserve::kernels::cpu {

void Linear(const float* x, int64_t ldx, int64_t rows, int k, const float* w, const float* bias,
            int n, float* y, int64_t ldy) {
  // y starts as the bias and sgemm accumulates onto it (beta = 1): one pass over y fewer than
  // beta = 0 (which OpenBLAS implements as a zeroing pass) followed by a bias pass.
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, bias, sizeof(float) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), n, k, 1.0f, x,
              static_cast<blasint>(ldx), w, k, 1.0f, y, static_cast<blasint>(ldy));
}

namespace {

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::matmul::primitive_desc MatmulDesc(int64_t rows, int k, int n, int64_t ldx, DType y_type,
                                        int64_t ldy) {
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc src({rows, k}, dt::bf16, {ldx, 1});
  const dnnl::memory::desc wei({k, n}, dt::bf16, {1, k});  // w [n, k] read as wᵀ
  const dnnl::memory::desc bias({1, n}, dt::f32, {n, 1});
  const dnnl::memory::desc dst({rows, n}, y_type == DType::kBFloat16 ? dt::bf16 : dt::f32,
                               {ldy, 1});
#if DNNL_VERSION_MAJOR >= 3  // (Ubuntu's newer oneDNN, in the GPU image)
  return dnnl::matmul::primitive_desc(Engine(), src, wei, bias, dst);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias, dst), Engine());
#endif
}

}  // namespace

void LinearBf16(const uint16_t* x, int64_t ldx, int64_t rows, int k, const uint16_t* w,
                const float* bias, int n, void* y, DType y_type, int64_t ldy) {
  // oneDNN (Debian's build uses OpenMP) runs on the calling thread only: the backend's pool is
  // the parallelism, and a row's bits then never depend on a thread count. The setting is per
  // thread.
  omp_set_num_threads(1);
  const dnnl::matmul::primitive_desc pd = MatmulDesc(rows, k, n, ldx, y_type, ldy);
  const dnnl::matmul matmul(pd);  // oneDNN's primitive cache makes repeats cheap
  thread_local dnnl::stream stream(Engine());
  dnnl::memory src(pd.src_desc(), Engine(), const_cast<uint16_t*>(x));
  dnnl::memory wei(pd.weights_desc(), Engine(), const_cast<uint16_t*>(w));
  dnnl::memory b(pd.bias_desc(), Engine(), const_cast<float*>(bias));
  dnnl::memory dst(pd.dst_desc(), Engine(), y);
  matmul.execute(
      stream,
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, dst}});
  stream.wait();
}

std::string LinearBf16Impl(int64_t rows, int k, int n, DType y_type) {
  return MatmulDesc(rows, k, n, k, y_type, n).impl_info_str();
}

void SetBlasSingleThreaded() { openblas_set_num_threads(1); }

void SetBlasThreads(int num_threads) { openblas_set_num_threads(num_threads); }

}  // namespace attnserve::kernels::cpu
