"""The metrics of a live attnserve, checked by promtool and by a real Prometheus server.

  * `promtool check metrics` passes on a scrape of the real server's /metrics after requests.
  * A Prometheus started here (loopback, scrape interval 1 s) scrapes the server while the test
    drives a known number of Attend requests, valid and INVALID_ARGUMENT; through Prometheus's
    HTTP API the counters equal what was sent, histogram_quantile(0.99, ...) over the server-time
    histogram is finite and inside the range the client saw (widened to the enclosing bucket
    bounds), and the memory gauges are non-zero.
  * While several threads keep the server busy, /metrics answers every scrape promptly with a
    well-formed exposition whose request counter only grows, and ends equal to the answers.

Everything is started and stopped here; readiness and scrapes are polled for, never slept on.
Only 127.0.0.1 is contacted. Run as a script, it exits 77 (ctest's SKIP_RETURN_CODE) when
prometheus or promtool is missing; under `python3 -m unittest` those tests are skipped instead.
"""
import bisect
import collections
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from concurrent import futures

import grpc
import numpy as np

sys.path.insert(0, os.environ["ATTNSERVE_STUBS"])
from attnserve.v1 import attention_pb2 as pb  # noqa: E402
from attnserve.v1 import attention_pb2_grpc as pb_grpc  # noqa: E402

from live_server import LiveServer  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING_TOOLS = "install Debian's 'prometheus' package (prometheus and promtool)"

# Upper bounds of attnserve_request_duration_seconds (server/metrics/metrics.h): 25 us * 2^k.
DURATION_BOUNDS = [25e-6 * 2**k for k in range(21)]
RPC_TIMEOUT_S = 30  # generous: a request the client gave up on would make the counts ambiguous
POLL_TIMEOUT_S = 30


def free_port():
    # Bound then released: another process may take it before the user binds it, so callers
    # retry on a new port when binding fails.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what, check, timeout_s=POLL_TIMEOUT_S, interval_s=0.1):
    """check() until it returns something other than None; TimeoutError with the last result."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = check()
            if last is not None:
                return last
        except (OSError, ValueError, KeyError) as e:  # not up yet, or an incomplete answer
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not reached within {timeout_s}s; last: {last!r}")
        time.sleep(interval_s)


def http_get(url, timeout_s=5):
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.status, response.read().decode()


@contextlib.contextmanager
def attnserve_with_metrics():
    """A LiveServer whose /metrics listens on a free loopback port; yields (server, port)."""
    for attempt in range(5):
        port = free_port()
        try:
            server = LiveServer(f"--metrics_address=127.0.0.1:{port}")
            break
        except RuntimeError as e:  # exited at start-up: retry only if the port was taken
            if "cannot serve metrics" not in str(e) or attempt == 4:
                raise
    try:
        yield server, port
    finally:
        code = server.stop()
        assert code == 0, f"attnserve exited {code} after SIGTERM"


@contextlib.contextmanager
def prometheus_scraping(metrics_port):
    """A Prometheus on a free loopback port scraping 127.0.0.1:metrics_port every second, its
    data in a temporary directory; yields its base URL once /-/ready answers 200."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: attnserve\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n")
        log_path = os.path.join(tmp, "prometheus.log")
        for attempt in range(5):
            web = f"127.0.0.1:{free_port()}"
            with open(log_path, "w") as log:
                prom = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={config}",
                     f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                     f"--web.listen-address={web}", "--web.enable-lifecycle"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                def ready():
                    if prom.poll() is not None:
                        raise RuntimeError(f"prometheus exited with {prom.returncode}")
                    return http_get(f"http://{web}/-/ready", timeout_s=2)[0] == 200 or None
                poll("prometheus /-/ready", ready)
                break
            except BaseException as e:
                prom.kill()
                prom.wait()
                with open(log_path) as log:
                    text = log.read()
                # Retry only when the web port was taken between free_port() and the bind.
                if not (isinstance(e, RuntimeError) and "address already in use" in text
                        and attempt < 4):
                    raise RuntimeError(f"prometheus did not start: {e}\n{text}") from e
        try:
            yield f"http://{web}"
        finally:
            prom.terminate()
            try:
                prom.wait(timeout=30)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()


