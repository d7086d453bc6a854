// Google Benchmark targets for the CPU backend (issue 3). Not a test: run by hand or through
// tests/bench/cpu_vs_torch.sh, which puts the figures next to OpenBLAS sgemm and PyTorch.
//
// Counters:
//   GFLOP/s          attention 4·B·h·Lq·Lk·d_k; multi-head adds 2·B·L·d_model² per projection
//   peak_extra_MiB   peak of the bytes live through operator new during one call, above what
//                    was live before it (this binary replaces the global operator new/delete to
//                    count them); inputs and outputs are allocated before and not counted
//   peak_rss_extra_MiB  the same seen by the kernel: VmHWM after resetting it through
//                    /proc/self/clear_refs, minus VmRSS before; smaller when malloc reuses memory
//                    the process already holds
#include <cblas.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/projection.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/multi_head.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attnserve::kernels::cpu {
namespace {

// Reads a "VmRSS:"-style line of /proc/self/status, in bytes (0 when unavailable).
int64_t ProcStatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  }
  return 0;
}

}  // namespace

// Bytes live through operator new, and their peak since the last reset.
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void* CountedAlloc(size_t n, size_t align) {
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n == 0 ? 1 : n);
  } else if (posix_memalign(&p, align, n == 0 ? 1 : n) != 0) {
    p = nullptr;
  }
  if (p == nullptr) throw std::bad_alloc();
  const int64_t live = g_live_bytes += static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak_bytes.load();
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void CountedFree(void* p) {
  if (p == nullptr) return;
  g_live_bytes -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}

namespace {

struct PeakExtra {
  double heap_mib;  // through operator new
  double rss_mib;   // resident (-1 when VmHWM cannot be reset)
};

// Peak extra memory of fn().
template <typename Fn>
PeakExtra MeasurePeakExtra(Fn fn) {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5" << std::flush;  // resets VmHWM to the current RSS
  const bool rss_ok = static_cast<bool>(clear);
  const int64_t rss_before = ProcStatusBytes("VmRSS:");
  const int64_t live_before = g_live_bytes.load();
  g_peak_bytes = live_before;
  fn();
  constexpr double kMiB = 1024.0 * 1024.0;
  return PeakExtra{
      static_cast<double>(g_peak_bytes.load() - live_before) / kMiB,
      rss_ok ? static_cast<double>(ProcStatusBytes("VmHWM:") - rss_before) / kMiB : -1.0};
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  }
  return v;
}

// Threads of the backend and of the sgemm ceiling: --threads=N on the command line, default 0
// (one per hardware thread).
int g_threads = 0;

CpuBackend& Backend() {
  static CpuBackend* backend =
      CpuBackend::Create(CpuBackendOptions{.num_threads = g_threads}).value().release();
  return *backend;
}

MultiHeadWeights Weights(int d_model, int heads) {
  MultiHeadWeights w;
  w.d_model = d_model;
  w.num_heads = heads;
  const int64_t d = d_model;
  w.w_qkv = Random(3 * d * d, 1);
  w.b_qkv = Random(3 * d, 2);
  w.w_o = Random(d * d, 3);
  w.b_o = Random(d, 4);
  for (float& x : w.w_qkv) x /= std::sqrt(static_cast<float>(d_model));
  for (float& x : w.w_o) x /= std::sqrt(static_cast<float>(d_model));
  return w;
}

