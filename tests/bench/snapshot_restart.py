#!/usr/bin/python3
"""The cost of a restart with --session_snapshot_dir (issue 33's target: a snapshot of 1 GB back
and answering within 5 s of the process start). tests/bench/SNAPSHOT.md has the figures.

A server (CPU backend, a 2 GiB pool) gets SESSIONS raw sessions of TOKENS tokens each (16 kv
heads of 64, float32 cache: 8 KiB a token, so 128 x 1024 tokens fill 1 GiB of pages), prefilled
from a few callers; then SIGTERM (the drain writes the snapshot: its time and size from the log
line), a new process with the same directory and owner, and the time from its start to the first
answered step of a restored session, and from its start to every session's first step.

    tests/bench/snapshot_restart.py [--build=build] [--sessions=128] [--tokens=1024]
        [--dir=DIR (default: a temporary directory under /var/tmp, on disk)] [--no_prefault]
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import numpy as np  # noqa: E402

import attnserve  # noqa: E402


def start(binary, flags, log_path):
    port_file = log_path + ".port"
    if os.path.exists(port_file):
        os.remove(port_file)
    t0 = time.monotonic()
    log = open(log_path, "w")
    p = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                          "--metrics_address=", *flags], stdout=log, stderr=subprocess.STDOUT)
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        if p.poll() is not None:
            raise RuntimeError(open(log_path).read())
        time.sleep(0.005)
    return p, t0, f"127.0.0.1:{int(open(port_file).read())}"


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sessions", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--dir", default="")
    ap.add_argument("--no_prefault", dest="prefault", action="store_false")
    a = ap.parse_args()
    binary = os.path.join(a.build, "server", "attnserve")
    work = a.dir or tempfile.mkdtemp(prefix="attnserve_snapshot_", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    flags = ["--backend=cpu", "--backend_threads=2", "--session_pool_bytes=2147483648",
             f"--session_snapshot_dir={work}", "--session_owner=bench"]
    heads, d = 16, 64
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((a.tokens, heads, d)).astype(np.float32) for _ in range(3))
    step = [x[:1] for x in (q, k, v)]
    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    print(f"{cpu}, {os.cpu_count()} CPUs; snapshot in {work}")

    server, _, target = start(binary, flags, os.path.join(work, "first.log"))
    ids = []
    try:
        with attnserve.Client(target) as c:
            def make(_):
                s = c.create_session(layout=attnserve.layout(heads, d), timeout=600)
                s.extend(q, k, v, timeout=600)
                return s.id
            t = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                ids = list(pool.map(make, range(a.sessions)))
            usage = c.list_sessions().usage
            print(f"prefilled {len(ids)} sessions x {a.tokens} tokens in "
                  f"{time.monotonic() - t:.1f} s: {usage.pages_used} pages, "
                  f"server RSS {rss_mb(server.pid):.0f} MB")
    finally:
        t = time.monotonic()
        server.terminate()
        server.wait()
    drain_s = time.monotonic() - t
    first_log = open(os.path.join(work, "first.log")).read()
    wrote = re.search(r"wrote .*", first_log)
    size = os.path.getsize(os.path.join(work, "sessions.snapshot"))
    print(f"SIGTERM to exit: {drain_s:.2f} s; {wrote.group(0) if wrote else first_log[-300:]}")
    print(f"snapshot: {size / 2**20:.0f} MiB")

    # Drop the file from the page cache, as after a reboot (best effort: needs root).
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        cold = "cold page cache"
    except OSError:
        cold = "warm page cache (not root)"
    # On the VMs this project runs on, the first touch of guest memory the host has not backed
    # yet costs about 9 s a GiB (the kernel's clear_page; 0.2 s once backed): a restart pays
    # it for the pages whatever the snapshot's design. Touching as much in a throwaway process
    # first separates the two (--no_prefault measures both together).
    if a.prefault:
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", "import numpy; numpy.ones(3 << 28, numpy.float32)"],
                       check=True)
        print(f"first touch of 3 GiB in a throwaway process: {time.monotonic() - t:.2f} s")
    server, t0, target = start(binary, flags, os.path.join(work, "second.log"))
    try:
        with attnserve.Client(target) as c:
            info = c.stub.GetSession(attnserve.pb.GetSessionRequest(session_id=ids[0])).session
            attnserve.Session(c, info).extend(*step)
            first_s = time.monotonic() - t0
            for sid in ids[1:]:
                info = c.stub.GetSession(attnserve.pb.GetSessionRequest(session_id=sid)).session
                attnserve.Session(c, info).extend(*step)
            all_s = time.monotonic() - t0
        second_log = open(os.path.join(work, "second.log")).read()
        restored = re.search(r"restored .*", second_log)
        print(f"restart ({cold}): first restored session answered {first_s:.2f} s after the "
              f"process start, all {len(ids)} after {all_s:.2f} s; "
              f"{restored.group(0) if restored else second_log[-300:]}; "
              f"server RSS {rss_mb(server.pid):.0f} MB")
    finally:
        server.terminate()
        server.wait()
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
