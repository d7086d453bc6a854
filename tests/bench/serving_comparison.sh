#!/bin/bash
# Serving comparisons, in one run, with one client (attnserve-bench):
#  1. attnserve vs a minimal Python gRPC server wrapping torch.nn.MultiheadAttention
#     (serving_torch_server.py), same module weights, same shapes, same thread count, for
#     small and large requests: throughput and p99 of each and their ratio.
#  2. attnserve vs attnserve-bench-echo (same gRPC stack, answers with the query, computes
#     nothing) on tiny requests: what serving itself costs, as a throughput ratio.
#  3. attnserve's GFLOP/s on the large requests (mha d_model 512, L=128) vs the CPU backend's own
#     speed on the same shape called directly (cpu_backend_bench BM_MultiHead, alone and as
#     batches of 4 and 8; the server's mean batch is printed), same thread count, run before the
#     servers start: what serving costs on real work. Skipped when
#     BUILD_DIR/tests/bench/cpu_backend_bench is not built (ATTNSERVE_BUILD_BENCHMARKS=ON).
#
#   tests/bench/serving_comparison.sh [BUILD_DIR]      (default: build)
# Environment: SERVER (the attnserve binary, default BUILD_DIR/server/attnserve), THREADS
# (compute threads for both servers, default 2), DURATION_S (per run,
# default 10), CONCURRENCY (closed-loop callers, default 8), SEEDS (seed-vector directory).
# Installs python3-torch with apt when /usr/bin/python3 cannot import torch. Not run by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
threads=${THREADS:-2}
duration=${DURATION_S:-10}
concurrency=${CONCURRENCY:-8}
seeds=${SEEDS:-$root/tests/data/seed-vectors}
bench=$build/client/bench/attnserve-bench
echo_server=$build/client/bench/attnserve-bench-echo
server=${SERVER:-$build/server/attnserve}
stubs=$build/python/attnserve_pb
for f in "$bench" "$echo_server" "$server" "$stubs/attnserve/v1/attention_pb2.py"; do
  [[ -e $f ]] || { echo "missing $f: build attnserve, attnserve-bench, attnserve-bench-echo, attnserve_python_stubs"; exit 2; }
