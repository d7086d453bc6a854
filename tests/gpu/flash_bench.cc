// Kernel sweep of the fused attention forward (kernels/cuda/flash_fwd.h) against the cuBLAS
// naive attention in the same operand type, on device buffers (no host copies timed).
// Google Benchmark, CUDA and cuBLAS only (no gRPC, no Abseil), so it runs wherever the build is
// carried. Shapes: L in 512..16384, B = 16384 / L (16k tokens), 16 heads, head dim 64 and 128,
// causal and not, fp16 and bf16. FLOPs: 4 * B * H * L^2 * d, halved for causal.
//
// Counter TFLOPS is per second of kernel time measured with CUDA events (manual time).
// Names: "<impl>/<dtype>/d<dim>/causal<0|1>/L<len>" (tests/gpu/sdpa_compare.py parses them).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/flash_fwd.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr int kTokens = 16384;
constexpr int kHeads = 16;

#define BENCH_CHECK(expr)                    \
  do {                                       \
    const GpuStatus _s = (expr);             \
    if (!_s.ok()) {                          \
      state.SkipWithError(_s.error.c_str()); \
      return;                                \
    }                                        \
  } while (0)

struct DeviceProblem {
  std::vector<void*> buffers;
  ~DeviceProblem() {
    for (void* b : buffers) cudaFree(b);
  }
  GpuStatus Alloc(void** p, size_t bytes) {
    GpuStatus s = CudaCheck(cudaMalloc(p, bytes), "cudaMalloc");
    if (s.ok()) buffers.push_back(*p);
    return s;
  }
};

GpuStatus RandomOperand(DeviceProblem& dp, size_t n, ComputeType type, void** out,
                        std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> host(n);
  for (float& x : host) x = dist(rng);
  void* f32 = nullptr;
  ATTNSERVE_GPU_RETURN_IF_ERROR(dp.Alloc(&f32, n * sizeof(float)));
  ATTNSERVE_GPU_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpy(f32, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy"));
  ATTNSERVE_GPU_RETURN_IF_ERROR(dp.Alloc(out, n * 2));
  return ConvertFromFloat(static_cast<float*>(f32), *out, static_cast<int64_t>(n), type, nullptr);
}

void BM_Attention(benchmark::State& state, bool naive, ComputeType type, int d, bool causal,
                  int len) {
  const int batch = kTokens / len;
  const size_t elems = size_t(kTokens) * kHeads * d;
  DeviceProblem dp;
  std::mt19937 rng(len * 131 + d);
  FlashFwdParams p;
  void *q, *k, *v, *o, *cu;
  BENCH_CHECK(RandomOperand(dp, elems, type, &q, rng));
  BENCH_CHECK(RandomOperand(dp, elems, type, &k, rng));
  BENCH_CHECK(RandomOperand(dp, elems, type, &v, rng));
  BENCH_CHECK(dp.Alloc(&o, elems * sizeof(float)));
  std::vector<int> cu_host(batch + 1);
  for (int b = 0; b <= batch; ++b) cu_host[b] = b * len;
  BENCH_CHECK(dp.Alloc(&cu, cu_host.size() * sizeof(int)));
  BENCH_CHECK(CudaCheck(
      cudaMemcpy(cu, cu_host.data(), cu_host.size() * sizeof(int), cudaMemcpyHostToDevice),
      "copy"));
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = static_cast<float*>(o);
  p.q_row_stride = p.k_row_stride = p.v_row_stride = int64_t{kHeads} * d;
  p.o_row_stride = int64_t{kHeads} * d;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.cu_seqlens_q = p.cu_seqlens_k = static_cast<int*>(cu);
  p.num_seqs = batch;
  p.max_seqlen_q = len;
  p.num_heads = p.num_kv_heads = kHeads;
  p.head_dim = p.v_head_dim = d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.causal = causal;
  void* ws = nullptr;
  cublasHandle_t blas = nullptr;
  if (naive) {
    BENCH_CHECK(dp.Alloc(&ws, NaiveAttentionWorkspaceBytes(p, cu_host.data(), cu_host.data())));
    BENCH_CHECK(CublasCheck(cublasCreate(&blas), "cublasCreate"));
  }
  auto run = [&]() -> GpuStatus {
    return naive ? NaiveAttentionForward(p, type, cu_host.data(), cu_host.data(), nullptr, nullptr,
                                         ws, blas, nullptr)
                 : FlashForward(p, type, nullptr);
  };
  BENCH_CHECK(run());  // warm-up (module load, handle setup)
  BENCH_CHECK(CudaCheck(cudaDeviceSynchronize(), "warm-up"));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    const GpuStatus s = run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!s.ok()) {
      state.SkipWithError(s.error.c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  const GpuStatus s = CudaCheck(cudaDeviceSynchronize(), "kernels");
  if (!s.ok()) state.SkipWithError(s.error.c_str());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (blas != nullptr) cublasDestroy(blas);
  const double flops = 4.0 * batch * kHeads * double(len) * len * d / (causal ? 2.0 : 1.0);
  state.counters["TFLOPS"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["B"] = batch;
  state.counters["H"] = kHeads;
  state.SetLabel(naive ? "cublas-naive" : FlashPathName(SelectFlashPath(p)));
}

}  // namespace
}  // namespace attnserve::kernels::cuda

int main(int argc, char** argv) {
  using namespace attnserve::kernels::cuda;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("flash_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  for (ComputeType type : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
    for (int d : {64, 128}) {
      for (bool causal : {false, true}) {
        for (int len : {512, 1024, 2048, 4096, 8192, 16384}) {
          for (bool naive : {false, true}) {
            const std::string name = std::string(naive ? "naive" : "flash") + "/" +
                                     (type == ComputeType::kFloat16 ? "fp16" : "bf16") + "/d" +
                                     std::to_string(d) + "/causal" + (causal ? "1" : "0") + "/L" +
                                     std::to_string(len);
            benchmark::RegisterBenchmark(name.c_str(), BM_Attention, naive, type, d, causal, len)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond)
                ->MinTime(naive ? 0.1 : 0.2);
          }
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
