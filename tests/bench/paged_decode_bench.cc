// The CPU decode kernel against the machine's memory bandwidth, in one process (issue 14's
// benchmark; tests/bench/decode_bench.sh runs it next to PyTorch and DECODE.md has the figures).
// Not a test.
//
// 1. Memory bandwidth: STREAM's triad a[i] = b[i] + s·c[i] and copy a[i] = b[i] over float
//    arrays of --stream_mib MiB each (far above the last-level cache), split evenly over
//    --threads threads, each thread touching its own part first. Bytes counted as STREAM does:
//    3 arrays (triad) or 2 (copy) x the array size per pass, write-allocate traffic not counted.
//    The arrays are in huge pages when --pages names huge (they can only speed the triad up).
// 2. The decode kernel (CpuBackend::PagedAttention, the backend's best ISA): --seqs sequences x
//    --context keys, one new query row each (q_len 1), Hq query heads over Hkv kv heads, D =
//    Dv, pages of --page_size tokens scattered through the pool. Bytes = every K and V element
//    of every sequence, read once per step. The K/V pool is allocated once per kind of memory
//    page in --pages (small: 4 KiB; huge: 2 MiB-aligned with MADV_HUGEPAGE, as the session
//    pool does), same contents and page table.
// 3. The kernel's reads alone ("pattern"): the same page runs the step reads (per sequence and
//    kv head, the K run and the V run of each page in key order: --page_size x D elements each,
//    scattered through the pool), summed as integers with no other arithmetic, the next page's
//    runs prefetched one page ahead (of 0, 1, 2 and 4 runs ahead, one was the best for a
//    scratch reader, DECODE.md). What memory gives this access pattern to a plain reader; not a
//    bound: the kernel's own prefetch runs further ahead and can beat it.
// 4. The kernel's arithmetic alone (--cached_pages=N): every page table entry taken modulo N, so
//    that all the sequences read the same N pages, which stay in the caches when N pages of K
//    and V fit them (N = 8: 4 MiB at the defaults in float16). The same bytes are counted; the
//    rate is then what the kernel computes per second, its ceiling whatever memory does.
// The machine is shared, so the runs interleave: a round is one step of each kind, one pattern
// read of each kind, then one triad; --reps rounds after a warm-up one. Per kind: the median and
// the best step; the ratio to the triad as the median of the rounds' ratios (each of two runs
// seconds apart), as best / best, and per CPU-second (each side's GB/s divided by the share of the
// cores it got).
//
// Output: one line per figure, "name key=value ...", for decode_bench.sh to collect; the first
// line names the machine and its load average, the last the load average again.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
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
  int page_size = 128;  // the server's default (--session_page_tokens)
  std::string dtypes = "float16,bfloat16,float32";
  std::string pages = "small,huge";  // K/V and STREAM arrays in 4 KiB pages, 2 MiB pages or both
  bool scatter = true;   // pages in a random order (false: each sequence's pages in order)
  int cached_pages = 0;  // > 0: every sequence reads pages [0, cached_pages) (item 4 above)
};

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One timed side of a pair: wall seconds of each rep and the share of the cores the process got
// over all of them (CPU seconds / (wall seconds x threads); well below 1 when other processes
// held the cores).
struct Side {
  std::vector<double> seconds;
  double cpu = 0, wall = 0;

  double Share(int threads) const { return cpu / (wall * threads); }
  double Best() const { return *std::min_element(seconds.begin(), seconds.end()); }
};

void TimeOnce(const std::function<void()>& fn, Side* side) {
  const double c0 = CpuSeconds(), t0 = Seconds();
  fn();
  const double t = Seconds() - t0;
  side->cpu += CpuSeconds() - c0;
  side->wall += t;
  side->seconds.push_back(t);
}

// Runs fns[0], fns[1], ... in turn, `reps` rounds after one warm-up round, so that all see the
// same load on a shared machine: a ratio of two is then taken from runs seconds apart, not
// minutes. sides[i] gets the times of fns[i].
void RoundRobin(int reps, const std::vector<std::function<void()>>& fns, std::vector<Side>* sides) {
  sides->assign(fns.size(), Side{});
  for (const auto& fn : fns) fn();
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) TimeOnce(fns[i], &(*sides)[i]);
  }
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

// The 1, 5 and 15 minute load averages.
std::string LoadAverage() {
  char buf[128] = {};
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  const bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return "?";
  std::string s(buf);
  size_t cut = 0;
  for (int i = 0; i < 3 && cut != std::string::npos; ++i) cut = s.find(' ', cut + 1);
  return s.substr(0, cut);
}

