#!/bin/bash
# Decode step latency of two attnserve binaries side by side, alternated (A, B, A, B, ...) so that
# drift of the machine falls on both: each round starts the binary, runs decode_grpc.py (one
# caller, a 1024-token context, 1000 steps of one token, 8 heads over 2 kv heads of 64, float16)
# and takes the session way's tokens/s and step p50/p99; then the medians of each.
#   tests/bench/decode_side_by_side.sh A_BINARY B_BINARY [ROUNDS] [-- EXTRA decode_grpc.py FLAGS]
# Used for "single-tenant deployments see no change" (tests/bench/DECODE.md, "Tenants"): A the
# server before tenants, B after, both built alike (Release, -DATTNSERVE_CUDA=OFF).
set -euo pipefail
a=$1 b=$2 rounds=${3:-6}
shift $(( $# >= 3 ? 3 : 2 ))
[[ ${1:-} == -- ]] && shift
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq "$rounds"); do
  for side in A B; do
    bin=$a
    [[ $side == B ]] && bin=$b
    /usr/bin/python3 "$here/decode_grpc.py" --server="$bin" --context=1024 --steps=1000 \
      --callers=1 --heads=8 --kv_heads=2 --head_dim=64 "$@" --json="$out/$side-$round.json" \
      > /dev/null
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| side | round | tokens/s | step p50 ms | step p99 ms | load 1m |\n|---|---|---|---|---|---|")
med = {}
for side in "AB":
    rows = [json.load(open(f"{out}/{side}-{r}.json")) for r in range(1, rounds + 1)]
    for i, r in enumerate(rows, 1):
        s = r["session"]
        print(f"| {side} | {i} | {s['tokens_per_s']} | {s['step_p50_ms']} | {s['step_p99_ms']} "
              f"| {r['machine']['load_average_1m']:.2f} |")
    med[side] = [statistics.median(r["session"][k] for r in rows)
                 for k in ("tokens_per_s", "step_p50_ms", "step_p99_ms")]
print(f"\nmedians  A: {med['A'][0]:.0f} tokens/s, p50 {med['A'][1]:.3f} ms, p99 {med['A'][2]:.3f} ms"
      f"\n         B: {med['B'][0]:.0f} tokens/s, p50 {med['B'][1]:.3f} ms, p99 {med['B'][2]:.3f} ms"
      f"\nB / A tokens/s: {med['B'][0] / med['A'][0]:.3f}; machine: {rows[0]['machine']['cpu']}")
PY