done
"$root/tests/bench/ensure_torch.sh" serving_comparison

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
wait_port() {
  for _ in $(seq 1200); do [[ -s $1 ]] && { cat "$1"; return; }; sleep 0.05; done
  echo "a server did not start; logs:" >&2; tail -n 20 "$tmp"/*.log >&2; exit 1
}

# The backend alone first, before any server runs.
backend_bench=$build/tests/bench/cpu_backend_bench
if [[ -x $backend_bench ]]; then
  "$backend_bench" --threads="$threads" --benchmark_min_time=2 --benchmark_format=json \
    --benchmark_filter='BM_MultiHead/(1|4|8)/128/512/8/' > "$tmp/backend.json" 2> /dev/null || true
fi

modules="small=$seeds/cross_padding.safetensors:4,large=$seeds/seed_demo.safetensors:8"
"$server" --listen=127.0.0.1:0 --port_file="$tmp/attnserve.port" --metrics_address= \
  --backend=auto --backend_threads="$threads" --module="$modules" > "$tmp/attnserve.log" 2>&1 &
pids+=($!)
/usr/bin/python3 "$root/tests/bench/serving_torch_server.py" --stubs="$stubs" \
  --port_file="$tmp/torch.port" --threads="$threads" \
  --module="small=$seeds/cross_padding.safetensors:4" \
  --module="large=$seeds/seed_demo.safetensors:8" > "$tmp/torch.log" 2>&1 &
pids+=($!)
"$echo_server" --listen=127.0.0.1:0 --port_file="$tmp/echo.port" > "$tmp/echo.log" 2>&1 &
pids+=($!)
attnserve=127.0.0.1:$(wait_port "$tmp/attnserve.port")
torch=127.0.0.1:$(wait_port "$tmp/torch.port")
echo_target=127.0.0.1:$(wait_port "$tmp/echo.port")

# Both servers must compute the same thing before their speed is compared.
PYTHONPATH="$root/client/python:$stubs" /usr/bin/python3 - "$attnserve" "$torch" <<'PY'
import sys
import numpy as np
import attnserve
x = np.random.default_rng(0).standard_normal((2, 9, 64), dtype=np.float32)
a = attnserve.Client(sys.argv[1]).multi_head_attention("small", x).output
t = attnserve.Client(sys.argv[2]).multi_head_attention("small", x).output
err = float(np.abs(a - t).max())
print(f"attnserve vs torch server, same input: max |difference| {err:.2e}")
assert err < 1e-4, err
PY

run() {  # run NAME TARGET FLAGS...
  local name=$1 target=$2
  shift 2
  "$bench" --target="$target" --progress=off --warmup_s=2 --duration_s="$duration" \
    --json="$tmp/$name.json" "$@" > "$tmp/$name.txt" || true
}
small=(--rpc=mha --module=small --shapes=1,16 --mode=closed --concurrency="$concurrency")
large=(--rpc=mha --module=large --shapes=1,128 --mode=closed --concurrency="$concurrency")
tiny=(--rpc=attend --shapes=1,1,1,8 --mode=closed --concurrency="$concurrency")
run small_attnserve "$attnserve" "${small[@]}"
run small_torch "$torch" "${small[@]}"
run large_attnserve "$attnserve" "${large[@]}"
run large_torch "$torch" "${large[@]}"
run tiny_attnserve "$attnserve" "${tiny[@]}"
run tiny_echo "$echo_target" "${tiny[@]}"

/usr/bin/python3 - "$tmp" "$threads" "$duration" "$concurrency" <<'PY'
import json, os, sys
tmp, threads, duration, conc = sys.argv[1:]
def load(name):
    with open(os.path.join(tmp, name + ".json")) as f:
        r = json.load(f)
    p = r["phases"][0]
    return r["config"], p
print(f"\nclosed loop, {conc} callers, {duration} s per run after 2 s warm-up, "
      f"{threads} compute threads per server\n")
print(f"{'load':<34} {'server':<22} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'errors':>7}")
rows = []
for load_name, what in (("small", "mha d_model 64, 4 heads, B=1 L=16"),
                        ("large", "mha d_model 512, 8 heads, B=1 L=128"),
                        ("tiny", "attend [1,1,1,8] (tiny)")):
    other = "echo" if load_name == "tiny" else "torch"
    res = {}
    for srv in ("attnserve", other):
        cfg, p = load(f"{load_name}_{srv}")
        res[srv] = p
        label = f"{srv} ({cfg['server_backend']})"
        print(f"{what:<34} {label:<22} {p['requests_per_s']:9.1f} {p['latency_ms']['p50']:9.3f} "
              f"{p['latency_ms']['p99']:9.3f} {p['sent'] - p['ok']:7d}")
    a, o = res["attnserve"], res[other]
    ratio = a["requests_per_s"] / o["requests_per_s"] if o["requests_per_s"] else float("nan")
    p99 = a["latency_ms"]["p99"] / o["latency_ms"]["p99"] if o["latency_ms"]["p99"] else float("nan")
    print(f"{'':<34} {'attnserve / ' + other:<22} {ratio:9.2f}x {'':>9} {p99:8.2f}x\n")
backend = os.path.join(tmp, "backend.json")
if os.path.exists(backend) and os.path.getsize(backend) > 0:
    with open(backend) as f:
        runs = {r["name"]: r["GFLOP/s"] for r in json.load(f)["benchmarks"]}
    _, large = load("large_attnserve")
    served = large["gflops_per_s"]
    print(f"mha d_model 512, 8 heads, B=1 L=128: attnserve {served:.1f} GFLOP/s "
          f"(mean batch {large['batch_size_mean']:.2f} requests)")
    for name, g in sorted(runs.items()):
        print(f"  CPU backend called directly, {name}: {g:.1f} GFLOP/s; attnserve / backend "
              f"{served / g:.2f}x")
else:
    print("(cpu_backend_bench not built: no comparison with the backend's own speed)")
PY
