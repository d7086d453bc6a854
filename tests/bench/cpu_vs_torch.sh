#!/usr/bin/env bash
# Benchmarks the CPU backend (float32 and bfloat16 requests) against OpenBLAS sgemm (the float32
# ceiling), oneDNN's bfloat16 matmul (the bfloat16 ceiling) and PyTorch's nn.MultiheadAttention
# (float32, and bfloat16 where it runs), side by side in one go, and prints the ratios and the
# instruction set each path used.
# Usage: tests/bench/cpu_vs_torch.sh [BUILD_DIR] [THREADS]
#   BUILD_DIR defaults to build-cpu (configured and built here if the benchmark is missing);
#   THREADS defaults to the number of CPUs. Installs Debian's python3-torch when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cpu}
THREADS=${2:-$(nproc)}

"$ROOT/tests/bench/ensure_torch.sh" cpu_vs_torch
if [[ ! -x $BUILD/tests/bench/cpu_backend_bench ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNSERVE_CUDA=OFF
fi
ninja -C "$BUILD" cpu_backend_bench >&2
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs," \
  "$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile' |
    xargs)", "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
# Which kernels oneDNN picked for the bfloat16 module's projections (its own report).
echo "oneDNN kernels of the bf16 module at (4, 1024, 512, 8):" \
  "$(ONEDNN_VERBOSE=1 "$BUILD/tests/bench/cpu_backend_bench" --threads="$THREADS" \
    --benchmark_filter='BM_MultiHeadBf16/4/1024/512/8/' --benchmark_min_time=0.01 2>/dev/null |
    awk -F, '$2 == "exec" { print $4 ":" $5 }' | sort | uniq -c | xargs)"
exec /usr/bin/python3 "$ROOT/tests/bench/cpu_vs_torch.py" "$BUILD/tests/bench/cpu_backend_bench" \
  "$THREADS"
