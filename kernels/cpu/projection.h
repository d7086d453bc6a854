// The linear projections of the multi-head module, through OpenBLAS's sgemm.
//
// Reproducibility: OpenBLAS runs single-threaded here (SetBlasSingleThreaded); CpuBackend
// parallelises by calling Linear on fixed row chunks of a request from its own pool, so a row's
// bits depend only on its request, never on the thread count or the batch.
#ifndef ATTNSERVE_KERNELS_CPU_PROJECTION_H_
#define ATTNSERVE_KERNELS_CPU_PROJECTION_H_

#include <cstdint>

namespace attnserve::kernels::cpu {

// y[r, o] = sum_c x[r, c] · w[o, c] + bias[o] for r < rows, o < n, c < k: nn.Linear with w
// [n, k] row-major. x and y are row-major with row strides ldx and ldy (in elements).
void Linear(const float* x, int64_t ldx, int64_t rows, int k, const float* w, const float* bias,
            int n, float* y, int64_t ldy);

// Makes OpenBLAS compute every call on the calling thread (a process-wide OpenBLAS setting).
void SetBlasSingleThreaded();

// OpenBLAS's thread count (for the benchmark, which also measures multi-threaded sgemm).
void SetBlasThreads(int num_threads);

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_PROJECTION_H_
