#!/usr/bin/env bash
# The GPU check of the CUDA backend in one call, within 5 minutes on an H200, compiling nothing.
# Every step writes its results as they come (into $OUT when set, else the current folder), so a
# run cut short still leaves every finished figure.
#
#   step                                                     output                   limit
#   0. ldd of the two binaries: every library found          ldd.txt                  < 1 s
#   1. nvidia-smi line (card, driver, clocks)                nvidia_smi.txt           ~ 1 s
#   2. GPU tests: cuda_backend_test vs the float64 reference gpu_tests.{log,json}     50 s
#   3. kernel sweep: flash_bench (fused vs cuBLAS naive)     flash_bench.{jsonl,log}  115 s
#   4. PyTorch SDPA on the finished shapes, merged           gpu_results.json         55 s
#   5. compute-sanitizer memcheck and racecheck on           sanitizer_*.log          25 s each
#      flash_bench --smoke (every kernel path, small)
#   6. compute-sanitizer memcheck on the paged attention     sanitizer_paged.log      20 s
#      GPU tests (CudaPagedAttentionTest, FLOAT16)
#   worst case: 1 + 1 + 50 + 115 + 55 + 25 + 25 + 20 = 292 s, under 300 s.
#
# Why the sweep fits (flash_bench.cu): inputs are generated once, on the device (q, k, v of
# 4096 tokens x 16 heads x 256 per dtype: 6 fills of 16.8M numbers, milliseconds; the previous
# sweep drew ~100M host random numbers per Google Benchmark call, 0.46 s per 33.5M here, about
# 330 s in all). Each shape: 1 warm-up + 3 timed calls (fixed). FLOPs per call
# 4 * 4096 * 16 * L * d (halved for causal): L4096 d128 1.37e11, d64 6.9e10; L1024 d128 3.4e10;
# L2048 d128 6.9e10; the other tensor-core dims at L1024 (96, 256, 32, 160, 192) 2.0e11
# together; the generic kernel's d100 L1024 2.7e10; the two causal windows of 1024 keys at L4096
# (d128, d64: the kMods kernel) 1.2e11 together. (Earlier versions of this note wrote these
# 1000x too large; the limits below were kept.) Over the 23 shapes, times 4 calls:
#   tensor-core flash  3.7e12 FLOPs   at a floor of  50 TFLOP/s: 0.1 s
#   cuBLAS naive       8.2e11         at a floor of  20 TFLOP/s: 0.04 s
#   generic kernel     1.1e11         at a floor of   2 TFLOP/s: 0.05 s
# so the sweep's time is start-up, input generation and launch overhead (seconds);
# flash_bench still starts no new shape after 100 s (--budget_s) and orders the shapes by value
# (the fp16/bf16 d128 L4096 figures first, the generic kernel last), and the timeout is 115 s.
# SDPA repeats the flash shapes with 1 warm-up + 3 timed calls (about 4e12 FLOPs, under a
# second at 100 TFLOP/s) plus about 15 s of torch start-up. After the sweep (budget or not) a
# decode step, the fused kernel against the decode path (16 sequences x 4096 keys, GQA 8, d128:
# 33.5 MB of K and V per call, 2 x 11 calls): well under a second. Then linear attention's
# kernel (causal, elu + 1, d 64, float32), as 16 heads of L 4096 and as 1 head of L 65536,
# 1 warm-up + 3 calls each: its recurrence takes the keys one at a time (never measured on a
# device; even at 2 µs a key, 65536 keys x 4 calls is 0.5 s).
# compute-sanitizer runs flash_bench --smoke: 48 fused (hdim 32, 64, 96, 128, 256 and the
# generic d100, fp16 and bf16, 4 variants, the last with ScoreMods), 12 naive, 6 decode and 3
# linear-attention launches on at most 330 keys; 25 s each leaves a 30x slowdown room over the earlier 18 + 6 + 6. Step 2 includes the paged attention of
# the decode sessions (CudaPagedAttentionTest: 6 small calls of at most 1300 keys, 8 heads,
# d128, against the float64 reference, bitwise batch invariance, and the device page store:
# WriteRows' scatter kernel, pages read back, PagedAttention on device pages bitwise equal to
# the call on host pages); step 6 repeats its FLOAT16 half under memcheck (a few backend calls
# and one scatter per pool; most of the 20 s is the CUDA and cuBLAS start-up).
#
# Prepare here (no GPU needed):
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-cuda -j2 --target cuda_backend_test flash_bench
#   tests/gpu/make_bundle.sh build-cuda
# Run there (device tool, carry ["build-cuda/gpu_bundle"], timeout_s 330):
#   bash tests/gpu/run_h200.sh build-cuda/gpu_bundle
set -uo pipefail
BUNDLE=${1:-build-cuda/gpu_bundle}
HERE=$(cd "$(dirname "$0")" && pwd)
RESULTS=${OUT:-.}
mkdir -p "$RESULTS"
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /usr/lib /opt \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$BUNDLE/lib:${CUBLAS_DIR:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

echo "== 0. ldd"
ldd "$BUNDLE/cuda_backend_test" "$BUNDLE/flash_bench" > "$RESULTS/ldd.txt" 2>&1
if grep -q "not found" "$RESULTS/ldd.txt"; then
  grep "not found" "$RESULTS/ldd.txt"
  echo "missing libraries (ldd.txt); nothing else would run"
  exit 1
fi
echo "all libraries found (cuBLAS from ${CUBLAS_DIR:-?})"

echo "== 1. nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv | tee "$RESULTS/nvidia_smi.txt"

echo "== 2. GPU tests"
timeout 50 "$BUNDLE/cuda_backend_test" --gtest_output="json:$RESULTS/gpu_tests.json" \
  > "$RESULTS/gpu_tests.log" 2>&1
tests_rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:" "$RESULTS/gpu_tests.log" | head -40
echo "gpu tests exit code: $tests_rc (124: cut at 50 s; the log has every finished test)"

echo "== 3. kernel sweep"
rm -f "$RESULTS/flash_bench.jsonl"
timeout 115 "$BUNDLE/flash_bench" --out="$RESULTS/flash_bench.jsonl" --budget_s=100 \
  2>&1 | tee "$RESULTS/flash_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "flash_bench exit code: $bench_rc"

echo "== 4. SDPA comparison and summary"
PYTHONUNBUFFERED=1 timeout 55 python3 "$HERE/sdpa_compare.py" "$RESULTS/flash_bench.jsonl" \
  "$RESULTS/gpu_results.json" "$RESULTS/gpu_tests.json"
echo "sdpa_compare exit code: $?"

echo "== 5. compute-sanitizer"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ -n "$SANITIZER" ]]; then
  for tool in memcheck racecheck; do
    timeout 25 "$SANITIZER" --tool "$tool" --error-exitcode 3 "$BUNDLE/flash_bench" --smoke \
      > "$RESULTS/sanitizer_$tool.log" 2>&1
    echo "$tool exit code: $? (0 clean, 3 errors found, 124 cut at 25 s)"
    tail -n 3 "$RESULTS/sanitizer_$tool.log"
  done
  echo "== 6. compute-sanitizer memcheck, paged attention"
  timeout 20 "$SANITIZER" --tool memcheck --error-exitcode 3 "$BUNDLE/cuda_backend_test" \
    --gtest_filter='*CudaPagedAttentionTest*/FLOAT16' > "$RESULTS/sanitizer_paged.log" 2>&1
  echo "paged memcheck exit code: $? (0 clean, 3 errors found, 124 cut at 20 s)"
  tail -n 3 "$RESULTS/sanitizer_paged.log"
else
  echo "compute-sanitizer not found; skipped" | tee "$RESULTS/sanitizer_memcheck.log"
fi
echo "gpu tests exit code: $tests_rc; flash_bench exit code: $bench_rc"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
