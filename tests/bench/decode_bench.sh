#!/usr/bin/env bash
# The CPU decode kernel against the machine's memory bandwidth and PyTorch, side by side (issue
# 14's benchmark; figures in tests/bench/DECODE.md). Each round runs, one after another:
# paged_decode_bench (STREAM triad and copy, the decode kernel for float16, bfloat16 and float32
# caches, STREAM again) and decode_torch.py (PyTorch over a dense cache of the same shape).
# The machine is shared: rounds repeat the whole set so the spread shows, and the summary gives
# each round's ratios from figures measured minutes apart, never across rounds.
# Usage: tests/bench/decode_bench.sh [BUILD_DIR] [THREADS] [ROUNDS] [REPS]
#   BUILD_DIR defaults to build (configured with ATTNSERVE_BUILD_BENCHMARKS=ON and built here
#   when the binary is missing); THREADS to the number of CPUs; ROUNDS 3; REPS (timed steps per
#   figure) 5.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
THREADS=${2:-$(nproc)}
ROUNDS=${3:-3}
REPS=${4:-5}

if [[ ! -x $BUILD/tests/bench/paged_decode_bench ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTNSERVE_BUILD_BENCHMARKS=ON >&2
  cmake --build "$BUILD" --target paged_decode_bench >&2
fi
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs," \
  "$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' | xargs)," \
  "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)," \
  "L3 $(lscpu | awk -F: '/L3 cache/ {gsub(/^ +/, "", $2); print $2}')"
for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r: $(date -u +%H:%M:%S) load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
  "$BUILD/tests/bench/paged_decode_bench" --threads="$THREADS" --reps="$REPS" | tee -a "$LOG"
  /usr/bin/python3 "$ROOT/tests/bench/decode_torch.py" "$THREADS" "$REPS" | tee -a "$LOG"
done
/usr/bin/python3 - "$LOG" <<'PY'
import re, sys
rounds, cur = [], None
for line in open(sys.argv[1]):
    if line.startswith("round "):
        cur = {"triad": [], "copy": [], "decode": {}, "torch": {}, "share": []}
        rounds.append(cur)
        continue
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    if line.startswith("stream_triad"):
        cur["triad"].append(float(kv["gbps_median"]))
    elif line.startswith("stream_copy"):
        cur["copy"].append(float(kv["gbps_median"]))
    elif line.startswith("decode "):
        cur["decode"][kv["dtype"].lower()] = (float(kv["gbps_median"]), kv["isa"], float(kv["cpu_share"]))
    elif line.startswith("torch dtype") and "gbps_median" in kv:
        cur["torch"][kv["dtype"]] = (float(kv["gbps_median"]), kv["mode"])
print("\nsummary (medians; triad = mean of the runs before and after the kernels)")
print("round dtype     kernel      GB/s  cpu_share  triad GB/s  kernel/triad  torch GB/s (mode)  kernel/torch")
for i, r in enumerate(rounds, 1):
    triad = sum(r["triad"]) / len(r["triad"])
    for dt, (g, isa, share) in r["decode"].items():
        t = r["torch"].get(dt)
        tor = f"{t[0]:6.2f} ({t[1]})" if t else "   n/a"
        ratio = f"{g / t[0]:6.1f}x" if t else "   n/a"
        print(f"{i:5d} {dt:9s} {isa:11s} {g:5.2f}  {share:9.2f}  {triad:10.2f}  {g / triad:11.0%}  {tor:18s} {ratio}")
PY
