#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one call, well under ten minutes, compiling nothing:
#   1. nvidia-smi line (card, driver, clocks)                      -> $OUT/nvidia_smi.txt
#   2. GPU tests: cuda_backend_test (bounds vs float64 reference)  -> $OUT/gpu_tests.{json,log}
#   3. kernel sweep: flash_bench (fused vs cuBLAS naive)           -> $OUT/flash_bench.{json,log}
#   4. PyTorch SDPA in the same run, merged, table printed last    -> $OUT/gpu_results.json
# Results go to $OUT when set, else the current folder.
#
# Prepare here (no GPU needed):
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-cuda -j2 --target cuda_backend_test flash_bench
#   tests/gpu/make_bundle.sh build-cuda
# Run there (device tool, carry ["build-cuda/gpu_bundle"]):
#   bash tests/gpu/run_h200.sh build-cuda/gpu_bundle
set -uo pipefail
BUNDLE=${1:-build-cuda/gpu_bundle}
HERE=$(cd "$(dirname "$0")" && pwd)
RESULTS=${OUT:-.}
mkdir -p "$RESULTS"
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /usr/lib /opt \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$BUNDLE/lib:${CUBLAS_DIR:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "cuBLAS from: ${CUBLAS_DIR:-?}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv | tee "$RESULTS/nvidia_smi.txt"

echo "== GPU tests"
timeout 150 "$BUNDLE/cuda_backend_test" --gtest_output="json:$RESULTS/gpu_tests.json" \
  >"$RESULTS/gpu_tests.log" 2>&1
tests_rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:" "$RESULTS/gpu_tests.log" | head -40
echo "gpu tests exit code: $tests_rc"

echo "== kernel sweep"
timeout 280 "$BUNDLE/flash_bench" --benchmark_out="$RESULTS/flash_bench.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true >"$RESULTS/flash_bench.log" 2>&1
bench_rc=$?
echo "flash_bench exit code: $bench_rc"

echo "== SDPA comparison and summary"
PYTHONUNBUFFERED=1 timeout 120 python3 "$HERE/sdpa_compare.py" "$RESULTS/flash_bench.json" \
  "$RESULTS/gpu_results.json" "$RESULTS/gpu_tests.json"
echo "gpu tests exit code: $tests_rc; flash_bench exit code: $bench_rc"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
