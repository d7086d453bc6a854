#!/bin/bash
# Goodput of attnserve under overload, for comparing queue disciplines side by side.
# Usage: tests/bench/queue_discipline.sh BINARY [RATE...]
#   Starts BINARY (reference backend, --max_queued_requests=64), measures closed-loop capacity
#   (8 callers, 8 s, Attend [1, 4, 64, 32]), then an open loop at each RATE (requests/s) for
#   10 s with 200 ms deadlines, and prints OK/s, errors by code and latency per phase.
#   Run it for two binaries one after the other; the figures in server/batching/README.md
#   come from here. Needs build/client/bench/attnserve-bench and /usr/bin/python3.
set -euo pipefail
BIN=$1
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/build/client/bench/attnserve-bench
d=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$d"' EXIT
"$BIN" --listen=127.0.0.1:0 --metrics_address= --backend=reference --port_file="$d/port" \
  --max_queued_requests=64 >/dev/null 2>&1 &
pid=$!
while [ ! -s "$d/port" ]; do sleep 0.1; done
common="--target=127.0.0.1:$(cat "$d/port") --shapes=1,4,64,32 --progress=off"
# shellcheck disable=SC2086
"$BENCH" $common --mode=closed --concurrency=8 --duration_s=8 --json="$d/cap.json" >/dev/null
for r in "$@"; do
  # shellcheck disable=SC2086
  "$BENCH" $common --mode=open --rate="$r" --duration_s=10 --timeout_ms=200 \
    --json="$d/open$r.json" >/dev/null
done
/usr/bin/python3 - "$d" "$@" <<'PY'
import json, sys
d = sys.argv[1]
def show(name):
    p = json.load(open(f"{d}/{name}.json"))["phases"][0]
    print(f"  {name}: sent {p['sent_per_s']:.0f}/s ok {p['ok'] / p['elapsed_s']:.0f}/s "
          f"errors {p['errors']} p50 {p['latency_ms']['p50']:.1f} ms "
          f"p99 {p['latency_ms']['p99']:.1f} ms")
show("cap")
for r in sys.argv[2:]:
    show("open" + r)
PY
