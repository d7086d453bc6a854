#!/usr/bin/python3
"""What serving costs, side by side in one run (issue 11's two overhead targets).

  (a) tiny Attend requests ([1,1,1,8] float32): attnserve against attnserve-bench-echo, the
      do-nothing server on the same gRPC stack and proto (client/bench/echo_server.cc).
      Target: attnserve >= 0.85x the echo server's throughput.
  (b) MultiHeadAttention, d_model 512, 8 heads, B=1 L=128 float32 (the seed vector seed_demo as
      module "large"): attnserve's GFLOP/s against the CPU backend called directly in-process on
      batches of N such requests (cpu_backend_bench BM_MultiHeadRequests/N, as the Executor
      passes a batch of N requests), same thread count. Target: >= 0.9x the backend's speed.

Both servers run at once; the load is attnserve-bench, closed loop, --concurrency callers on one
connection. Each round runs every leg back to back (echo and attnserve alternate which goes first
from round to round), and every ratio is taken within a round; the summary gives the median and
the spread over the rounds. Besides the wall-clock ratios (what the targets name), the script
reads the CPU time each process used (/proc/PID/stat for the servers, wait4 for the client and
the backend benchmark): the machine these figures come from is shared with other jobs, which
take cores from the processes measured (wall clock) but not CPU time per call.

  per call us      server CPU per call (and the load client's, second figure)
  server CPU        the same ratios from the servers' CPU alone (the client's left out)
  cpu ratio        (a) the echo server's (server + client) CPU per call over attnserve's: the
                   throughput ratio the two would have with the cores to themselves;
                   (b) served GFLOP per CPU-second of server + client over the backend's GFLOP
                   per CPU-second.

  /usr/bin/python3 tests/bench/serving_overhead.py [--build=build] [--server=PATH] [--rounds=3]

Not run by CI. Figures: tests/bench/SERVING.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZ = os.sysconf("SC_CLK_TCK")


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_s(pid):
    """User + system CPU seconds of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def run_child(argv, **kw):
    """Runs argv to completion; returns (stdout, CPU seconds it used)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, **kw)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{argv[0]} failed ({p.returncode})")
    return out, usage.ru_utime + usage.ru_stime


def start_server(argv, port_file, log):
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            with open(port_file) as f:
                return p, f"127.0.0.1:{f.read().strip()}"
        if p.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"{argv[0]} did not start; see {log.name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--server", help="attnserve binary (default BUILD/server/attnserve)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration_s", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="compute threads (server, backend)")
    ap.add_argument("--batches", default="1,2,4,8", help="backend batch sizes N to compare with")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    server = args.server or f"{build}/server/attnserve"
    bench = f"{build}/client/bench/attnserve-bench"
    echo = f"{build}/client/bench/attnserve-bench-echo"
    backend_bench = f"{build}/tests/bench/cpu_backend_bench"
    for f in (server, bench, echo, backend_bench):
        if not os.access(f, os.X_OK):
            sys.exit(f"missing {f}: build attnserve, attnserve-bench, attnserve-bench-echo, "
                     "cpu_backend_bench")
    seeds = os.path.join(ROOT, "tests/data/seed-vectors")
    tmp = tempfile.mkdtemp(prefix="serving_overhead.")
    print(f"machine: {machine()}; load average at start {loadavg()}")
    print(f"server: {server}")
    print(f"closed loop, {args.concurrency} callers, {args.duration_s:g} s per leg, "
          f"{args.threads} compute threads, {args.rounds} rounds\n", flush=True)

    procs = []
    try:
        log = open(f"{tmp}/attnserve.log", "w")
        attn, attn_target = start_server(
            [server, "--listen=127.0.0.1:0", f"--port_file={tmp}/attnserve.port",
             "--metrics_address=", "--backend=cpu", f"--backend_threads={args.threads}",
             f"--module=large={seeds}/seed_demo.safetensors:8"], f"{tmp}/attnserve.port", log)
        procs.append(attn)
        echo_p, echo_target = start_server(
            [echo, "--listen=127.0.0.1:0", f"--port_file={tmp}/echo.port"], f"{tmp}/echo.port",
            open(f"{tmp}/echo.log", "w"))
        procs.append(echo_p)

        def load(pid, target, rpc_args, duration_s=args.duration_s):
            before = cpu_s(pid)
            _, client_cpu = run_child(
                [bench, f"--target={target}", "--progress=off", "--warmup_s=0",
                 f"--duration_s={duration_s}", "--mode=closed",
                 f"--concurrency={args.concurrency}", f"--json={tmp}/run.json"] + rpc_args)
            server_cpu = cpu_s(pid) - before
            with open(f"{tmp}/run.json") as f:
                p = json.load(f)["phases"][0]
            if p["ok"] != p["sent"]:
                sys.exit(f"{p['sent'] - p['ok']} calls failed against {target}")
            calls = max(p["ok"], 1)
            return {"rps": p["requests_per_s"], "gflops": p["gflops_per_s"],
                    "batch": p["batch_size_mean"], "server_us": server_cpu / calls * 1e6,
                    "client_us": client_cpu / calls * 1e6}

        tiny = ["--rpc=attend", "--shapes=1,1,1,8"]
        large = ["--rpc=mha", "--module=large", "--shapes=1,128"]
        batches = [int(n) for n in args.batches.split(",")]
        # Warm-up (connections, the servers' allocators, the module's first use); no warm-up
        # inside the legs, so that the CPU read around a leg is the CPU of the calls it counts.
        for pid, target in ((echo_p.pid, echo_target), (attn.pid, attn_target)):
            load(pid, target, tiny, duration_s=1)
        load(attn.pid, attn_target, large, duration_s=1)
        rows = []
        for r in range(1, args.rounds + 1):
            row = {}
            order = [("echo", echo_p.pid, echo_target), ("attnserve", attn.pid, attn_target)]
            if r % 2 == 0:
                order.reverse()
            for name, pid, target in order:
                row["tiny_" + name] = load(pid, target, tiny)
            out, backend_cpu = run_child(
                [backend_bench, f"--threads={args.threads}", "--benchmark_format=json",
                 f"--benchmark_min_time={args.duration_s / len(batches):g}",
                 "--benchmark_filter=BM_MultiHeadRequests/(" + "|".join(map(str, batches)) +
                 ")/128/512/8/"])
            row["backend"] = {}
            for b in json.loads(out)["benchmarks"]:
                n = int(b["name"].split("/")[1])
                row["backend"][n] = {"gflops": b["GFLOP/s"],
                                     "gflop_per_cpu_s": b["GFLOP/s"] * b["real_time"] /
                                     b["cpu_time"]}
            row["large"] = load(attn.pid, attn_target, large)
            rows.append(row)
            print_round(r, row)
        print_summary(rows)
        print(f"\nload average at end {loadavg()}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def print_round(r, row):
    e, a, big = row["tiny_echo"], row["tiny_attnserve"], row["large"]
    print(f"round {r} (load average {loadavg()})")
    for name, x in (("echo", e), ("attnserve", a)):
        print(f"  tiny  {name:<10} {x['rps']:9.0f} req/s   server {x['server_us']:6.1f} us/call"
              f"   client {x['client_us']:6.1f} us/call")
    ratio, cpu, _ = tiny_ratios(row)
    print(f"  tiny  attnserve / echo: {ratio:.2f}x wall clock, {cpu:.2f}x CPU "
          f"(server CPU alone {e['server_us'] / a['server_us']:.2f}x)")
    flop_per_req = big["gflops"] / big["rps"]
    big_cpu = flop_per_req / ((big["server_us"] + big["client_us"]) * 1e-6)
    srv_cpu = flop_per_req / (big["server_us"] * 1e-6)
    print(f"  large attnserve  {big['rps']:9.1f} req/s  {big['gflops']:6.1f} GFLOP/s "
          f"(mean batch {big['batch']:.2f}), {big_cpu:6.1f} GFLOP per CPU-s "
          f"(server {big['server_us']:.0f} + client {big['client_us']:.0f} us/call)")
    for n, b in sorted(row["backend"].items()):
        print(f"  large backend N={n}: {b['gflops']:6.1f} GFLOP/s, {b['gflop_per_cpu_s']:6.1f} "
              f"GFLOP per CPU-s; attnserve / backend {big['gflops'] / b['gflops']:.2f}x wall "
              f"clock, {big_cpu / b['gflop_per_cpu_s']:.2f}x CPU (server CPU alone "
              f"{srv_cpu / b['gflop_per_cpu_s']:.2f}x)")
    print(flush=True)


def tiny_ratios(row):
    e, a = row["tiny_echo"], row["tiny_attnserve"]
    return (a["rps"] / e["rps"],
            (e["server_us"] + e["client_us"]) / (a["server_us"] + a["client_us"]),
            e["server_us"] / a["server_us"])


def large_ratios(row):
    """attnserve over the backend at its best N (strict), wall clock and CPU."""
    big = row["large"]
    big_cpu = big["gflops"] / big["rps"] / ((big["server_us"] + big["client_us"]) * 1e-6)
    srv_cpu = big["gflops"] / big["rps"] / (big["server_us"] * 1e-6)
    best = max(row["backend"].values(), key=lambda b: b["gflops"])
    best_cpu = max(b["gflop_per_cpu_s"] for b in row["backend"].values())
    return big["gflops"] / best["gflops"], big_cpu / best_cpu, srv_cpu / best_cpu


def print_summary(rows):
    def spread(values):
        return (f"median {statistics.median(values):.2f}x "
                f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    t = [tiny_ratios(r) for r in rows]
    m = [large_ratios(r) for r in rows]
    print("summary (target in brackets)")
    print(f"  tiny attnserve / echo [>= 0.85x]      wall clock {spread([x[0] for x in t])}")
    print(f"                                        CPU        {spread([x[1] for x in t])}")
    print(f"                                        server CPU {spread([x[2] for x in t])}")
    print(f"  mha 512 L=128 attnserve / backend at its best N [>= 0.9x]")
    print(f"                                        wall clock {spread([x[0] for x in m])}")
    print(f"                                        CPU        {spread([x[1] for x in m])}")
    print(f"                                        server CPU {spread([x[2] for x in m])}")


if __name__ == "__main__":
    main()
