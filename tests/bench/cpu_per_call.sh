#!/bin/bash
# Server CPU time per tiny Attend ([1,1,1,8] float32), for one or more attnserve binaries side by
# side: each serves a closed loop of 8 callers (attnserve-bench) for DURATION_S seconds, three
# rounds interleaved; the server's user+system time (/proc/PID/stat) over the run, divided by the
# calls answered OK. Less sensitive to a loaded machine than throughput: the other processes
# take CPU from the server, not CPU per call (clock ticks of 10 ms: about 0.5% resolution).
#
#   tests/bench/cpu_per_call.sh [BUILD_DIR] SERVER_BINARY...
# Environment: DURATION_S (default 5). Not run by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift
bench=$build/client/bench/attnserve-bench
duration=${DURATION_S:-5}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
n=0
for server in "$@"; do
  "$server" --listen=127.0.0.1:0 --port_file="$tmp/$n.port" --metrics_address= --backend=cpu \
    --backend_threads=2 > "$tmp/$n.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1200); do [[ -s $tmp/$n.port ]] && break; sleep 0.05; done
  n=$((n + 1))
done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)
for round in 1 2 3; do
  n=0
  for server in "$@"; do
    before=$(cpu_ticks "${pids[$n]}")
    "$bench" --target="127.0.0.1:$(cat "$tmp/$n.port")" --rpc=attend --shapes=1,1,1,8 \
      --mode=closed --concurrency=8 --warmup_s=0 --duration_s="$duration" --progress=off \
      --json="$tmp/run.json" > /dev/null
    after=$(cpu_ticks "${pids[$n]}")
    /usr/bin/python3 - "$tmp/run.json" "$server" "$round" "$((after - before))" "$ticks_per_s" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["phases"][0]
ticks, hz = int(sys.argv[4]), int(sys.argv[5])
print(f"round {sys.argv[3]}  {sys.argv[2]}: {p['ok'] / p['elapsed_s']:.0f} OK/s, "
      f"{ticks / hz * 1e6 / max(p['ok'], 1):.1f} us of server CPU per call")
PY
    n=$((n + 1))
  done
done
