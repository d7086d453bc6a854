// The cost of a sliding window and of linear attention against full causal attention over the
// sequence length, on the CPU backend (issue 32; figures in tests/bench/KINDS.md).
// Self-attention of one sequence, float32, Hq = Hkv = heads, D = Dv = 64: for each L, full
// causal attention (up to --max_full_len), causal attention in a window of --window keys
// (left = window - 1, right = 0) and causal linear attention (elu + 1), the best of --reps calls
// each, alternating, all in one process. Prints one line per L: the times, full / window, and
// the times per query row (what a window and linear attention keep flat).
//
//   build/tests/bench/attention_kinds_bench [--threads=2] [--heads=1] [--window=4096]
//       [--min_len=1024] [--max_len=262144] [--max_full_len=65536] [--reps=3]
//
// Not a test: nothing here asserts a time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"

namespace {

using attnserve::kernels::AttentionParams;
using attnserve::kernels::cpu::CpuBackend;
using attnserve::kernels::cpu::CpuBackendOptions;

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return fallback;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = static_cast<int>(Flag(argc, argv, "threads", 2));
  const int heads = static_cast<int>(Flag(argc, argv, "heads", 1));
  const int window = static_cast<int>(Flag(argc, argv, "window", 4096));
  const int64_t min_len = Flag(argc, argv, "min_len", 1024);
  const int64_t max_len = Flag(argc, argv, "max_len", 262144);
  const int64_t max_full_len = Flag(argc, argv, "max_full_len", 65536);
  const int reps = static_cast<int>(Flag(argc, argv, "reps", 3));
  constexpr int kD = 64;

  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = threads});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  std::printf("# %s, %d threads, kernel %s; heads %d, D 64, float32, causal; window %d keys\n",
              CpuModel().c_str(), threads, attnserve::kernels::cpu::IsaName((*backend)->isa()),
              heads, window);
  std::printf("%8s %12s %12s %12s %8s %14s %14s %14s\n", "L", "full_ms", "window_ms", "linear_ms",
              "ratio", "full_us/row", "window_us/row", "linear_us/row");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (int64_t len = min_len; len <= max_len; len *= 2) {
    const int l = static_cast<int>(len);
    std::vector<float> q(size_t(heads) * l * kD), k(q.size()), v(q.size()), out(q.size());
    for (float* x : {q.data(), k.data(), v.data()}) {
      for (size_t i = 0; i < q.size(); ++i) x[i] = normal(rng);
    }
    AttentionParams p;
    p.batch = 1;
    p.num_heads = p.num_kv_heads = heads;
    p.q_len = p.kv_len = l;
    p.head_dim = p.v_head_dim = kD;
    const int64_t head_stride = int64_t{l} * kD;
    p.q = {q.data(), heads * head_stride, head_stride, kD};
    p.k = {k.data(), heads * head_stride, head_stride, kD};
    p.v = {v.data(), heads * head_stride, head_stride, kD};
    p.out = {out.data(), heads * head_stride, head_stride, kD};
    p.causal = true;
    p.scale = 0.125f;
    AttentionParams windowed = p;
    windowed.mods.window_left = window - 1;
    windowed.mods.window_right = 0;
    AttentionParams linear = p;
    linear.kind = attnserve::kernels::AttentionKind::kLinear;
    const bool full = len <= max_full_len;
    double best[3] = {1e30, 1e30, 1e30};  // full, window, linear
    const AttentionParams* ways[3] = {&p, &windowed, &linear};
    for (int r = 0; r < reps; ++r) {
      for (int way = 0; way < 3; ++way) {
        if (way == 0 && !full) continue;
        const auto t0 = std::chrono::steady_clock::now();
        if (!(*backend)->Attend({*ways[way]}).ok()) return 1;
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        best[way] = std::min(best[way], ms);
      }
    }
    if (full) {
      std::printf("%8d %12.2f %12.2f %12.2f %8.2f %14.3f %14.3f %14.3f\n", l, best[0], best[1],
                  best[2], best[0] / best[1], 1e3 * best[0] / l, 1e3 * best[1] / l,
                  1e3 * best[2] / l);
    } else {
      std::printf("%8d %12s %12.2f %12.2f %8s %14s %14.3f %14.3f\n", l, "-", best[1], best[2], "-",
                  "-", 1e3 * best[1] / l, 1e3 * best[2] / l);
    }
    std::fflush(stdout);
  }
  return 0;
}