// Memory for the arrays and the K/V pool: mmap'd, 2 MiB-aligned, and with `huge` advised
// MADV_HUGEPAGE (transparent huge pages; the kernel may still give small pages when it has no
// free 2 MiB blocks: HugeShare() reports what it got).
constexpr int64_t kHugePage = int64_t{2} << 20;
struct Unmap {
  int64_t bytes;
  void operator()(void* p) const { munmap(p, static_cast<size_t>(bytes)); }
};
template <typename T>
std::unique_ptr<T[], Unmap> Allocate(int64_t n, bool huge) {
  const int64_t bytes =
      (n * static_cast<int64_t>(sizeof(T)) + kHugePage - 1) / kHugePage * kHugePage;
  // Over-reserve by one huge page, then trim both ends to a 2 MiB-aligned range.
  char* raw = static_cast<char*>(mmap(nullptr, static_cast<size_t>(bytes + kHugePage),
                                      PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (raw == MAP_FAILED) std::abort();
  const uintptr_t a =
      (reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  char* p = reinterpret_cast<char*>(a);
  if (p > raw) munmap(raw, static_cast<size_t>(p - raw));
  if (p + bytes < raw + bytes + kHugePage) {
    munmap(p + bytes, static_cast<size_t>(raw + bytes + kHugePage - (p + bytes)));
  }
  madvise(p, static_cast<size_t>(bytes), huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return std::unique_ptr<T[], Unmap>(reinterpret_cast<T*>(p), Unmap{bytes});
}

// The share of [p, p + bytes) backed by huge pages, from /proc/self/smaps (0 when unknown).
double HugeShare(const void* p, int64_t bytes) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + static_cast<uintptr_t>(bytes);
  char line[512];
  bool in = false;
  int64_t huge_kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long a, b;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2 &&
        std::strchr(line, '-') < std::strchr(line, ' ')) {
      in = a < hi && b > lo;
      continue;
    }
    long kib;
    if (in && std::sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) huge_kib += kib;
  }
  std::fclose(f);
  return static_cast<double>(huge_kib) * 1024.0 / static_cast<double>(bytes);
}

const char* PagesName(bool huge) { return huge ? "huge" : "small"; }

// STREAM's arrays, split evenly over `threads` threads, each thread touching its own part first.
class StreamArrays {
 public:
  StreamArrays(int64_t mib, int threads, bool huge)
      : huge_(huge),
        n_(mib * 1024 * 1024 / static_cast<int64_t>(sizeof(float))),
        threads_(threads),
        a_(Allocate<float>(n_, huge)),
        b_(Allocate<float>(n_, huge)),
        c_(Allocate<float>(n_, huge)) {
    float *pa = a_.get(), *pb = b_.get(), *pc = c_.get();
    Parallel(threads_, n_, [=](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pa[i] = 0.0f, pb[i] = 1.0f, pc[i] = 2.0f;
    });
  }
  // Bytes one pass moves, counted as STREAM does (write-allocate traffic not counted).
  double TriadGb() const { return 3.0 * n_ * sizeof(float) / 1e9; }
  double CopyGb() const { return 2.0 * n_ * sizeof(float) / 1e9; }
  const char* pages() const { return PagesName(huge_); }
  double HugeShare() const { return ::attnserve::kernels::cpu::HugeShare(a_.get(), n_ * 4); }

  void Triad() {
    float *pa = a_.get(), *pb = b_.get(), *pc = c_.get();
    const float s = 3.0f;
    Parallel(threads_, n_, [=](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pa[i] = pb[i] + s * pc[i];
    });
  }
  void Copy() {
    float *pa = a_.get(), *pb = b_.get();
    Parallel(threads_, n_, [=](int64_t i0, int64_t i1) {
      std::memcpy(pa + i0, pb + i0, (i1 - i0) * sizeof(float));
    });
  }

 private:
  bool huge_;
  int64_t n_;
  int threads_;
  std::unique_ptr<float[], Unmap> a_, b_, c_;
};

// Triad and copy, alternately.
void Stream(const Flags& f, StreamArrays& arrays, int threads) {
  std::vector<Side> sides;
  RoundRobin(f.reps, {[&] { arrays.Triad(); }, [&] { arrays.Copy(); }}, &sides);
  for (const auto& [name, side, gb] : {std::tuple{"stream_triad", &sides[0], arrays.TriadGb()},
                                       std::tuple{"stream_copy", &sides[1], arrays.CopyGb()}}) {
    std::printf(
        "%s threads=%d array_mib=%lld pages=%s huge_share=%.2f gbps_median=%.2f gbps_best=%.2f "
        "cpu_share=%.2f\n",
        name, threads, static_cast<long long>(f.stream_mib), arrays.pages(), arrays.HugeShare(),
        gb / Median(side->seconds), gb / side->Best(), side->Share(threads));
  }
  std::fflush(stdout);
}

// Reads every sequence's K and V page runs of each kv head in key order (what the decode step
// reads, in its order, without its arithmetic), the next page's runs prefetched one page ahead;
// (sequence, kv head) pairs split evenly over `threads` threads. Returns a sum of what was read,
// so that nothing is optimised away.
uint64_t ReadPattern(int threads, const char* k, const char* v, const std::vector<int32_t>& table,
                     int pages_per_seq, int num_kv_heads, int64_t run_bytes, int64_t pairs) {
  // 16-byte vectors of integers (GCC's vector extension): two loads per cycle keep far ahead of
  // memory without per-ISA code here.
  using U64x2 = uint64_t __attribute__((vector_size(16)));
  const int64_t page_bytes = run_bytes * num_kv_heads;
  std::atomic<uint64_t> sum{0};
  Parallel(threads, pairs, [&](int64_t w0, int64_t w1) {
    U64x2 acc[4] = {};
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t head = w % num_kv_heads;
      const int32_t* row = table.data() + w / num_kv_heads * pages_per_seq;
      for (int pg = 0; pg < pages_per_seq; ++pg) {
        // The next page's run of the same array, one line per line read (a burst of
        // prefetches would fill the core's miss buffers).
        const int64_t at = row[pg] * page_bytes + head * run_bytes;
        const int64_t next =
            pg + 1 < pages_per_seq ? row[pg + 1] * page_bytes + head * run_bytes : -1;
        for (const char* base : {k, v}) {
          for (int64_t b = 0; b + 64 <= run_bytes; b += 64) {
            if (next >= 0) __builtin_prefetch(base + next + b, 0, 1);
            for (int x = 0; x < 4; ++x) {
              U64x2 word;
              std::memcpy(&word, base + at + b + 16 * x, sizeof(word));
              acc[x] += word;
            }
          }
        }
      }
    }
    const U64x2 total = acc[0] + acc[1] + acc[2] + acc[3];
    sum.fetch_add(total[0] + total[1], std::memory_order_relaxed);
  });
  return sum.load();
}

