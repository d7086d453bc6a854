#!/usr/bin/python3
"""What moving decode sessions between replicas costs (issue 33). tests/bench/MOVES.md has the
figures and the machine.

throughput: replica A (--session_peers=B) holds SESSIONS raw sessions of TOKENS tokens (16 kv
  heads of 64, float32 cache: 8 KiB a token); an operator moves each to B by MoveSession, one
  after the other: the first half into B's cold pool (memory touched for the first time: on
  this project's VMs that costs ~10 s a GiB, whatever moves into it), the second half into a
  warm one (pages of closed sessions, kept: --idle_release_ms=0); then A's drain (SIGTERM)
  moves another half set into the warm pool. Reported: bytes, the rate (bytes over the
  MoveSession calls' time, as the operator's client sees it), each session's pause
  (MoveSession's pause_us: the switch, while its calls are told it is moving; the pre-copy of
  its filled pages comes before) and the drain's own log line. Issue 33's target: 1 GB/s over
  loopback.

rolling: three replicas on fixed ports, each with the other two as --session_peers, hold
  SESSIONS sessions of TOKENS tokens (float16 cache) under a continuous decode load (one
  thread per session, each step with expected_length, through one client of all three that
  follows moves); then a rolling restart: SIGTERM each replica in turn (its drain moves its
  sessions to the others), start a new process on the same address, wait until it serves, go
  to the next. Reported: sessions lost (issue 33's target: none), steps whose output differs
  from the same session's steps replayed afterwards on a replica that never stopped (target:
  none, bit for bit), and the p50/p99/max step latency during the steady phase and during the
  restarts (target: p99 during the restarts at most 5x the steady p99).

    tests/bench/session_moves.py throughput [--sessions=64] [--tokens=1024]
    tests/bench/session_moves.py rolling [--sessions=48] [--tokens=4096] [--steady_s=5]
    (both: [--build=build] [--no_prefault])
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import grpc  # noqa: E402
import numpy as np  # noqa: E402

import attnserve  # noqa: E402

pb = attnserve.pb


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """One attnserve process on a fixed address; start() again after stop() is a restart."""

    def __init__(self, binary, port, flags, work, name):
        self.binary, self.port, self.flags, self.work, self.name = binary, port, flags, work, name
        self.address = f"127.0.0.1:{port}"
        self.process = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.log_path = os.path.join(self.work, f"{self.name}.{self.starts}.log")
        self.process = subprocess.Popen(
            [self.binary, f"--listen={self.address}", "--metrics_address=", *self.flags],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(channel).result(timeout=60)
        finally:
            channel.close()

    def stop(self):
        """SIGTERM (the drain moves the sessions) and the exit; the drain's log line."""
        t = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=600)
        took = time.monotonic() - t
        moved = re.search(r"moved \d+ sessions.*", open(self.log_path).read())
        return took, moved.group(0) if moved else "(no move line)"


def prefault(gib):
    """On the VMs this project runs on, the first touch of guest memory the host has not backed
    costs ~9.5 s a GiB (SNAPSHOT.md): touched once in a throwaway process, later first touches
    in the servers cost what they cost on any machine."""
    t = time.monotonic()
    subprocess.run([sys.executable, "-c",
                    f"import numpy; numpy.ones({int(gib * (1 << 28))}, numpy.float32)"],
                   check=True)
    print(f"first touch of {gib:g} GiB in a throwaway process: {time.monotonic() - t:.2f} s")


def percentiles(xs):
    if not xs:
        return "none"
    a = np.array(xs) * 1e3
    return (f"p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, "
            f"max {a.max():.2f} ms ({len(xs)} steps)")