// The request's inputs: float32 values, or their bfloat16 encodings.
struct Inputs {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const void* data(DType t) const {
    return t == DType::kBFloat16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
};
Inputs MakeInputs(int64_t n, uint32_t seed) {
  Inputs in{Random(n, seed), std::vector<uint16_t>(n)};
  FromFloat32(DType::kBFloat16, in.f32.data(), n, in.bf16.data());
  return in;
}

// Which path a backend takes for `dtype`, for the label.
std::string PathLabel(const CpuBackend& backend, DType dtype) {
  return backend.ComputesInBf16(dtype) ? std::string(Bf16IsaName(backend.bf16_isa()))
                                       : std::string("fp32 ") + IsaName(backend.isa());
}

// Args: B, L, d_model, h. Self-attention, no mask, as torch.nn.MultiheadAttention is measured.
void MultiHeadBench(benchmark::State& state, DType dtype) {
  const int batch = state.range(0), len = state.range(1), dm = state.range(2);
  const int heads = state.range(3);
  const MultiHeadWeights w = Weights(dm, heads);
  const Inputs x = MakeInputs(int64_t{batch} * len * dm, 5);
  std::vector<float> out(x.f32.size());
  MultiHeadParams p;
  p.module = &w;
  p.batch = batch;
  p.q_len = p.kv_len = len;
  p.input_dtype = dtype;
  p.query = p.key = p.value = x.data(dtype);
  p.self_attention = true;
  p.out = out.data();
  p.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim()));
  CpuBackend& backend = Backend();
  (void)backend.MultiHead({p});  // the weights' bfloat16 copies are made once, on first use
  const PeakExtra mem = MeasurePeakExtra([&] { (void)backend.MultiHead({p}); });
  for (auto _ : state) {
    (void)backend.MultiHead({p});
    benchmark::DoNotOptimize(out.data());
  }
  std::string label = PathLabel(backend, dtype);
  if (backend.ComputesInBf16(dtype)) {
    label += ", projections " + LinearBf16Impl(1024, dm, 3 * dm, DType::kBFloat16);
  }
  state.SetLabel(label);
  state.counters["GFLOP/s"] =
      benchmark::Counter(MultiHeadFlops(p) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_extra_MiB"] = mem.heap_mib;
  state.counters["peak_rss_extra_MiB"] = mem.rss_mib;
  state.counters["threads"] = backend.num_threads();
}
void BM_MultiHead(benchmark::State& state) { MultiHeadBench(state, DType::kFloat32); }

// Args: N, L, d_model, h: a batch of N requests of one sequence each (B = 1), float32
// self-attention, as the server's Executor hands a batch of N MultiHeadAttention requests to the
// backend (one MultiHeadParams per request, each with its own input and output buffers). The
// backend's own speed that tests/bench/serving_overhead.sh compares the served rpc with.
void BM_MultiHeadRequests(benchmark::State& state) {
  const int n = state.range(0), len = state.range(1), dm = state.range(2);
  const int heads = state.range(3);
  const MultiHeadWeights w = Weights(dm, heads);
  std::vector<Inputs> x;
  std::vector<std::vector<float>> out;
  std::vector<MultiHeadParams> batch(n);
  for (int i = 0; i < n; ++i) {
    x.push_back(MakeInputs(int64_t{len} * dm, 5 + i));
    out.emplace_back(x.back().f32.size());
  }
  double flops = 0;
  for (int i = 0; i < n; ++i) {
    MultiHeadParams& p = batch[i];
    p.module = &w;
    p.batch = 1;
    p.q_len = p.kv_len = len;
    p.input_dtype = DType::kFloat32;
    p.query = p.key = p.value = x[i].f32.data();
    p.self_attention = true;
    p.out = out[i].data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim()));
    flops += MultiHeadFlops(p);
  }
  CpuBackend& backend = Backend();
  (void)backend.MultiHead(batch);
  for (auto _ : state) {
    (void)backend.MultiHead(batch);
    benchmark::DoNotOptimize(out.front().data());
  }
  state.SetLabel(PathLabel(backend, DType::kFloat32));
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["requests/s"] =
      benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = backend.num_threads();
}
void BM_MultiHeadBf16(benchmark::State& state) { MultiHeadBench(state, DType::kBFloat16); }

AttentionParams AttentionOf(int batch, int len, int heads, int dk, DType dtype, const Inputs& q,
                            const Inputs& k, const Inputs& v, std::vector<float>* out) {
  AttentionParams p;
  p.batch = batch;
  p.num_heads = p.num_kv_heads = heads;
  p.q_len = p.kv_len = len;
  p.head_dim = p.v_head_dim = dk;
  p.input_dtype = dtype;
  const int64_t bs = int64_t{heads} * len * dk, hs = int64_t{len} * dk;
  p.q = {q.data(dtype), bs, hs, dk};
  p.k = {k.data(dtype), bs, hs, dk};
  p.v = {v.data(dtype), bs, hs, dk};
  p.out = {out->data(), bs, hs, dk};
  p.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  return p;
}

