#include "kernels/cpu/projection.h"

#include <cblas.h>

#include <cstring>

namespace attnserve::kernels::cpu {

void Linear(const float* x, int64_t ldx, int64_t rows, int k, const float* w, const float* bias,
            int n, float* y, int64_t ldy) {
  // y starts as the bias and sgemm accumulates onto it (beta = 1): one pass over y fewer than
  // beta = 0 (which OpenBLAS implements as a zeroing pass) followed by a bias pass.
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, bias, sizeof(float) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), n, k, 1.0f, x,
              static_cast<blasint>(ldx), w, k, 1.0f, y, static_cast<blasint>(ldy));
}

void SetBlasSingleThreaded() { openblas_set_num_threads(1); }

void SetBlasThreads(int num_threads) { openblas_set_num_threads(num_threads); }

}  // namespace attnserve::kernels::cpu