def query(base, expr):
    """An instant query; {frozenset(labels.items()): (sample_time_s, value)}."""
    _, body = http_get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    if answer["status"] != "success":
        raise ValueError(f"query {expr!r}: {body}")
    return {frozenset(r["metric"].items()): float(r["value"][1])
            for r in answer["data"]["result"]}


def single(base, expr):
    """The one value of an instant query; a ValueError when it has none or several."""
    values = list(query(base, expr).values())
    if len(values) != 1:
        raise ValueError(f"{expr}: {len(values)} series")
    return values[0]


# The text exposition format 0.0.4: `name{label="value",...} value [timestamp]`.
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_exposition(text):
    """Samples {(name, frozenset(labels)): value} and types {family: type} of a scrape; raises
    AssertionError on a malformed line and checks every histogram's buckets for consistency."""
    samples, types = {}, {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed sample line {line!r}"
        name, label_text, value = m.group(1), m.group(2) or "", m.group(3)
        labels, pos = {}, 0
        while pos < len(label_text):
            lm = _LABEL.match(label_text, pos)
            assert lm and lm.end() > pos, f"malformed labels in {line!r}"
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)  # ValueError on a malformed number
    for family, kind in types.items():
        if kind != "histogram":
            continue
        buckets = {}
        for (name, labels), value in samples.items():
            if name == family + "_bucket":
                rest = frozenset(kv for kv in labels if kv[0] != "le")
                le = float(dict(labels)["le"])
                buckets.setdefault(rest, []).append((le, value))
        for rest, series in buckets.items():
            series.sort()
            counts = [v for _, v in series]
            assert counts == sorted(counts), f"{family}{dict(rest)}: buckets not cumulative"
            assert series[-1][0] == math.inf, f"{family}{dict(rest)}: no +Inf bucket"
            assert samples[(family + "_count", rest)] == counts[-1], \
                f"{family}{dict(rest)}: _count != +Inf bucket"
            assert (family + "_sum", rest) in samples, f"{family}{dict(rest)}: no _sum"
    return samples, types


def total(samples, name, **match):
    """Sum of the samples of `name` whose labels include `match`."""
    want = set(match.items())
    return sum(v for (n, labels), v in samples.items() if n == name and want <= labels)


def tensor(array):
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(array.shape),
                     data=np.ascontiguousarray(array, dtype="<f4").tobytes())


