// The linear projections of the multi-head module, through OpenBLAS's sgemm.
//
// Reproducibility: OpenBLAS runs single-threaded here (SetBlasSingleThreaded); CpuBackend
// parallelises by calling Linear on fixed row chunks of a request from its own pool, so a row's
// bits depend only on its request, never on the thread count or the batch.
#ifndef ATTNSERVE_KERNELS_CPU_PROJECTION_H_
#define ATTNSERVE_KERNELS_CPU_PROJECTION_H_

#include <cstdint>
#include <string>

#include "kernels/dtype.h"

namespace attnserve::kernels::cpu {

// y[r, o] = sum_c x[r, c] · w[o, c] + bias[o] for r < rows, o < n, c < k: nn.Linear with w
// [n, k] row-major. x and y are row-major with row strides ldx and ldy (in elements).
void Linear(const float* x, int64_t ldx, int64_t rows, int k, const float* w, const float* bias,
            int n, float* y, int64_t ldy);

// The same with bfloat16 operands and float32 accumulation, through oneDNN's matmul on the
// calling thread (oneDNN picks its kernel for the CPU at run time: AMX, AVX512_BF16, or a
// conversion path). x [rows, k] and w [n, k] are bfloat16, bias float32, y float32 or bfloat16
// (y_type, rounded to nearest even). Deterministic for a given (rows, k, n) and CPU.
void LinearBf16(const uint16_t* x, int64_t ldx, int64_t rows, int k, const uint16_t* w,
                const float* bias, int n, void* y, DType y_type, int64_t ldy);

// oneDNN's name for the implementation LinearBf16 uses at this size (e.g.
// "brg:avx512_core_amx"), for the benchmark and devices().
std::string LinearBf16Impl(int64_t rows, int k, int n, DType y_type);

// Makes OpenBLAS compute every call on the calling thread (a process-wide OpenBLAS setting).
void SetBlasSingleThreaded();

// OpenBLAS's thread count (for the benchmark, which also measures multi-threaded sgemm).
void SetBlasThreads(int num_threads);

}  // namespace attnserve::kernels::cpu

#endif  // ATTNSERVE_KERNELS_CPU_PROJECTION_H_