// The decode step over K/V in small pages and/or in huge pages (same contents, same page
// table), and the pattern read of each, each round ending with the triad.
void Decode(const Flags& f, CpuBackend& backend, StreamArrays& arrays, DType dtype) {
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
  p.q_dtype = dtype;
  p.total_q = f.seqs;
  p.scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  const int esize = static_cast<int>(DTypeSize(dtype));
  const int64_t elems = num_pages * p.k_page_stride();
  std::vector<bool> kinds;
  for (const bool huge : {false, true}) {
    if (f.pages.find(PagesName(huge)) != std::string::npos) kinds.push_back(huge);
  }
  std::vector<std::unique_ptr<char[], Unmap>> ks, vs;
  for (const bool huge : kinds) {
    ks.push_back(Allocate<char>(elems * esize, huge));
    vs.push_back(Allocate<char>(elems * esize, huge));
  }
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
  for (size_t i = 0; i < kinds.size(); ++i) {
    fill(ks[i].get(), 0x1234u);
    fill(vs[i].get(), 0x9876u);
  }
  std::vector<int32_t> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  if (f.scatter) std::shuffle(table.begin(), table.end(), std::mt19937(7));
  if (f.cached_pages > 0) {
    for (int32_t& page : table) page %= f.cached_pages;
  }
  std::vector<int32_t> kv_lens(f.seqs, f.context), q_lens(f.seqs, 1), q_offsets(f.seqs);
  std::iota(q_offsets.begin(), q_offsets.end(), 0);
  std::vector<float> qf(int64_t{f.seqs} * f.num_heads * f.head_dim);
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = std::sin(0.1f * static_cast<float>(i));
  std::vector<char> q(qf.size() * esize);
  FromFloat32(dtype, qf.data(), qf.size(), q.data());
  std::vector<float> out(int64_t{f.seqs} * f.num_heads * f.head_dim);
  std::vector<float> lse(int64_t{f.seqs} * f.num_heads);
  p.page_table = table.data();
  p.kv_lens = kv_lens.data();
  p.q_lens = q_lens.data();
  p.q_offsets = q_offsets.data();
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();

  // Each kind's kernel run, then the triad, in turn: each pair's ratio compares two runs
  // seconds apart.
  std::vector<std::function<void()>> fns;
  for (size_t i = 0; i < kinds.size(); ++i) {
    fns.push_back([&, i] {
      PagedAttentionParams pi = p;
      pi.k_pages = ks[i].get();
      pi.v_pages = vs[i].get();
      if (!backend.PagedAttention(pi).ok()) std::abort();
    });
  }
  const int64_t run_bytes = int64_t{f.page_size} * f.head_dim * esize;
  uint64_t pattern_sum = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    fns.push_back([&, i] {
      pattern_sum +=
          ReadPattern(backend.num_threads(), ks[i].get(), vs[i].get(), table, pages_per_seq,
                      f.num_kv_heads, run_bytes, int64_t{f.seqs} * f.num_kv_heads);
    });
  }
  fns.push_back([&] { arrays.Triad(); });
  std::vector<Side> sides;
  RoundRobin(f.reps, fns, &sides);
  const Side& triad = sides.back();
  // Bytes of K and V the step must read: every sequence's keys and values, once.
  const double gb = 2.0 * f.seqs * f.context * f.num_kv_heads * f.head_dim * esize / 1e9;
  const int threads = backend.num_threads();
  const double t_gb = arrays.TriadGb();
  const double t_gbps = t_gb / Median(triad.seconds);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const Side& kernel = sides[i];
    const Side& pattern = sides[kinds.size() + i];
    std::vector<double> ratios, pattern_ratios;
    for (int r = 0; r < f.reps; ++r) {
      ratios.push_back((gb / kernel.seconds[r]) / (t_gb / triad.seconds[r]));
      pattern_ratios.push_back(pattern.seconds[r] / kernel.seconds[r]);
    }
    const double k_gbps = gb / Median(kernel.seconds);
    std::printf(
        "decode dtype=%s isa=%s threads=%d seqs=%d context=%d hq=%d hkv=%d d=%d page=%d "
        "cached_pages=%d pages=%s huge_share=%.2f kv_gb=%.3f ms_median=%.2f ms_best=%.2f "
        "gbps_median=%.2f "
        "gbps_best=%.2f cpu_share=%.2f triad_gbps_median=%.2f triad_gbps_best=%.2f "
        "triad_cpu_share=%.2f ratio_median=%.2f ratio_best=%.2f ratio_per_cpu=%.2f "
        "pattern_gbps_median=%.2f pattern_gbps_best=%.2f pattern_cpu_share=%.2f "
        "pattern_over_triad=%.2f kernel_over_pattern=%.2f\n",
        std::string(DTypeName(dtype)).c_str(), backend.paged_kernel_name(), threads, f.seqs,
        f.context, f.num_heads, f.num_kv_heads, f.head_dim, f.page_size, f.cached_pages,
        PagesName(kinds[i]), HugeShare(ks[i].get(), elems * esize), gb,
        1e3 * Median(kernel.seconds), 1e3 * kernel.Best(), k_gbps, gb / kernel.Best(),
        kernel.Share(threads), t_gbps, t_gb / triad.Best(), triad.Share(threads), Median(ratios),
        (gb / kernel.Best()) / (t_gb / triad.Best()),
        (k_gbps / kernel.Share(threads)) / (t_gbps / triad.Share(threads)),
        gb / Median(pattern.seconds), gb / pattern.Best(), pattern.Share(threads),
        (gb / Median(pattern.seconds)) / t_gbps, Median(pattern_ratios));
  }
  if (pattern_sum == 1) std::printf("\n");  // keeps the reads
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
    } else if (ParseFlag(argv[i], "--cached_pages", &v)) {
      f.cached_pages = std::stoi(v);
    } else if (ParseFlag(argv[i], "--dtypes", &v)) {
      f.dtypes = v;
    } else if (ParseFlag(argv[i], "--pages", &v)) {
      f.pages = v;
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
  std::printf("machine cpu=\"%s\" hardware_threads=%u loadavg=\"%s\"\n", CpuModelName().c_str(),
              std::thread::hardware_concurrency(), LoadAverage().c_str());
  const int threads = (*backend)->num_threads();
  // STREAM's arrays in huge pages when those are measured (huge pages only help the triad,
  // so the ratios cannot gain from a slowed triad).
  StreamArrays arrays(f.stream_mib, threads, f.pages.find("huge") != std::string::npos);
  Stream(f, arrays, threads);
  for (const char* name : {"float16", "bfloat16", "float32"}) {
    if (f.dtypes.find(name) == std::string::npos) continue;
    const DType dtype = std::string(name) == "float16"    ? DType::kFloat16
                        : std::string(name) == "bfloat16" ? DType::kBFloat16
                                                          : DType::kFloat32;
    Decode(f, **backend, arrays, dtype);
  }
  Stream(f, arrays, threads);
  std::printf("end loadavg=\"%s\"\n", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace attnserve::kernels::cpu

int main(int argc, char** argv) { return attnserve::kernels::cpu::Main(argc, argv); }
