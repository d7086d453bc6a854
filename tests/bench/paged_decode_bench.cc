// The CPU decode kernel against the machine's memory bandwidth, in one process (issue 14's
// benchmark; tests/bench/decode_bench.sh runs it next to PyTorch and DECODE.md has the figures).
// Not a test.
//
// 1. Memory bandwidth: STREAM's triad a[i] = b[i] + s·c[i] and copy a[i] = b[i] over float
//    arrays of --stream_mib MiB each (far above the last-level cache), split evenly over
//    --threads threads, each thread touching its own part first. Bytes counted as STREAM does:
//    3 arrays (triad) or 2 (copy) x the array size per pass, write-allocate traffic not counted.
// 2. The decode kernel (CpuBackend::PagedAttention, the backend's best ISA): --seqs sequences x
//    --context keys, one new query row each (q_len 1), Hq query heads over Hkv kv heads, D =
//    Dv, pages of --page_size tokens scattered through the pool. Bytes = every K and V element
//    of every sequence, read once per step. The figure: those bytes / the step's wall time, and
//    that as a fraction of the best triad and copy bandwidth.
// Each figure is the median and the best of --reps timed runs after one warm-up.
//
// Output: one line per figure, "name key=value ...", for decode_bench.sh to collect.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/dtype.h"

namespace attnserve::kernels::cpu {
namespace {

struct Flags {
  int threads = 0;  // 0: hardware threads
  int reps = 7;
  int64_t stream_mib = 512;
  int seqs = 64;
  int context = 4096;
  int num_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;
  std::string dtypes = "float16,bfloat16,float32";
  bool scatter = true;  // pages in a random order (false: each sequence's pages in order)
};

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stats {
  double median, best;  // wall seconds
  double cpu_share;     // CPU seconds of the process / (wall seconds x threads), over all reps
};

// Runs fn reps times after a warm-up; returns the median and best wall time in seconds and the
// share of `threads` CPUs the process got meanwhile (the machine is shared: a share well below 1
// means other processes held the cores).
template <typename Fn>
Stats Time(int reps, int threads, Fn fn) {
  fn();
  std::vector<double> t;
  const double cpu0 = CpuSeconds();
  double wall = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Seconds();
    fn();
    t.push_back(Seconds() - t0);
    wall += t.back();
  }
  const double cpu = CpuSeconds() - cpu0;
  std::sort(t.begin(), t.end());
  return Stats{t[t.size() / 2], t.front(), cpu / (wall * threads)};
}

// Runs fn(begin, end) on `threads` threads over [0, n), even contiguous parts.
template <typename Fn>
void Parallel(int threads, int64_t n, Fn fn) {
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([=] { fn(n * i / threads, n * (i + 1) / threads); });
  }
  for (std::thread& t : pool) t.join();
}

struct AlignedFree {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
template <typename T>
std::unique_ptr<T[], AlignedFree> Allocate(int64_t n) {
  return std::unique_ptr<T[], AlignedFree>(
      static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{64})));
}

void Stream(const Flags& f, int threads) {
  const int64_t n = f.stream_mib * 1024 * 1024 / sizeof(float);
  auto a = Allocate<float>(n), b = Allocate<float>(n), c = Allocate<float>(n);
  float* pa = a.get();
  float* pb = b.get();
  float* pc = c.get();
  Parallel(threads, n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pa[i] = 0.0f, pb[i] = 1.0f, pc[i] = 2.0f;
  });
  const float s = 3.0f;
  const Stats triad = Time(f.reps, threads, [&] {
    Parallel(threads, n, [=](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pa[i] = pb[i] + s * pc[i];
    });
  });
  const Stats copy = Time(f.reps, threads, [&] {
    Parallel(threads, n, [=](int64_t i0, int64_t i1) {
      std::memcpy(pa + i0, pb + i0, (i1 - i0) * sizeof(float));
    });
  });
  const double gb_triad = 3.0 * n * sizeof(float) / 1e9, gb_copy = 2.0 * n * sizeof(float) / 1e9;
  std::printf(
      "stream_triad threads=%d array_mib=%lld gbps_median=%.2f gbps_best=%.2f cpu_share=%.2f\n",
      threads, static_cast<long long>(f.stream_mib), gb_triad / triad.median, gb_triad / triad.best,
      triad.cpu_share);
  std::printf(
      "stream_copy threads=%d array_mib=%lld gbps_median=%.2f gbps_best=%.2f cpu_share=%.2f\n",
      threads, static_cast<long long>(f.stream_mib), gb_copy / copy.median, gb_copy / copy.best,
      copy.cpu_share);
  std::fflush(stdout);
}

