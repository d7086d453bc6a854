#!/usr/bin/env bash
# Benchmarks the CPU backend against OpenBLAS sgemm (the machine's practical ceiling) and
# PyTorch's nn.MultiheadAttention, side by side in one go, and prints the ratios.
# Usage: tests/bench/cpu_vs_torch.sh [BUILD_DIR] [THREADS]
#   BUILD_DIR defaults to build-cpu (configured and built here if the benchmark is missing);
#   THREADS defaults to the number of CPUs. Installs Debian's python3-torch when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cpu}
THREADS=${2:-$(nproc)}

if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "cpu_vs_torch: installing python3-torch" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch
fi
if [[ ! -x $BUILD/tests/bench/cpu_backend_bench ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNSERVE_CUDA=OFF
fi
ninja -C "$BUILD" cpu_backend_bench >&2
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs," \
  "$(grep -o -m1 -w avx512f /proc/cpuinfo || echo 'no avx512f')"
exec /usr/bin/python3 "$ROOT/tests/bench/cpu_vs_torch.py" "$BUILD/tests/bench/cpu_backend_bench" \
  "$THREADS"