def throughput(a, binary, work):
    heads, d = 16, 64
    pool = 2 * a.sessions * a.tokens * heads * d * 4 * 2 + (64 << 20)
    flags = ["--backend=cpu", "--backend_threads=2", f"--session_pool_bytes={pool}"]
    # B keeps its pool's memory once touched (no idle release), so that a warm pool can be
    # measured apart from a cold one.
    b = Replica(binary, free_port(), flags + ["--idle_release_ms=0"], work, "b")
    b.start()
    ra = Replica(binary, free_port(), flags + [f"--session_peers={b.address}"], work, "a")
    ra.start()
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((a.tokens, heads, d)).astype(np.float32) for _ in range(3))
    try:
        with attnserve.Client(ra.address, timeout=600) as c:
            def make():
                s = c.create_session(layout=attnserve.layout(heads, d), timeout=600)
                s.extend(q, k, v, timeout=600)
                return s.id
            t = time.monotonic()
            first = [make() for _ in range(a.sessions)]
            second = [make() for _ in range(a.sessions // 2)]  # for the drain
            print(f"prefilled {len(first) + len(second)} sessions x {a.tokens} tokens on A in "
                  f"{time.monotonic() - t:.1f} s")
            def move(ids, what):
                moved_bytes, pauses, walls = 0, [], []
                for sid in ids:
                    t = time.monotonic()
                    r = c.stub.MoveSession(pb.MoveSessionRequest(session_id=sid, peer=b.address),
                                           timeout=600)
                    walls.append(time.monotonic() - t)
                    moved_bytes += r.bytes
                    pauses.append(r.pause_us / 1e6)
                print(f"MoveSession x {len(ids)}, {what}: {moved_bytes / 2**20:.0f} MiB, "
                      f"{moved_bytes / sum(walls) / 1e9:.2f} GB/s over the rpcs (rpc p50 "
                      f"{np.median(walls) * 1e3:.1f} ms; the switch's pause p50 "
                      f"{np.median(pauses) * 1e3:.2f} ms, max {max(pauses) * 1e3:.2f} ms)")
            half = len(first) // 2
            move(first[:half], "into B's cold pool (its memory touched for the first time)")
            # B's pool warmed: the sessions moved there closed, their pages kept for reuse.
            with attnserve.Client(b.address, timeout=600) as cb:
                for info in cb.list_sessions(page_size=1000).sessions:
                    cb.stub.CloseSession(pb.CloseSessionRequest(session_id=info.session_id))
            move(first[half:], "into B's warm pool (pages freed by closed sessions)")
            with attnserve.Client(b.address, timeout=600) as cb:
                for info in cb.list_sessions(page_size=1000).sessions:
                    cb.stub.CloseSession(pb.CloseSessionRequest(session_id=info.session_id))
        took, line = ra.stop()
        print(f"A's drain into B's warm pool (SIGTERM to exit {took:.2f} s): {line}")
    finally:
        for r in (ra, b):
            if r.process and r.process.poll() is None:
                r.process.kill()


class Load:
    """One thread per session: a decode step after another, each with expected_length, every
    output kept (for the replay) with its latency and its time."""

    def __init__(self, client, sessions, steps, heads, d):
        self.client, self.sessions, self.steps = client, sessions, steps
        self.latency = []  # (end time, seconds)
        self.outputs = {i: [] for i in range(len(sessions))}
        self.errors = []
        self.retried = {}  # code -> steps answered so and sent again
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(len(sessions))]

    def run(self, i):
        s = self.sessions[i]
        q, k, v = self.steps[i]
        n = 0
        while not self.stop.is_set() and n < len(q):
            t = time.monotonic()
            try:
                out = s.extend(q[n:n + 1], k[n:n + 1], v[n:n + 1], timeout=120)
            except grpc.RpcError as e:
                # The caller's retry, as any caller's; safe (each step carries expected_length).
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    with self.lock:
                        self.retried[e.code().name] = self.retried.get(e.code().name, 0) + 1
                    time.sleep(0.01)
                    continue
                with self.lock:
                    self.errors.append(f"session {i}: {e.code()} {e.details()}")
                return
            end = time.monotonic()
            with self.lock:
                self.latency.append((end, end - t))
            self.outputs[i].append(np.array(out.output, copy=True))
            n += 1

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def rolling(a, binary, work):
    heads, d = 8, 64
    rng = np.random.default_rng(2)
    per_session = a.tokens * heads * d * 2 * 2
    pool = a.sessions * per_session * 2 + (256 << 20)  # room for every session on two replicas
    ports = [free_port() for _ in range(3)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    replicas = []
    for i, p in enumerate(ports):
        peers = ",".join(x for j, x in enumerate(addresses) if j != i)
        replicas.append(Replica(binary, p, ["--backend=cpu", "--backend_threads=1",
                                            f"--session_pool_bytes={pool}",
                                            f"--session_peers={peers}",
                                            "--shutdown_grace_ms=60000"], work, f"r{i}"))
    for r in replicas:
        r.start()
    steps_per_session = 100000
    prompts = [tuple(rng.standard_normal((a.tokens, n, d)).astype(np.float16)
                     for n in (heads, heads, heads)) for _ in range(a.sessions)]
    steps = [tuple(rng.standard_normal((steps_per_session // 100, n, d)).astype(np.float16)
                   for n in (heads, heads, heads)) for _ in range(a.sessions)]
    try:
        with attnserve.Client(addresses, timeout=600) as c:
            t = time.monotonic()
            sessions = []
            for i in range(a.sessions):
                s = c.create_session(layout=attnserve.layout(heads, d), cache_dtype="float16",
                                     timeout=600)
                s.extend(*prompts[i], timeout=600)
                sessions.append(s)
            print(f"prefilled {a.sessions} sessions x {a.tokens} tokens (float16, {heads} kv "
                  f"heads of {d}: {per_session / 2**20:.0f} MiB each) over 3 replicas in "
                  f"{time.monotonic() - t:.1f} s")
            load = Load(c, sessions, steps, heads, d)
            load.start()
            time.sleep(a.steady_s)
            steady_end = time.monotonic()
            for r in replicas:
                took, line = r.stop()
                print(f"{r.name}: SIGTERM to exit {took:.2f} s: {line}")
                r.start()
            restart_end = time.monotonic()
            time.sleep(1)
            load.join()
            steady = [x for end, x in load.latency if end <= steady_end]
            during = [x for end, x in load.latency if steady_end < end <= restart_end]
            print(f"steady:   {percentiles(steady)}")
            print(f"restarts: {percentiles(during)} over {restart_end - steady_end:.1f} s")
            print(f"sessions lost or failed: {len(load.errors)}"
                  + (f" (first: {load.errors[0]})" if load.errors else "")
                  + f"; steps sent again after an answer of {load.retried or 'none'}")
            # The same steps replayed on one replica that never stopped during them: bit for bit.
            differ = 0
            with attnserve.Client(addresses[0], timeout=600) as ref:
                for i in range(a.sessions):
                    n = len(load.outputs[i])
                    s = ref.create_session(layout=attnserve.layout(heads, d),
                                           cache_dtype="float16", timeout=600)
                    s.extend(*prompts[i], timeout=600)
                    q, k, v = steps[i]
                    for j in range(n):
                        out = s.extend(q[j:j + 1], k[j:j + 1], v[j:j + 1], timeout=120)
                        if not np.array_equal(np.array(out.output), load.outputs[i][j]):
                            differ += 1
                    s.close()
            total = sum(len(o) for o in load.outputs.values())
            print(f"steps replayed on a replica that never stopped: {total}, differing: {differ}")
    finally:
        for r in replicas:
            if r.process and r.process.poll() is None:
                r.process.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["throughput", "rolling"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sessions", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--steady_s", type=float, default=5)
    ap.add_argument("--no_prefault", dest="prefault", action="store_false")
    a = ap.parse_args()
    binary = os.path.join(a.build, "server", "attnserve")
    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    print(f"{cpu}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="attnserve_moves_") as work:
        if a.mode == "throughput":
            a.sessions = a.sessions or 64
            a.tokens = a.tokens or 1024
            if a.prefault:
                prefault(2 * a.sessions * a.tokens * 8192 * 2 / 2**30 + 0.5)
            throughput(a, binary, work)
        else:
            a.sessions = a.sessions or 48
            a.tokens = a.tokens or 4096
            if a.prefault:
                prefault(3 * a.sessions * a.tokens * 8 * 64 * 4 / 2**30 + 0.5)
            rolling(a, binary, work)


if __name__ == "__main__":
    main()