void Decode(const Flags& f, CpuBackend& backend, DType dtype) {
  const int pages_per_seq = (f.context + f.page_size - 1) / f.page_size;
  const int num_pages = f.seqs * pages_per_seq;
  PagedAttentionParams p;
  p.num_seqs = f.seqs;
  p.num_heads = f.num_heads;
  p.num_kv_heads = f.num_kv_heads;
  p.head_dim = p.v_head_dim = f.head_dim;
  p.page_size = f.page_size;
  p.max_pages_per_seq = pages_per_seq;
  p.dtype = dtype;
  p.total_q = f.seqs;
  p.scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  const int esize = static_cast<int>(DTypeSize(dtype));
  const int64_t elems = num_pages * p.k_page_stride();
  auto k = Allocate<char>(elems * esize), v = Allocate<char>(elems * esize);
  // Values: a cheap hash to N-ish(0, 1)-sized floats, written by all threads (first touch).
  auto fill = [&](char* base, uint32_t salt) {
    Parallel(backend.num_threads(), elems, [=](int64_t i0, int64_t i1) {
      std::vector<float> row(4096);
      for (int64_t i = i0; i < i1; i += 4096) {
        const int n = static_cast<int>(std::min<int64_t>(4096, i1 - i));
        for (int x = 0; x < n; ++x) {
          uint32_t h = static_cast<uint32_t>(i + x) * 2654435761u ^ salt;
          h ^= h >> 15;
          row[x] = static_cast<float>(h % 2001) / 1000.0f - 1.0f;
        }
        FromFloat32(dtype, row.data(), static_cast<size_t>(n), base + i * esize);
      }
    });
  };
  fill(k.get(), 0x1234u);
  fill(v.get(), 0x9876u);
  std::vector<int32_t> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  if (f.scatter) std::shuffle(table.begin(), table.end(), std::mt19937(7));
  std::vector<int32_t> kv_lens(f.seqs, f.context), q_lens(f.seqs, 1), q_offsets(f.seqs);
  std::iota(q_offsets.begin(), q_offsets.end(), 0);
  std::vector<float> qf(int64_t{f.seqs} * f.num_heads * f.head_dim);
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = std::sin(0.1f * static_cast<float>(i));
  std::vector<char> q(qf.size() * esize);
  FromFloat32(dtype, qf.data(), qf.size(), q.data());
  std::vector<float> out(int64_t{f.seqs} * f.num_heads * f.head_dim);
  std::vector<float> lse(int64_t{f.seqs} * f.num_heads);
  p.k_pages = k.get();
  p.v_pages = v.get();
  p.page_table = table.data();
  p.kv_lens = kv_lens.data();
  p.q_lens = q_lens.data();
  p.q_offsets = q_offsets.data();
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();

  const Stats t = Time(f.reps, backend.num_threads(), [&] {
    if (!backend.PagedAttention(p).ok()) std::abort();
  });
  // Bytes of K and V the step must read: every sequence's keys and values, once.
  const double gb = 2.0 * f.seqs * f.context * f.num_kv_heads * f.head_dim * esize / 1e9;
  std::printf(
      "decode dtype=%s isa=%s threads=%d seqs=%d context=%d hq=%d hkv=%d d=%d page=%d "
      "kv_gb=%.3f ms_median=%.2f ms_best=%.2f gbps_median=%.2f gbps_best=%.2f cpu_share=%.2f\n",
      std::string(DTypeName(dtype)).c_str(), backend.paged_kernel_name(), backend.num_threads(),
      f.seqs, f.context, f.num_heads, f.num_kv_heads, f.head_dim, f.page_size, gb, 1e3 * t.median,
      1e3 * t.best, gb / t.median, gb / t.best, t.cpu_share);
  std::fflush(stdout);
}

bool ParseFlag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (ParseFlag(argv[i], "--threads", &v)) {
      f.threads = std::stoi(v);
    } else if (ParseFlag(argv[i], "--reps", &v)) {
      f.reps = std::stoi(v);
    } else if (ParseFlag(argv[i], "--stream_mib", &v)) {
      f.stream_mib = std::stoll(v);
    } else if (ParseFlag(argv[i], "--seqs", &v)) {
      f.seqs = std::stoi(v);
    } else if (ParseFlag(argv[i], "--context", &v)) {
      f.context = std::stoi(v);
    } else if (ParseFlag(argv[i], "--num_heads", &v)) {
      f.num_heads = std::stoi(v);
    } else if (ParseFlag(argv[i], "--num_kv_heads", &v)) {
      f.num_kv_heads = std::stoi(v);
    } else if (ParseFlag(argv[i], "--head_dim", &v)) {
      f.head_dim = std::stoi(v);
    } else if (ParseFlag(argv[i], "--page_size", &v)) {
      f.page_size = std::stoi(v);
    } else if (ParseFlag(argv[i], "--scatter", &v)) {
      f.scatter = v != "0" && v != "false";
    } else if (ParseFlag(argv[i], "--dtypes", &v)) {
      f.dtypes = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = f.threads});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::printf("machine cpu=\"%s\" hardware_threads=%u\n", CpuModelName().c_str(),
              std::thread::hardware_concurrency());
  Stream(f, (*backend)->num_threads());
  for (const char* name : {"float16", "bfloat16", "float32"}) {
    if (f.dtypes.find(name) == std::string::npos) continue;
    const DType dtype = std::string(name) == "float16"    ? DType::kFloat16
                        : std::string(name) == "bfloat16" ? DType::kBFloat16
                                                          : DType::kFloat32;
    Decode(f, **backend, dtype);
  }
  // The bandwidth again after the kernels, to show how much the machine's load moved meanwhile.
  Stream(f, (*backend)->num_threads());
  return 0;
}

}  // namespace
}  // namespace attnserve::kernels::cpu

int main(int argc, char** argv) { return attnserve::kernels::cpu::Main(argc, argv); }
