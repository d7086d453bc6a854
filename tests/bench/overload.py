#!/usr/bin/python3
"""attnserve under overload, with a CPU quota as a Kubernetes CPU limit sets one.

The server runs in its own cgroup v1 `cpu` group (created under /sys/fs/cgroup/cpu, removed at
the end; needs root) limited to --cpu_quota cores. attnserve-bench is the load. For each case
(--cases: `attend`, Attend [1,8,128,64] float32, 768 KiB a call; `tiny`, MultiHeadAttention on
the demo module at L = 64, 16 KiB):
  1. capacity: closed loop at each of --concurrencies callers, --capacity_s seconds each, every
     call with a --deadline_ms deadline; the capacity is the best OK/s of a run in which no call
     failed (a rate measured while calls fail their deadlines is not a capacity);
  2. open loop at each of --overloads x capacity for --overload_s seconds, --deadline_ms
     deadlines, each on a fresh server (a phase that swamps the server must not leave its
     backlog to the next), once with raw callers (every call reaches the server) and once with throttling
     callers (attnserve-bench --throttle: the clients' adaptive throttling, client/throttle.h,
     honouring the server's retry pushback): goodput (OK per second, all within their deadline)
     as a fraction of capacity, over the phase and over its second half alone ("2nd half": a
     fresh client's throttle starts from its first answers; the OKs of each second are printed
     too), counts by code as the callers saw them (THROTTLED_BY_CLIENT and
     HELD_BY_PUSHBACK: rejected by the caller's own throttle, from its odds or during a server's
     retry pushback, never sent), the server's counts by code (from /metrics) beside them;
  3. after each open-loop phase: time from the end of the load to the first OK of lone calls
     sent one after another (each with a 1 s deadline);
  4. server RSS: fresh, after the capacity runs, peak during each overload phase (sampled every
     100 ms); and the time SIGTERM takes after each phase;
  5. the server's CPU seconds during each phase (under the quota: at most quota x seconds; "sys
     s" the kernel's share of them), its minor page faults ("faults") and context switches (all
     its threads', voluntary and involuntary: on a VM the costliest kernel work per call), and
     how many calls it answered after the load had ended, before SIGTERM ("after": the calls
     still in the connection's backlog, and the lone calls of 3.).

  sudo /usr/bin/python3 tests/bench/overload.py --build=build [--server=PATH] [--json=OUT]

Not run by CI (minutes, and root). Figures: tests/bench/OVERLOAD.md.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def process_costs(pid):
    """The process's CPU seconds (user + system), system CPU seconds, minor page faults and
    context switches (voluntary and involuntary, summed over its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    switches = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                switches += sum(int(n) for n in re.findall(r"^\w*voluntary_ctxt_switches:\s+(\d+)",
                                                           f.read(), re.M))
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / tick, "sys_s": int(fields[12]) / tick,
            "page_faults": int(fields[7]), "context_switches": switches}


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024
    except (FileNotFoundError, AttributeError):
        return float("nan")


class Cgroup:
    """A cgroup v1 cpu group limited to `cores` cores."""

    def __init__(self, cores):
        self.path = f"/sys/fs/cgroup/cpu/attnserve-overload-{os.getpid()}"
        os.mkdir(self.path)
        period_us = 100000
        with open(f"{self.path}/cpu.cfs_period_us", "w") as f:
            f.write(str(period_us))
        with open(f"{self.path}/cpu.cfs_quota_us", "w") as f:
            f.write(str(int(cores * period_us)))

    def close(self):
        # Only an empty group can be removed; the server has exited by now.
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def counts_by_code(metrics_port, rpc):
    """attnserve_requests_total of `rpc`, by code, as the server counts them, and
    attnserve_requests_dropped_total by reason."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for labels, value in re.findall(r'^attnserve_requests_total\{([^}]*)\} (\S+)$', text, re.M):
        if f'rpc="{rpc}"' not in labels:
            continue
        code = re.search(r'code="([^"]+)"', labels).group(1)
        out[code] = out.get(code, 0) + int(float(value))
    # Why calls were not computed (every rpc): "unmeetable" is the admission gate's refusal at
    # the headers, "deadline" an expiry in the queue.
    for reason, value in re.findall(
            r'^attnserve_requests_dropped_total\{reason="([^"]+)"\} (\S+)$', text, re.M):
        out[f"dropped:{reason}"] = int(float(value))
    return out


def answered(counts):
    """The calls answered, whatever their code, in counts_by_code's result (drops left out)."""
    return sum(v for k, v in counts.items() if not k.startswith("dropped:"))


