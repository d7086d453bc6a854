#!/usr/bin/python3
"""Small requests with dynamic batching on and off, side by side in one run.

Requests: MultiHeadAttention, B = 1, L drawn from {32, 64, 96, 128}, d_model 256, 4 heads (a
module with random weights written here). For each configuration a fresh attnserve is started
and attnserve-bench drives it in closed loop at several concurrencies; configurations are
interleaved round by round so drift in the machine's load hits them alike.

Usage: tests/bench/batching_comparison.py [BUILD_DIR] [--duration_s 4] [--rounds 2]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

CONFIGS = [
    ("batching, delay 0", ["--batching=true", "--max_queue_delay_us=0"]),
    ("batching, delay 2ms", ["--batching=true", "--max_queue_delay_us=2000"]),
    ("no batching", ["--batching=false"]),
]
CONCURRENCY = [1, 8, 32]


def write_module(path, d_model=256, heads=4):
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(d_model)
    header, blobs, offset = {"__metadata__": {"num_heads": str(heads)}}, [], 0
    for p in ("W_q", "W_k", "W_v", "W_o"):
        for name, shape in ((p + ".weight", (d_model, d_model)), (p + ".bias", (d_model,))):
            a = rng.uniform(-bound, bound, shape).astype("<f4")
            header[name] = {"dtype": "F32", "shape": list(shape),
                            "data_offsets": [offset, offset + a.nbytes]}
            offset += a.nbytes
            blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def run_config(build, flags, module, tmp, duration_s):
    port_file = os.path.join(tmp, "port")
    if os.path.exists(port_file):
        os.remove(port_file)
    server = subprocess.Popen(
        [os.path.join(build, "server/attnserve"), "--listen=127.0.0.1:0",
         f"--port_file={port_file}", "--metrics_address=", f"--module=m256={module}", *flags],
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("attnserve did not start")
            time.sleep(0.02)
        port = int(open(port_file).read())
        out = os.path.join(tmp, "bench.json")
        subprocess.run(
            [os.path.join(build, "client/bench/attnserve-bench"), f"--target=127.0.0.1:{port}",
             "--rpc=mha", "--module=m256", "--shapes=1,32;1,64;1,96;1,128",
             "--steps=" + ",".join(map(str, CONCURRENCY)), f"--duration_s={duration_s}",
             "--warmup_s=1", "--progress=off", f"--json={out}"],
            check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out))["phases"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build", nargs="?", default="build")
    parser.add_argument("--duration_s", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = {name: {c: [] for c in CONCURRENCY} for name, _ in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        module = os.path.join(tmp, "m256.safetensors")
        write_module(module)
        for r in range(args.rounds):
            for name, flags in CONFIGS:
                for phase in run_config(args.build, flags, module, tmp, args.duration_s):
                    results[name][int(phase["level"])].append(phase)
                print(f"round {r + 1}: {name} done", file=sys.stderr)

    def median(values):
        return float(np.median(values))

    print(f"{'configuration':22s} {'callers':>7s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s}"
          f" {'batch':>6s}")
    base = {}
    for name, _ in CONFIGS:
        for c in CONCURRENCY:
            phases = results[name][c]
            rps = median([p["requests_per_s"] for p in phases])
            p50 = median([p["latency_ms"]["p50"] for p in phases])
            p99 = median([p["latency_ms"]["p99"] for p in phases])
            batch = median([p["batch_size_mean"] for p in phases])
            if name == "no batching":
                base[c] = (rps, p99)
            print(f"{name:22s} {c:7d} {rps:9.0f} {p50:8.2f} {p99:8.2f} {batch:6.1f}")
    print("\nratios to no batching (throughput x, p99 x):")
    for name, _ in CONFIGS[:-1]:
        for c in CONCURRENCY:
            phases = results[name][c]
            rps = median([p["requests_per_s"] for p in phases])
            p99 = median([p["latency_ms"]["p99"] for p in phases])
            print(f"  {name:22s} callers {c:3d}: throughput {rps / base[c][0]:.2f}x,"
                  f" p99 {p99 / base[c][1]:.2f}x")


if __name__ == "__main__":
    main()
