#!/bin/bash
# Decode steps of one linear-attention session against its length, beside softmax sessions at
# the lengths they can hold (tests/bench/KINDS.md has the figures): per context length, a fresh
# session prefilled with L tokens (attnserve-bench --prefill, in extends of 8192), then one
# caller's closed loop of single-token steps ([1 token, 8 query heads, 64], 2 kv heads, float16)
# for DURATION_S seconds. Printed per run: steps/s, client p50/p99, the server's own compute per
# step, the server's CPU time (user + system, /proc/PID/stat) and minor page faults per step over
# the loop, the session's pages and the server's RSS after it.
#
#   tests/bench/linear_sessions.sh [BUILD_DIR]
# Environment: DURATION_S (default 3), LINEAR_LENGTHS (default "1024 65536 1048576"),
# SOFTMAX_LENGTHS (default "1024 60000": a softmax session holds at most --max_sequence_length
# tokens, 65536 by default). Not run by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
bench=$build/client/bench/attnserve-bench
duration=${DURATION_S:-3}
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
"$build/server/attnserve" --listen=127.0.0.1:0 --port_file="$tmp/port" --metrics_address= \
  --backend=cpu --backend_threads=2 --session_pool_bytes=2147483648 > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1200); do [[ -s $tmp/port ]] && break; sleep 0.05; done
target=127.0.0.1:$(cat "$tmp/port")
# The largest `length` or `pages` among the server's sessions (0 when none).
listed() {
  PYTHONPATH=$root/client/python /usr/bin/python3 -c "
import attnserve
with attnserve.Client('$target') as c:
    print(max([getattr(s, '$1') for s in c.list_sessions().sessions] or [0]))"
}
stat_field() { awk -v f="$2" '{print $f}' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; $(date -u)"
printf '%-8s %9s %9s %8s %8s %11s %12s %12s %6s %9s\n' kind L steps/s p50_ms p99_ms \
  compute_ms srv_cpu_ms fault/step pages rss_MB
run() {
  local kind=$1 length=$2
  "$bench" --target="$target" --rpc=decode --sessions=1 --prefill="$length" \
    --shapes=1,8,1,64 --kv_heads=2 --dtype=float16 --kind="$kind" --mode=closed \
    --concurrency=1 --warmup_s=0.5 --duration_s="$duration" --progress=off \
    --json="$tmp/run.json" > /dev/null &
  local bench_pid=$!
  # The loop's CPU and faults are read from the end of its prefill (the session listed with
  # all L tokens) plus the warm-up, to the end of the run.
  until [[ $(listed length) -ge $length ]]; do
    kill -0 "$bench_pid" 2> /dev/null || break
    sleep 0.05
  done
  sleep 0.5  # the warm-up
  local cpu0 flt0 cpu1 flt1 t0 t1
  t0=$(date +%s.%N)
  cpu0=$(($(stat_field "$server_pid" 14) + $(stat_field "$server_pid" 15)))
  flt0=$(stat_field "$server_pid" 10)
  local pages
  pages=$(listed pages)
  wait "$bench_pid"
  t1=$(date +%s.%N)
  cpu1=$(($(stat_field "$server_pid" 14) + $(stat_field "$server_pid" 15)))
  flt1=$(stat_field "$server_pid" 10)
  local rss
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$server_pid/status")
  /usr/bin/python3 - "$tmp/run.json" "$kind" "$length" "$((cpu1 - cpu0))" "$ticks_per_s" \
    "$((flt1 - flt0))" "${pages:-?}" "$rss" "$t0" "$t1" << 'PY'
import json, sys
p = json.load(open(sys.argv[1]))["phases"][-1]
kind, length, ticks, hz, faults, pages, rss, t0, t1 = sys.argv[2:]
# Steps in the measured window: the loop's rate times the window (it ends with the loop).
ok = max(p["ok"] / p["elapsed_s"] * min(float(t1) - float(t0), p["elapsed_s"]), 1)
lat = p["latency_ms"]
print(f"{kind:<8} {int(length):>9} {p['ok'] / p['elapsed_s']:>9.0f} {lat['p50']:>8.3f} "
      f"{lat['p99']:>8.3f} {p['compute_ms_mean']:>11.3f} "
      f"{int(ticks) / int(hz) * 1e3 / ok:>12.3f} {int(faults) / ok:>12.2f} {pages:>6} "
      f"{int(rss) / 1024:>9.0f}")
PY
}
for length in ${LINEAR_LENGTHS:-1024 65536 1048576}; do run linear "$length"; done
for length in ${SOFTMAX_LENGTHS:-1024 60000}; do run softmax "$length"; done