CASES = {
    "attend": ["--rpc=attend", "--shapes=1,8,128,64"],
    "tiny": ["--rpc=mha", "--module=demo", "--shapes=1,64"],
}
RPC_NAMES = {"attend": "Attend", "tiny": "MultiHeadAttention"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--server", default="", help="attnserve binary (default BUILD/server/attnserve)")
    ap.add_argument("--cpu_quota", type=float, default=0.1)
    ap.add_argument("--cases", default="attend,tiny")
    ap.add_argument("--concurrencies", default="1,2,4,8")
    ap.add_argument("--capacity_s", type=int, default=8)
    ap.add_argument("--capacity", type=float, default=0,
                    help="OK/s: skip the closed-loop sweep and take this as the capacity (A/B "
                         "runs of two servers against one offered rate)")
    ap.add_argument("--overload_s", type=int, default=20)
    ap.add_argument("--overloads", default="3,10")
    ap.add_argument("--throttling", default="off,on", help="callers without, with throttling")
    ap.add_argument("--deadline_ms", type=int, default=200)
    ap.add_argument("--server_flags", default="--max_queued_requests=64")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    bench = os.path.join(args.build, "client/bench/attnserve-bench")
    server_bin = args.server or os.path.join(args.build, "server/attnserve")
    report = {"server": server_bin, "cpu_quota": args.cpu_quota,
              "deadline_ms": args.deadline_ms, "server_flags": args.server_flags, "cases": {}}
    for case in args.cases.split(","):
        report["cases"][case] = run_case(args, bench, server_bin, CASES[case], RPC_NAMES[case])
    print(f"server {server_bin}, cgroup cpu quota {args.cpu_quota} core, {args.deadline_ms} ms "
          f"deadlines, {args.server_flags}")
    for case, r in report["cases"].items():
        print(f"\n{case} ({' '.join(CASES[case])})")
        for c in r["capacity_runs"]:
            print(f"  closed loop, {c['concurrency']:2d} callers: {c['ok_per_s']:7.1f} OK/s, "
                  f"{c['failed']} failed, p99 {c['p99_ms']:.1f} ms")
        print(f"  capacity: {r['capacity']:.1f} OK/s ({r['capacity_from']})")
        print(f"  {'load':>5} {'throttle':>8} {'rate/s':>7} {'sent':>7} {'goodput/s':>9} "
              f"{'of cap.':>7} {'2nd half':>8} {'p99 ms':>7} {'RSS peak':>8} {'1st lone OK':>11} "
              f"{'CPU s':>6} {'sys s':>5} {'faults':>7} {'switches':>8} {'after':>7}  "
              "client codes | server codes")
        for o in r["overload"]:
            print(f"  {o['factor']:4g}x {o['throttle']:>8} {o['rate']:7.0f} {o['sent']:7d} "
                  f"{o['goodput_ok_per_s']:9.1f} {o['goodput_fraction']:7.2f} "
                  f"{o['second_half_fraction']:8.2f} {o['p99_ms']:7.1f} "
                  f"{o['rss_peak_mb']:6.0f}MB {o['first_lone_ok_s']:10.2f}s "
                  f"{o['server_cpu_s']:6.2f} {o['server_sys_s']:5.2f} {o['server_page_faults']:7d} "
                  f"{o['server_context_switches']:8d} "
                  f"{o['answered_after_load']:7d}  {o['client_codes']} | "
                  f"{o['server_codes_incl_lone_calls']}")
        print(f"  RSS fresh {r['rss_idle_mb']:.0f} MB, after the capacity runs "
              f"{r['rss_after_capacity_mb']:.0f} MB; each open-loop phase on a fresh server, "
              f"SIGTERM after it: " + ", ".join(f"{o['sigterm_exit_s']} s (code {o['exit_code']})"
                                                for o in r["overload"]))
        for o in r["overload"]:
            print(f"  {o['factor']:g}x {o['throttle']}: OK by second: "
                  + " ".join(str(n) for n in o["ok_by_second"]))
            for line in o["drain_log"]:
                print(f"  {o['factor']:g}x {o['throttle']}: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


class Server:
    """attnserve in its own cgroup v1 cpu group limited to `cores`."""

    def __init__(self, server_bin, cores, flags):
        self.tmp = tempfile.TemporaryDirectory()
        self.cgroup = Cgroup(cores)
        port_file = os.path.join(self.tmp.name, "port")
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+")
        # The shell joins the cgroup, then becomes the server: every thread it starts is inside.
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", f'echo $$ > {self.cgroup.path}/cgroup.procs && exec "$0" "$@"',
             server_bin, "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
             f"--port_file={port_file}", "--backend=cpu", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1200):
            if os.path.exists(port_file) or self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        self.target = f"127.0.0.1:{int(open(port_file).read())}"
        self.metrics_port = int(re.search(r"metrics on port (\d+)", self.log.read()).group(1))
        time.sleep(1)
        self.rss_fresh_mb = rss_mb(self.process.pid)

    def stop(self):
        """SIGTERM; seconds until the process exited (or ">60") and its exit code."""
        t = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
            took = round(time.monotonic() - t, 2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            took = ">60"
        self.cgroup.close()
        self.log.seek(0)
        text = self.log.read()
        # What the server said while it drained (from the signal on).
        self.drain_log = text[text.find("received"):].splitlines()[1:] if "received" in text else []
        self.log.close()
        self.tmp.cleanup()
        return took, self.process.returncode


def run_case(args, bench, server_bin, case_flags, rpc_name):
    """The capacity on one server, then each open-loop phase on a fresh one: a phase that swamps
    the server must not leave its backlog to the next."""
    tmp = tempfile.TemporaryDirectory()
    flags = args.server_flags.split()

    def run_bench(server, name, *bench_flags):
        out = os.path.join(tmp.name, name + ".json")
        subprocess.run([bench, f"--target={server.target}", *case_flags, "--progress=off",
                        f"--json={out}", *bench_flags], stdout=subprocess.DEVNULL, check=False)
        with open(out) as f:
            return json.load(f)["phases"][0]

    def first_lone_ok(server, stopped_at):
        """Seconds from `stopped_at` to the first OK of one-at-a-time calls."""
        while time.monotonic() - stopped_at < 300:
            p = run_bench(server, "lone", "--mode=closed", "--concurrency=1", "--requests=1",
                          "--warmup_s=0", "--timeout_ms=1000")
            if p["ok"] == 1:
                return time.monotonic() - stopped_at
        return float("inf")

    report = {}
    server = Server(server_bin, args.cpu_quota, flags)
    report["rss_idle_mb"] = server.rss_fresh_mb
    runs = []
    for n in [] if args.capacity else [int(x) for x in args.concurrencies.split(",")]:
        cap = run_bench(server, f"capacity{n}", "--mode=closed", f"--concurrency={n}",
                        "--warmup_s=2", f"--duration_s={args.capacity_s}",
                        f"--timeout_ms={args.deadline_ms}")
        runs.append({"concurrency": n, "ok_per_s": cap["ok"] / cap["elapsed_s"],
                     "sent": cap["sent"], "ok": cap["ok"], "failed": cap["sent"] - cap["ok"],
                     "errors": cap["errors"], "p99_ms": cap["latency_ms"]["p99"]})
    report["capacity_runs"] = runs
    if args.capacity:
        report["capacity"] = capacity = args.capacity
        report["capacity_from"] = "given: --capacity"
    else:
        clean = [r for r in runs if r["failed"] == 0]
        best = max(clean or runs, key=lambda r: r["ok_per_s"])
        report["capacity"] = capacity = best["ok_per_s"]
        report["capacity_from"] = (f"{best['concurrency']} callers, no call failed" if clean else
                                   f"{best['concurrency']} callers; EVERY run had failed calls")
    report["rss_after_capacity_mb"] = rss_mb(server.process.pid)
    report["sigterm_exit_s"], report["exit_code"] = server.stop()
    report["overload"] = []
    for factor in [float(x) for x in args.overloads.split(",")]:
        for throttle in args.throttling.split(","):
            server = Server(server_bin, args.cpu_quota, flags)
            before = counts_by_code(server.metrics_port, rpc_name)
            peak = [0.0]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    peak[0] = max(peak[0], rss_mb(server.process.pid))
                    time.sleep(0.1)
            sampler = threading.Thread(target=sample)
            sampler.start()
            costs0 = process_costs(server.process.pid)
            rate = factor * capacity
            p = run_bench(server, f"open{factor:g}{throttle}", "--mode=open",
                          f"--rate={rate:.0f}", "--warmup_s=0", f"--duration_s={args.overload_s}",
                          f"--timeout_ms={args.deadline_ms}",
                          f"--throttle={'true' if throttle == 'on' else 'false'}")
            stopped = time.monotonic()
            costs1 = process_costs(server.process.pid)
            at_end = counts_by_code(server.metrics_port, rpc_name)
            rss_at_end = rss_mb(server.process.pid)
            lone = first_lone_ok(server, stopped)
            done.set()
            sampler.join()
            after = counts_by_code(server.metrics_port, rpc_name)
            server_counts = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            server_counts = {k: v for k, v in server_counts.items() if v}
            # Calls the server answered after the load had ended: the connection's backlog (and
            # the lone calls, a few).
            answered_after = answered(after) - answered(at_end)
            goodput = p["ok"] / args.overload_s
            # The phase's second half alone: a fresh client's throttle starts from its first
            # answers, so the first seconds are a transient the whole-phase figure includes.
            series = p.get("series", {})
            half = args.overload_s / 2
            late_ok = sum(ok for t, ok in zip(series.get("t_s", []), series.get("ok", []))
                          if t >= half)
            exit_s, code = server.stop()
            report["overload"].append({
                "factor": factor, "throttle": throttle, "rate": rate, "sent": p["sent"],
                "client_codes": dict(p["errors"], OK=p["ok"]),
                "server_codes_incl_lone_calls": server_counts,
                "goodput_ok_per_s": goodput, "goodput_fraction": goodput / capacity,
                "second_half_fraction": late_ok / (args.overload_s - half) / capacity,
                "ok_by_second": series.get("ok", []),
                "p99_ms": p["latency_ms"]["p99"], "rss_fresh_mb": server.rss_fresh_mb,
                "rss_peak_mb": max(peak[0], rss_at_end), "rss_at_end_mb": rss_at_end,
                **{f"server_{k}": round(costs1[k] - v, 2) for k, v in costs0.items()},
                "answered_after_load": answered_after,
                "first_lone_ok_s": lone, "sigterm_exit_s": exit_s, "exit_code": code,
                "drain_log": server.drain_log})
    tmp.cleanup()
    return report


if __name__ == "__main__":
    sys.exit(main())
