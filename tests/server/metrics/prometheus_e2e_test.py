#!/usr/bin/python3
"""A real Prometheus server on loopback scrapes the metrics endpoint (serve_for_prometheus, a
stand-in for attnserve with a known set of requests); through Prometheus's HTTP API the
request counter equals the number recorded, histogram_quantile(0.99, ...) over the server-time
buckets is finite and inside the recorded range (widened to the enclosing bucket bounds), and
the host memory gauges are non-zero. Everything is started and stopped here; readiness is
polled, never slept on.

Usage: prometheus_e2e_test.py SERVE_FOR_PROMETHEUS_BINARY
Exit: 0 ok, 1 failure, 77 (ctest's SKIP_RETURN_CODE) when the prometheus binary is missing.
"""
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

REQUESTS = 1000
DEADLINE_S = 60


def free_port():
    # Bound then released: a small race with other processes, acceptable on a test machine.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def query(base, expr):
    status, body = get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    result = json.loads(body)
    if result["status"] != "success":
        raise RuntimeError(f"query {expr!r}: {body}")
    return [float(sample["value"][1]) for sample in result["data"]["result"]]


def poll(what, check, deadline):
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last is not None:
                return last
        except (OSError, RuntimeError) as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not reached in {DEADLINE_S}s; last: {last}")


def main():
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("SKIP: prometheus not found; install Debian's 'prometheus' package")
        return 77
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen([sys.argv[1], str(REQUESTS)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        prom = None
        try:
            line = server.stdout.readline().strip()
            if not line.startswith("port="):
                print(f"FAIL: serve_for_prometheus printed {line!r}")
                return 1
            target = f"127.0.0.1:{line[5:]}"
            config = os.path.join(tmp, "prometheus.yml")
            with open(config, "w") as f:
                f.write("global:\n  scrape_interval: 1s\n"
                        "scrape_configs:\n  - job_name: attnserve\n"
                        f"    static_configs:\n      - targets: ['{target}']\n")
            web = f"127.0.0.1:{free_port()}"
            base = f"http://{web}"
            prom = subprocess.Popen(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
                 f"--web.listen-address={web}"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prom.log"), "w"))
            poll("prometheus ready", lambda: get(base + "/-/ready")[0] == 200 or None, deadline)

            selector = 'job="attnserve",rpc="Attend"'
            count = poll("request counter scraped",
                         lambda: query(base, f'attnserve_requests_total{{{selector},code="OK"}}')
                         or None, deadline)
            if count != [REQUESTS]:
                print(f"FAIL: attnserve_requests_total = {count}, sent {REQUESTS}")
                return 1
            p99 = query(base, "histogram_quantile(0.99, sum by (le) ("
                        f"attnserve_request_duration_seconds_bucket{{{selector}}}))")
            # Recorded times span [1 ms, 3 ms]; the estimate interpolates inside the buckets
            # holding them, (0.8 ms, 1.6 ms] ... (1.6 ms, 3.2 ms].
            if len(p99) != 1 or not math.isfinite(p99[0]) or not 0.0008 <= p99[0] <= 0.0032:
                print(f"FAIL: p99 = {p99}, expected a finite value in [0.8ms, 3.2ms]")
                return 1
            for gauge in ("attnserve_host_resident_memory_bytes",
                          "attnserve_host_memory_limit_bytes", "attnserve_module_bytes"):
                values = query(base, f'{gauge}{{job="attnserve"}}')
                if len(values) != 1 or values[0] <= 0:
                    print(f"FAIL: {gauge} = {values}")
                    return 1
            up = query(base, 'up{job="attnserve"}')
            print(f"OK: counter {count[0]:.0f}, p99 {p99[0] * 1e3:.3f} ms, up {up}")
            return 0
        finally:
            if prom is not None:
                prom.terminate()
                prom.wait(timeout=30)
            server.stdin.close()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
