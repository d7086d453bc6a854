#!/usr/bin/python3
"""The serving-overhead curve: what a call costs the server across request sizes (issue 29).

For Attend and MultiHeadAttention requests from about 1 KiB to 16 MiB, with 1 and 8 callers
(attnserve-bench, closed loop), per size:
  server CPU per call    the server process's user + system CPU over the measured run
                         (/proc/PID/stat), divided by the calls answered;
  faults per call        its minor + major page faults over the same run;
  backend CPU per call   the backend alone on the same requests (tests/bench/backend_cost:
                         attnserve-bench's own requests through the server's request builder,
                         computed one per batch on the backend the server makes);
  echo CPU per call      attnserve-bench-echo (the same gRPC stack and proto, answering the query
                         as the output: the same bytes in and out, nothing computed; on the same
                         allocator as attnserve) under the same load;
  overhead               server / (backend + echo): 1.0 when serving adds nothing to receiving
                         and answering the bytes and computing the attention.
After the sweep every server idles --idle_s seconds (30 by default) and its RSS then is given
beside its RSS when fresh (started, one tiny call answered): memory the load left behind.
With --baseline=BINARY a second attnserve (e.g. a build of an older commit) runs the same loads
beside it, for figures taken side by side in one run; --baseline_flags adds flags to that one
(without --baseline: the same binary with other flags, e.g. --cpu_min_flops_per_thread=0).
With --stream the first attnserve is also measured answering the same requests over its
AttentionStream rpc ("attnserve stream": as many streams as callers, each on a channel of its
own, the closed loop's calls dealt to them by request id), the route for callers with many small
requests: a stream's requests share its HTTP/2 stream, so they do not pay a call's setup,
headers and end each.

With --rounds=N every point is measured N times, the servers interleaved within each round; a
server's figures are the medians over the rounds, the overhead is the median of the rounds'
overheads, and "overhead_range" gives their lowest and highest (on a VM whose speed moves from
minute to minute, one round of a small request can be off by a third).

Each (size, callers) point runs every server back to back, each after a warm-up run of its own;
the CPU and faults are read right around the measured run. The JSON (--json) is what
`attnserve-bench --sweep_from=FILE --html=PAGE` draws; the table goes to stdout.

  /usr/bin/python3 tests/bench/serving_sweep.py [--build=build] [--duration_s=3]
      [--baseline=PATH --baseline_name=a0c8747] [--baseline_flags='--flag=value ...']
      [--json=sweep.json] [--html=sweep.html]
      [--rpcs=attend,mha] [--callers=1,8] [--sizes=all|1k,64k,...] [--rounds=1] [--stream]

Not run by CI. Figures: tests/bench/SERVING.md.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZ = os.sysconf("SC_CLK_TCK")

# name -> (Attend shape B,H,L,D; MultiHeadAttention shape B,L on "demo", d_model 64). Request
# sizes are q, k and v for Attend (3 * B*H*L*D*4 bytes) and the query alone for self-attention
# (B*L*64*4 bytes); the answers are as large as the query.
SIZES = {
    "1k": ("1,1,8,8", "1,4"),            # 768 B; 1 KiB
    "16k": ("1,2,32,32", "1,64"),        # 24 KiB; 16 KiB
    "64k": ("1,4,32,64", "1,256"),       # 96 KiB; 64 KiB
    "256k": ("1,4,128,64", "4,256"),     # 384 KiB; 256 KiB
    "1m": ("1,8,128,64", "16,256"),      # 768 KiB; 1 MiB
    "3m": ("1,8,512,64", "48,256"),      # 3 MiB; 3 MiB
    "16m": ("5,8,512,64", "256,256"),    # 15 MiB; 16 MiB
}


def cpu_and_faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ, int(fields[7]) + int(fields[9])


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


class Server:
    def __init__(self, name, argv, tmp):
        self.name = name
        port_file = f"{tmp}/{name}.port"
        self.log = open(f"{tmp}/{name}.log", "w+")
        self.process = subprocess.Popen(argv + ["--listen=127.0.0.1:0", f"--port_file={port_file}"],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1200):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                with open(port_file) as f:
                    self.target = f"127.0.0.1:{f.read().strip()}"
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        sys.exit(f"{name} did not start: {self.log.read()}")

    def stop(self):
        self.process.terminate()
        self.process.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--server", help="attnserve binary (default BUILD/server/attnserve)")
    ap.add_argument("--baseline", help="a second attnserve binary, run beside the first")
    ap.add_argument("--baseline_name", default="baseline")
    ap.add_argument("--baseline_flags", default="",
                    help="flags for the baseline (without --baseline: the same binary)")
    ap.add_argument("--duration_s", type=float, default=3)
    ap.add_argument("--rpcs", default="attend,mha")
    ap.add_argument("--callers", default="1,8")
    ap.add_argument("--sizes", default="all")
    ap.add_argument("--json")
    ap.add_argument("--html")
    ap.add_argument("--notes", default="")
    ap.add_argument("--idle_s", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measurements per point, servers interleaved; medians are reported")
    ap.add_argument("--stream", action="store_true",
                    help="also measure the first attnserve over its AttentionStream rpc")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit(f"--rounds must be at least 1; was {args.rounds}")
    build = os.path.abspath(args.build)
    server_bin = args.server or f"{build}/server/attnserve"
    bench = f"{build}/client/bench/attnserve-bench"
    echo = f"{build}/client/bench/attnserve-bench-echo"
    backend_cost = f"{build}/tests/bench/backend_cost"
    for f in [server_bin, bench, echo, backend_cost] + ([args.baseline] if args.baseline else []):
        if not os.access(f, os.X_OK):
            sys.exit(f"missing {f}: build attnserve, attnserve-bench, attnserve-bench-echo and "
                     "backend_cost (ATTNSERVE_BUILD_BENCHMARKS)")
    sizes = list(SIZES) if args.sizes == "all" else args.sizes.split(",")
    rpcs = args.rpcs.split(",")
    callers = [int(c) for c in args.callers.split(",")]
    tmp = tempfile.mkdtemp(prefix="serving_sweep.")
    # The CPU backend named, for every server: "auto" would load the CUDA libraries where nvcc
    # built the plugin, which no request uses on a machine without a GPU.
    flags = ["--backend=cpu", "--metrics_address="]
    servers = [Server("attnserve", [server_bin] + flags, tmp)]
    if args.baseline or args.baseline_flags:
        servers.append(Server(args.baseline_name, [args.baseline or server_bin] + flags +
                              shlex.split(args.baseline_flags), tmp))
    servers.append(Server("echo", [echo], tmp))
    # What is measured at each point: (name, server process, rpc=stream?). The stream column
    # is the first attnserve's process, asked through the other rpc.
    measured = [(s.name, s, False) for s in servers]
    if args.stream:
        measured.insert(1, ("attnserve stream", servers[0], True))
    names = [name for name, _, _ in measured]
    fresh = {}
    for s in servers:
        subprocess.run([bench, f"--target={s.target}", "--rpc=attend", "--shapes=1,1,1,8",
                        "--mode=closed", "--requests=1", "--warmup_s=0", "--progress=off"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fresh[s.name] = rss_mib(s.process.pid)
    allocator = next((line.split("allocator ", 1)[1].strip() for line in open(servers[0].log.name)
                      if "allocator " in line), "?")
    print(f"machine: {machine()}\nattnserve allocator: {allocator}\n", flush=True)

    def load(server, stream, rpc, shape, n, duration_s):
        before = cpu_and_faults(server.process.pid)
        out = f"{tmp}/run.json"
        # As many streams as callers, each on a channel of its own (the bench opens one stream
        # per connection and deals the closed loop's calls to them by request id).
        route = (["--rpc=stream", f"--stream_payload={rpc}", f"--connections={n}"] if stream
                 else [f"--rpc={rpc}"])
        subprocess.run([bench, f"--target={server.target}", *route, f"--shapes={shape}",
                        "--mode=closed", f"--concurrency={n}", "--progress=off", "--warmup_s=0",
                        f"--duration_s={duration_s}", "--timeout_ms=120000", f"--json={out}"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = cpu_and_faults(server.process.pid)
        with open(out) as f:
            phase = json.load(f)["phases"][0]
        ok = phase["ok"]
        per = max(ok, 1)
        return {"ok": ok, "errors": phase["sent"] - ok, "req_per_s": phase["requests_per_s"],
                "cpu_us_per_call": (after[0] - before[0]) / per * 1e6,
                "faults_per_call": (after[1] - before[1]) / per,
                "p50_ms": phase["latency_ms"]["p50"], "p99_ms": phase["latency_ms"]["p99"]}

    points = []
    try:
        for rpc in rpcs:
            for size in sizes:
                shape = SIZES[size][0 if rpc == "attend" else 1]
                cost = json.loads(subprocess.run(
                    [backend_cost, f"--rpc={rpc}", f"--shapes={shape}", "--min_time_s=1"],
                    check=True, stdout=subprocess.PIPE, text=True).stdout)
                for n in callers:
                    point = {"rpc": rpc, "shape": shape, "request_bytes": cost["request_bytes"],
                             "callers": n, "backend_cpu_us": cost["cpu_us_per_call"],
                             "servers": {}}
                    rounds = {name: [] for name in names}
                    overheads = []
                    for _ in range(args.rounds):
                        for name, s, stream in measured:
                            load(s, stream, rpc, shape, n, min(1.0, args.duration_s))  # warm-up
                            rounds[name].append(load(s, stream, rpc, shape, n, args.duration_s))
                        overheads.append(rounds[names[0]][-1]["cpu_us_per_call"] / (
                            point["backend_cpu_us"] + rounds["echo"][-1]["cpu_us_per_call"]))
                    for name in names:
                        # Counts stay whole (the lower median); the rest are medians.
                        point["servers"][name] = {
                            key: (statistics.median_low if isinstance(value, int)
                                  else statistics.median)(r[key] for r in rounds[name])
                            for key, value in rounds[name][0].items()}
                        if args.rounds > 1:
                            point["servers"][name]["rounds"] = rounds[name]
                    # The answer is as large as the query for both rpcs (Attend: [B,H,L,D] as q).
                    point["response_bytes"] = (cost["request_bytes"] // 3 if rpc == "attend"
                                               else cost["request_bytes"])
                    point["overhead"] = statistics.median(overheads)
                    point["overhead_range"] = [min(overheads), max(overheads)]
                    points.append(point)
                    row = "  ".join(
                        f"{name} {x['req_per_s']:8.1f}/s {x['cpu_us_per_call']:8.1f}us "
                        f"{x['faults_per_call']:7.1f}f" for name, x in point["servers"].items())
                    spread = (f" ({min(overheads):.2f}-{max(overheads):.2f})"
                              if args.rounds > 1 else "")
                    print(f"{rpc:6s} {shape:10s} {point['request_bytes']:>9d} B  c={n}  backend "
                          f"{point['backend_cpu_us']:8.1f}us  {row}  overhead "
                          f"{point['overhead']:.2f}{spread}", flush=True)
        time.sleep(args.idle_s)
        idle = {s.name: {"fresh_mib": fresh[s.name], "after_idle_mib": rss_mib(s.process.pid)}
                for s in servers}
        for name, r in idle.items():
            print(f"{name}: RSS fresh {r['fresh_mib']:.0f} MiB, {args.idle_s:g} s after the load "
                  f"{r['after_idle_mib']:.0f} MiB ({r['after_idle_mib'] / r['fresh_mib']:.2f}x)")
    finally:
        for s in servers:
            s.stop()
    report = {"kind": "attnserve-serving-sweep",
              "title": "attnserve: serving overhead across request sizes",
              "command": " ".join(shlex.quote(a) for a in sys.argv),
              "machine": {**machine(), "notes": args.notes},
              "settings": {"duration_s": args.duration_s, "rounds": args.rounds,
                           "allocator": allocator,
                           "target_overhead": 1.25, "idle_s": args.idle_s, "rss": idle},
              "servers": names, "points": points}
    worst = max(points, key=lambda p: p["overhead"])
    print(f"\nworst overhead {worst['overhead']:.2f}: {worst['rpc']} [{worst['shape']}], "
          f"{worst['callers']} caller(s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        if args.html:
            subprocess.run([bench, f"--sweep_from={args.json}", f"--html={args.html}"],
                           check=True)


if __name__ == "__main__":
    main()