def attend_requests():
    """(valid, invalid) small Attend requests; the invalid one has mismatched head dims.

    Big enough that the server time of a valid one (about 0.1 ms on the reference backend)
    lies above the first buckets, which gives the p99 check a lower bound with teeth."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, 32, 32), dtype=np.float32)
    kv = rng.standard_normal((1, 2, 32, 32), dtype=np.float32)
    valid = pb.AttendRequest(query=tensor(q), key=tensor(kv), value=tensor(kv))
    bad_kv = np.zeros((1, 2, 32, 4), np.float32)
    invalid = pb.AttendRequest(query=tensor(q), key=tensor(bad_kv), value=tensor(bad_kv))
    return valid, invalid


class Outcome:
    __slots__ = ("code", "client_s", "server_s")

    def __init__(self, code, client_s, server_s):
        self.code, self.client_s, self.server_s = code, client_s, server_s


def call_attend(stub, request):
    """One Attend: its gRPC code, client-side latency, and the server time it reported."""
    start = time.perf_counter()
    try:
        response = stub.Attend(request, timeout=RPC_TIMEOUT_S)
        code, server_s = grpc.StatusCode.OK, response.timing.server_us * 1e-6
    except grpc.RpcError as e:
        code, server_s = e.code(), None
    return Outcome(code, time.perf_counter() - start, server_s)


def bucket_upper(x):
    """The smallest histogram bound >= x (the bucket holding an observation of x)."""
    i = bisect.bisect_left(DURATION_BOUNDS, x)
    return DURATION_BOUNDS[i] if i < len(DURATION_BOUNDS) else math.inf


def bucket_lower(x):
    """The largest histogram bound < x (0 below the first)."""
    i = bisect.bisect_left(DURATION_BOUNDS, x)
    return DURATION_BOUNDS[i - 1] if i > 0 else 0.0


@unittest.skipUnless(PROMETHEUS and PROMTOOL, MISSING_TOOLS)
class MetricsLiveTest(unittest.TestCase):
    def test_promtool_checks_live_scrape(self):
        valid, invalid = attend_requests()
        with attnserve_with_metrics() as (server, port), \
                grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.AttentionServiceStub(channel)
            outcomes = [call_attend(stub, valid) for _ in range(20)]
            outcomes += [call_attend(stub, invalid) for _ in range(3)]
            stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=RPC_TIMEOUT_S)
            stub.ListModules(pb.ListModulesRequest(), timeout=RPC_TIMEOUT_S)
            self.assertEqual(collections.Counter(o.code.name for o in outcomes),
                             {"OK": 20, "INVALID_ARGUMENT": 3})
            status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        self.assertEqual(status, 200)
        samples, types = parse_exposition(text)
        # The histograms hold the requests, so promtool sees populated buckets.
        self.assertEqual(samples[("attnserve_request_duration_seconds_count",
                                  frozenset({("rpc", "Attend")}))], 23)
        self.assertEqual(types["attnserve_request_duration_seconds"], "histogram")
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=text,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.strip() + result.stderr.strip(), "",
                         "promtool check metrics reported problems")

    def test_prometheus_scrapes_counts_latency_and_memory(self):
        n_ok, n_invalid, threads = 200, 20, 4
        valid, invalid = attend_requests()
        with attnserve_with_metrics() as (server, port), prometheus_scraping(port) as prom, \
                grpc.insecure_channel(server.target) as channel:
            job = 'job="attnserve"'
            attend = f'{job},rpc="Attend"'
            # The target is up and one scrape, before any request, holds the (zero) histogram:
            # the baseline that increase() below starts from.
            poll("target up", lambda: single(prom, f"up{{{job}}}") == 1 or None)
            poll("baseline scrape", lambda: single(
                prom, f'attnserve_request_duration_seconds_count{{{attend}}}') == 0 or None)

            stub = pb_grpc.AttentionServiceStub(channel)
            work = [valid] * n_ok + [invalid] * n_invalid
            work = work[::2] + work[1::2]  # interleave the invalid ones among the valid
            with futures.ThreadPoolExecutor(threads) as pool:
                outcomes = list(pool.map(lambda r: call_attend(stub, r), work))
            # Every count is recorded before its answer leaves the server, so any scrape
            # started after this instant holds all of them. Prometheus may shift a scrape's
            # timestamp by up to 2 ms (--scrape.timestamp-tolerance) to align it; hence a margin.
            sent_by = time.time() + 0.05
            self.assertEqual(collections.Counter(o.code.name for o in outcomes),
                             {"OK": n_ok, "INVALID_ARGUMENT": n_invalid})

            poll("a scrape after the last answer", lambda: single(
                prom, f'timestamp(attnserve_requests_total{{{attend},code="OK"}})')
                >= sent_by or None)
            by_code = {dict(k)["code"]: v for k, v in query(
                prom, f"sum by (code) (attnserve_requests_total{{{attend}}})").items()}
            self.assertEqual(by_code, {"OK": n_ok, "INVALID_ARGUMENT": n_invalid})
            self.assertEqual(single(prom, f'sum(attnserve_requests_total{{{attend},code="OK"}})'),
                             n_ok)

            p99 = single(prom, "histogram_quantile(0.99, sum by (le) (increase("
                         f"attnserve_request_duration_seconds_bucket{{{attend}}}[5m])))")
            # The server's time is within the client's (so the largest observation lies below
            # max client latency); the 0.99 rank lies above the n_invalid fast failures, so its
            # observation is at least the fastest valid request's server time (from the
            # response). histogram_quantile answers within the bucket holding that rank.
            client_max = max(o.client_s for o in outcomes)
            server_min = min(o.server_s for o in outcomes if o.server_s is not None)
            self.assertLess(n_invalid, 0.99 * (n_ok + n_invalid))
            low, high = bucket_lower(server_min), bucket_upper(client_max)
            self.assertTrue(math.isfinite(p99), p99)
            self.assertTrue(low * (1 - 1e-9) <= p99 <= high * (1 + 1e-9),
                            f"p99 {p99 * 1e3:.4f} ms outside [{low * 1e3:.4f}, "
                            f"{high * 1e3:.4f}] ms (client max {client_max * 1e3:.4f} ms, "
                            f"server min {server_min * 1e3:.4f} ms)")

            for gauge in ("attnserve_host_resident_memory_bytes", "attnserve_module_bytes"):
                self.assertGreater(single(prom, f"{gauge}{{{job}}}"), 0, gauge)
            self.assertGreater(single(prom, f"sum(attnserve_flops_total{{{job}}})"), 0)
            self.assertEqual(single(prom, f"attnserve_requests_in_flight{{{job}}}"), 0)
            print(f"\n  Prometheus: OK {by_code['OK']:.0f}, INVALID_ARGUMENT "
                  f"{by_code['INVALID_ARGUMENT']:.0f}, p99 {p99 * 1e3:.3f} ms in "
                  f"[{low * 1e3:.3f}, {high * 1e3:.3f}] ms", file=sys.stderr)

    def test_metrics_endpoint_under_load(self):
        threads, per_thread, load_limit_s = 4, 5000, 20
        scrapes, scrape_bound_s = 20, 2.0
        valid, _ = attend_requests()
        stop = threading.Event()
        lock = threading.Lock()
        answered = {"count": 0, "other_codes": collections.Counter()}

        def drive(stub):
            end = time.monotonic() + load_limit_s
            for _ in range(per_thread):
                if stop.is_set() or time.monotonic() > end:
                    return
                outcome = call_attend(stub, valid)
                with lock:
                    answered["count"] += 1
                    if outcome.code != grpc.StatusCode.OK:
                        answered["other_codes"][outcome.code.name] += 1

        with attnserve_with_metrics() as (server, port), \
                grpc.insecure_channel(server.target) as channel, \
                futures.ThreadPoolExecutor(threads) as pool:
            stub = pb_grpc.AttentionServiceStub(channel)
            url = f"http://127.0.0.1:{port}/metrics"
            drivers = [pool.submit(drive, stub) for _ in range(threads)]
            try:
                # Start scraping once the load is flowing.
                poll("load started", lambda: answered["count"] >= threads or None)
                seen, durations = [], []
                for _ in range(scrapes):
                    start = time.perf_counter()
                    status, text = http_get(url, timeout_s=10)
                    durations.append(time.perf_counter() - start)
                    self.assertEqual(status, 200)
                    samples, _ = parse_exposition(text)
                    seen.append(total(samples, "attnserve_requests_total", rpc="Attend"))
                    in_flight = samples[("attnserve_requests_in_flight", frozenset())]
                    self.assertTrue(0 <= in_flight <= threads, in_flight)
                    time.sleep(0.05)  # spread the scrapes over the load
                still_loaded = not any(d.done() for d in drivers)
            finally:
                stop.set()
                for d in drivers:
                    d.result()
            _, text = http_get(url)
            final, _ = parse_exposition(text)

        self.assertTrue(still_loaded, "the load ended before the scrapes did")
        self.assertEqual(answered["other_codes"], {}, "answers other than OK")
        self.assertLess(max(durations), scrape_bound_s, durations)
        self.assertEqual(seen, sorted(seen), "attnserve_requests_total decreased")
        self.assertLess(seen[0], seen[-1], "no progress between the first and last scrape")
        self.assertEqual(total(final, "attnserve_requests_total", rpc="Attend"),
                         answered["count"])
        self.assertEqual(total(final, "attnserve_requests_total", rpc="Attend", code="OK"),
                         answered["count"])
        self.assertEqual(final[("attnserve_request_duration_seconds_count",
                                frozenset({("rpc", "Attend")}))], answered["count"])
        self.assertEqual(final[("attnserve_requests_in_flight", frozenset())], 0)
        print(f"\n  {answered['count']} requests; {scrapes} scrapes, slowest "
              f"{max(durations) * 1e3:.1f} ms", file=sys.stderr)


if __name__ == "__main__":
    if not (PROMETHEUS and PROMTOOL):
        print(f"SKIP: prometheus or promtool not found; {MISSING_TOOLS}")
        sys.exit(77)
    unittest.main()
