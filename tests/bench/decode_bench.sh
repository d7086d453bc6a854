#!/usr/bin/env bash
# The CPU decode kernel against the machine's memory bandwidth and PyTorch, side by side (issue
# 14's benchmark; figures in tests/bench/DECODE.md). Each round runs, one after another:
# paged_decode_bench (STREAM triad and copy; the decode kernel for float16, bfloat16 and float32
# caches, over K/V in small and in huge memory pages, each step followed by a triad so that
# every ratio is of two runs seconds apart, and the same page runs read without arithmetic;
# STREAM again) and decode_torch.py (PyTorch over a
# dense cache of the same shape). The machine is shared: rounds repeat the whole set so the
# spread shows, and the summary gives each round's ratios and their spread.
# Usage: tests/bench/decode_bench.sh [BUILD_DIR] [THREADS] [ROUNDS] [REPS]
#   BUILD_DIR defaults to build (configured with ATTNSERVE_BUILD_BENCHMARKS=ON and built here
#   when the binary is missing); THREADS to the number of CPUs; ROUNDS 3; REPS (timed steps per
#   figure) 5. DECODE_BENCH_LOG=path keeps the raw output there. Installs Debian's python3-torch
#   when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
THREADS=${2:-$(nproc)}
ROUNDS=${3:-3}
REPS=${4:-5}

"$ROOT/tests/bench/ensure_torch.sh" decode_bench
if [[ ! -x $BUILD/tests/bench/paged_decode_bench ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTNSERVE_BUILD_BENCHMARKS=ON >&2
  cmake --build "$BUILD" --target paged_decode_bench >&2
fi
if [[ -n ${DECODE_BENCH_LOG:-} ]]; then
  LOG=$DECODE_BENCH_LOG
  : >"$LOG"
else
  LOG=$(mktemp)
  trap 'rm -f "$LOG"' EXIT
fi
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
        cur = {"load": line.split("load average ")[1].strip(), "decode": [], "torch": {}}
        rounds.append(cur)
        continue
    kv = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
    if line.startswith("end loadavg"):
        cur["load_end"] = kv["loadavg"].strip('"')
    elif line.startswith("decode "):
        cur["decode"].append(kv)
    elif line.startswith("torch dtype") and "gbps_median" in kv:
        cur["torch"][kv["dtype"].lower()] = (float(kv["gbps_median"]), kv["mode"])
print("\nsummary: K/V GB/s of the kernel (median step) against the triad run between its steps;")
print("ratio = median over the steps of kernel/triad, best = best step / best triad, per_cpu = each")
print("side's GB/s over its share of the cores; pattern = the same page runs read with no arithmetic")
print("(k/pat: median of kernel/pattern per step); load = load average at the start and end")
print("round dtype     pages  kernel GB/s  triad GB/s  ratio  best  per_cpu  cpu_share  pattern GB/s  k/pat  torch GB/s (mode)        kernel/torch  load")
spread = {}
for i, r in enumerate(rounds, 1):
    for d in r["decode"]:
        dt, pages = d["dtype"].lower(), d["pages"]
        g = float(d["gbps_median"])
        t = r["torch"].get(dt)
        tor = f"{t[0]:6.2f} ({t[1]})" if t else "   n/a"
        vs = f"{g / t[0]:6.1f}x" if t else "   n/a"
        ratio = float(d["ratio_median"])
        spread.setdefault((dt, pages), []).append(ratio)
        print(f"{i:5d} {dt:9s} {pages:5s}  {g:11.2f}  {float(d['triad_gbps_median']):10.2f}  {ratio:5.2f}"
              f"  {float(d['ratio_best']):4.2f}  {float(d['ratio_per_cpu']):7.2f}  {float(d['cpu_share']):9.2f}"
              f"  {float(d['pattern_gbps_median']):12.2f}  {float(d['kernel_over_pattern']):5.2f}"
              f"  {tor:24s} {vs:12s}  {r['load'].split()[0]} -> {r.get('load_end', '?').split()[0]}")
print("\nspread of the ratio (median kernel/triad) over the rounds")
for (dt, pages), v in spread.items():
    print(f"  {dt:9s} {pages:5s}  min {min(v):.2f}  max {max(v):.2f}  rounds {len(v)}")
PY