// Args: B, L, d_model, h: the attention part alone, q/k/v [B, h, L, d_model / h].
void AttentionBench(benchmark::State& state, DType dtype) {
  const int batch = state.range(0), len = state.range(1), dm = state.range(2);
  const int heads = state.range(3);
  const int dk = dm / heads;
  const int64_t n = int64_t{batch} * heads * len * dk;
  const Inputs q = MakeInputs(n, 6), k = MakeInputs(n, 7), v = MakeInputs(n, 8);
  std::vector<float> out(n);
  const AttentionParams p = AttentionOf(batch, len, heads, dk, dtype, q, k, v, &out);
  CpuBackend& backend = Backend();
  const PeakExtra mem = MeasurePeakExtra([&] { (void)backend.Attend({p}); });
  for (auto _ : state) {
    (void)backend.Attend({p});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(PathLabel(backend, dtype));
  state.counters["GFLOP/s"] =
      benchmark::Counter(AttentionFlops(p) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_extra_MiB"] = mem.heap_mib;
  state.counters["peak_rss_extra_MiB"] = mem.rss_mib;
  state.counters["threads"] = backend.num_threads();
}
void BM_Attention(benchmark::State& state) { AttentionBench(state, DType::kFloat32); }
void BM_AttentionBf16(benchmark::State& state) { AttentionBench(state, DType::kBFloat16); }

// Args: path (2 avx512_bf16, 3 amx_bf16): bfloat16 attention at (B, L, d_model, h) =
// (4, 1024, 512, 8) on a backend forced to that path (skipped when the CPU lacks it).
void BM_AttentionBf16Path(benchmark::State& state) {
  const Bf16Isa path = static_cast<Bf16Isa>(state.range(0));
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = g_threads, .bf16_isa = path});
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  const int batch = 4, len = 1024, heads = 8, dk = 64;
  const int64_t n = int64_t{batch} * heads * len * dk;
  const Inputs q = MakeInputs(n, 6), k = MakeInputs(n, 7), v = MakeInputs(n, 8);
  std::vector<float> out(n);
  const AttentionParams p = AttentionOf(batch, len, heads, dk, DType::kBFloat16, q, k, v, &out);
  for (auto _ : state) {
    (void)(*backend)->Attend({p});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(Bf16IsaName(path));
  state.counters["GFLOP/s"] =
      benchmark::Counter(AttentionFlops(p) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = (*backend)->num_threads();
}

// Args: isa (1 generic, 2 avx2, 3 avx512): attention at (B, L, d_model, h) = (1, 1024, 512, 8)
// on a backend forced to that instruction set (skipped when the CPU lacks it).
void BM_AttentionIsa(benchmark::State& state) {
  const Isa isa = static_cast<Isa>(state.range(0));
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = g_threads, .isa = isa});
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  const int len = 1024, heads = 8, dk = 64;
  const int64_t n = int64_t{heads} * len * dk;
  const std::vector<float> q = Random(n, 6), k = Random(n, 7), v = Random(n, 8);
  std::vector<float> out(n);
  AttentionParams p;
  p.batch = 1;
  p.num_heads = p.num_kv_heads = heads;
  p.q_len = p.kv_len = len;
  p.head_dim = p.v_head_dim = dk;
  p.q = {q.data(), n, int64_t{len} * dk, dk};
  p.k = {k.data(), n, int64_t{len} * dk, dk};
  p.v = {v.data(), n, int64_t{len} * dk, dk};
  p.out = {out.data(), n, int64_t{len} * dk, dk};
  p.scale = 0.125f;
  for (auto _ : state) {
    (void)(*backend)->Attend({p});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(IsaName(isa));  // float32 inputs: the float32 kernel of that ISA
  state.counters["GFLOP/s"] =
      benchmark::Counter(AttentionFlops(p) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = (*backend)->num_threads();
}

// Args: M, N, K, threads. OpenBLAS sgemm C = A·Bᵀ (the projection's shape), the practical
// ceiling of this machine; OpenBLAS's own threading, restored to 1 afterwards.
void BM_Sgemm(benchmark::State& state) {
  const int m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = state.range(3) > 0 ? state.range(3) : Backend().num_threads();
  const std::vector<float> a = Random(int64_t{m} * k, 9), b = Random(int64_t{n} * k, 10);
  std::vector<float> c(int64_t{m} * n);
  SetBlasThreads(threads);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  SetBlasSingleThreaded();
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

// Args: M, N, K, threads. oneDNN matmul C = A·Bᵀ with bfloat16 A and B, float32 C (the
// projection's shape): the bfloat16 ceiling of this machine, on oneDNN's own threads (OpenMP).
void BM_OneDnnBf16(benchmark::State& state) {
  const int m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = state.range(3) > 0 ? state.range(3) : Backend().num_threads();
  const Inputs a = MakeInputs(int64_t{m} * k, 9), b = MakeInputs(int64_t{n} * k, 10);
  std::vector<float> c(int64_t{m} * n);
  using dt = dnnl::memory::data_type;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc a_md({m, k}, dt::bf16, {k, 1});
  const dnnl::memory::desc b_md({k, n}, dt::bf16, {1, k});
  const dnnl::memory::desc c_md({m, n}, dt::f32, {n, 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
  const dnnl::matmul matmul(pd);
  dnnl::memory am(a_md, engine, const_cast<uint16_t*>(a.bf16.data()));
  dnnl::memory bm(b_md, engine, const_cast<uint16_t*>(b.bf16.data()));
  dnnl::memory cm(c_md, engine, c.data());
  omp_set_num_threads(threads);  // this thread's setting (the backend sets 1 on its threads)
  for (auto _ : state) {
    matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
    benchmark::DoNotOptimize(c.data());
  }
  state.SetLabel(pd.impl_info_str());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

#define ATTNSERVE_SHAPES \
  Args({4, 128, 512, 8})->Args({4, 1024, 512, 8})->Args({1, 4096, 512, 8})->Args({1, 4096, 1024, 8})
BENCHMARK(BM_MultiHead)
    ->ATTNSERVE_SHAPES->Args({1, 16384, 64, 1})
    ->Args({1, 128, 512, 8})  // serving_comparison.sh's large request, alone
    ->Args({8, 128, 512, 8})  // and as a batch of 8
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_MultiHeadRequests)
    ->Args({1, 128, 512, 8})
    ->Args({2, 128, 512, 8})
    ->Args({4, 128, 512, 8})
    ->Args({8, 128, 512, 8})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_Attention)
    ->ATTNSERVE_SHAPES->Args({1, 16384, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_MultiHeadBf16)
    ->ATTNSERVE_SHAPES->Args({1, 16384, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_AttentionBf16)
    ->ATTNSERVE_SHAPES->Args({1, 16384, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_AttentionBf16Path)
    ->Arg(static_cast<int>(Bf16Isa::kAvx512Bf16))
    ->Arg(static_cast<int>(Bf16Isa::kAmx))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_OneDnnBf16)
    ->Args({4096, 1536, 512, 0})
    // The attention core's products as oneDNN calls, one thread: a task's S = Q·Kᵀ tile
    // (64 queries x 128 keys x D 64) and P·V tile (64 x 64 x 128), and coarse tiles.
    ->Args({64, 128, 64, 1})
    ->Args({64, 64, 128, 1})
    ->Args({256, 1024, 64, 1})
    ->Args({256, 64, 1024, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_AttentionIsa)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_Sgemm)
    ->Args({4096, 1536, 512, 0})
    ->Args({4096, 512, 512, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

// The pool's hand-off alone: ParallelFor of a loop of n indices with next to no work, on a pool
// of `threads` (16: what a 16-core node gave a process before the backend's threads followed its
// cgroup CPU limit, kernels/cpu/available_cores.h). Wall time and the process's CPU (every
// thread's) per loop: the CPU counts the workers that were woken for nothing.
void BM_ParallelForSmallLoop(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  const int64_t n = state.range(1);
  std::atomic<int64_t> sum{0};
  for (auto _ : state) pool.ParallelFor(n, [&](int64_t i) { sum.fetch_add(i); });
  benchmark::DoNotOptimize(sum.load());
  state.counters["threads"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_ParallelForSmallLoop)
    ->Args({2, 2})
    ->Args({16, 2})
    ->Args({16, 4})
    ->Args({16, 8})
    ->Args({16, 64})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace attnserve::kernels::cpu

void* operator new(size_t n) { return attnserve::kernels::cpu::CountedAlloc(n, 0); }
void* operator new[](size_t n) { return attnserve::kernels::cpu::CountedAlloc(n, 0); }
void* operator new(size_t n, std::align_val_t a) {
  return attnserve::kernels::cpu::CountedAlloc(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a) {
  return attnserve::kernels::cpu::CountedAlloc(n, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { attnserve::kernels::cpu::CountedFree(p); }
void operator delete[](void* p) noexcept { attnserve::kernels::cpu::CountedFree(p); }
void operator delete(void* p, size_t) noexcept { attnserve::kernels::cpu::CountedFree(p); }
void operator delete[](void* p, size_t) noexcept { attnserve::kernels::cpu::CountedFree(p); }
void operator delete(void* p, std::align_val_t) noexcept {
  attnserve::kernels::cpu::CountedFree(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  attnserve::kernels::cpu::CountedFree(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  attnserve::kernels::cpu::CountedFree(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  attnserve::kernels::cpu::CountedFree(p);
}

int main(int argc, char** argv) {
  // Takes --threads=N out of the arguments before Google Benchmark parses the rest.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      attnserve::kernels::cpu::g_threads = std::atoi(argv[i] + 10);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
