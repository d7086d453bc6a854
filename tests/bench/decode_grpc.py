#!/usr/bin/python3
"""Decode through gRPC: session steps against the stateless way, side by side in one run.

Both ways compute the same thing: C callers, each generating T tokens one at a time after a
context of P tokens (raw heads Hq/Hkv/D, --dtype).
  session:   CreateSession, a prefill of P tokens (extends of --prefill_chunk), then T steps
             of one token (q [1, Hq, D], k and v [1, Hkv, D]);
  stateless: T Attend calls, step t sending q [1, Hq, 1, D] and the whole K/V so far
             [1, Hkv, P + t + 1, D] (causal), as a caller without server-held state must.
Tokens/s = C x T / wall seconds of the T steps (prefill excluded from the session figure, as
the stateless way has none), and the per-step latency p50/p99. The outputs of the two ways are
compared step by step (max |difference|), so the ratio is between equal results.

  /usr/bin/python3 tests/bench/decode_grpc.py --server=build/server/attnserve \\
      [--context=4096] [--steps=64] [--callers=4] [--json=out.json]
  /usr/bin/python3 tests/bench/decode_grpc.py --target=HOST:PORT ...   # a running server

Figures: tests/bench/DECODE.md ("Through gRPC").
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attnserve  # noqa: E402


def start_server(binary, flags):
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    log = open(os.path.join(d, "log"), "w")
    p = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
                          f"--port_file={port_file}", *flags], stdout=log, stderr=log)
    for _ in range(3000):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            with open(port_file) as f:
                return p, f"127.0.0.1:{int(f.read())}"
        if p.poll() is not None:
            raise RuntimeError(f"server exited {p.returncode}; log in {log.name}")
        time.sleep(0.02)
    raise TimeoutError("server did not start")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(np.ceil(p / 100 * len(v))) - 1))]


def caller_data(seed, a):
    """One caller's tokens: q [P+T, Hq, D], k and v [P+T, Hkv, D] (token-major)."""
    rng = np.random.default_rng(seed)
    n = a.context + a.steps
    q = rng.standard_normal((n, a.heads, a.head_dim), dtype=np.float32)
    k = rng.standard_normal((n, a.kv_heads, a.head_dim), dtype=np.float32)
    v = rng.standard_normal((n, a.kv_heads, a.head_dim), dtype=np.float32)
    dt = np.float16 if a.dtype == "float16" else np.float32
    return q.astype(dt), k.astype(dt), v.astype(dt)


def run_callers(data, a, step):
    """One thread per sequence, all started together, each calling step(i, j) for positions
    j = context .. context + steps - 1 and timing each call. Returns the wall time, every
    step's latency and each step's output as [heads, head_dim] float32."""
    outputs = [[None] * a.steps for _ in data]
    latencies = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(data) + 1)

    def caller(i):
        mine = []
        barrier.wait()
        for t in range(a.steps):
            t0 = time.perf_counter()
            r = step(i, a.context + t)
            mine.append(time.perf_counter() - t0)
            outputs[i][t] = np.asarray(r.output, np.float32).reshape(a.heads, a.head_dim)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, latencies, outputs


def run_sessions(client, data, a):
    sessions = []
    for q, k, v in data:  # create and prefill before the clock starts
        s = client.create_session(layout=attnserve.layout(a.heads, a.head_dim, a.kv_heads),
                                  cache_dtype=a.dtype)
        for c in range(0, a.context, a.prefill_chunk):
            e = min(a.context, c + a.prefill_chunk)
            s.extend(q[c:e], k[c:e], v[c:e], dtype=a.dtype)
        sessions.append(s)

    def step(i, j):
        q, k, v = data[i]
        return sessions[i].extend(q[j:j + 1], k[j:j + 1], v[j:j + 1], dtype=a.dtype)

    result = run_callers(data, a, step)
    for s in sessions:
        s.close()
    return result


def run_stateless(client, data, a):
    def step(i, j):
        q, k, v = data[i]
        # [1, H, L, D] views of the token-major cache: what a stateless caller sends.
        return client.attend(q[j:j + 1].transpose(1, 0, 2)[None],
                             k[:j + 1].transpose(1, 0, 2)[None],
                             v[:j + 1].transpose(1, 0, 2)[None], causal=True, dtype=a.dtype)

    return run_callers(data, a, step)


def summary(name, wall, latencies, a):
    tokens = len(latencies)
    return {"way": name, "tokens": tokens, "wall_s": round(wall, 4),
            "tokens_per_s": round(tokens / wall, 2),
            "step_p50_ms": round(percentile(latencies, 50) * 1e3, 3),
            "step_p99_ms": round(percentile(latencies, 99) * 1e3, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="attnserve binary to start (else --target)")
    ap.add_argument("--server_flags", default="", help="extra flags, space-separated")
    ap.add_argument("--target", help="a running server")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--prefill_chunk", type=int, default=256,
                    help="the session prefill is sent in extends of this many tokens")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv_heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    proc = None
    if a.server:
        proc, target = start_server(a.server, a.server_flags.split())
    elif a.target:
        target = a.target
    else:
        ap.error("give --server or --target")
    try:
        with attnserve.Client(target, timeout=600) as client:
            info = client.server_info()
            backend = next((b.name for b in info.backends if b.active), "?")
            data = [caller_data(1000 + i, a) for i in range(a.callers)]
            s_wall, s_lat, s_out = run_sessions(client, data, a)
            a_wall, a_lat, a_out = run_stateless(client, data, a)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    diff = max(float(np.max(np.abs(x - y))) for sx, ax in zip(s_out, a_out)
               for x, y in zip(sx, ax))
    session, stateless = summary("session", s_wall, s_lat, a), summary("stateless", a_wall,
                                                                       a_lat, a)
    result = {
        "config": {k: getattr(a, k) for k in ("context", "steps", "callers", "prefill_chunk",
                                              "heads",
                                              "kv_heads", "head_dim", "dtype")},
        "server": {"version": info.version, "backend": backend,
                   "page_tokens": info.sessions.page_tokens},
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "load_average_1m": os.getloadavg()[0]},
        "session": session, "stateless": stateless,
        "speedup": round(session["tokens_per_s"] / stateless["tokens_per_s"], 2),
        "max_abs_output_difference": diff,
        "stateless_request_mib_at_end": round(
            2 * a.kv_heads * (a.context + a.steps) * a.head_dim
            * (2 if a.dtype == "float16" else 4) / 2**20, 2),
    }
    print(json.dumps(result, indent=2))
    print(f"\n| way | tokens/s | step p50 ms | step p99 ms |\n|---|---|---|---|")
    for r in (session, stateless):
        print(f"| {r['way']} | {r['tokens_per_s']} | {r['step_p50_ms']} | {r['step_p99_ms']} |")
    print(f"\nsession / stateless: {result['speedup']}x; outputs differ by at most {diff:.3g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
