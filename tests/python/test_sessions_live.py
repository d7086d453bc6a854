"""The installed package's decode sessions against live attnserve processes: a raw session's
prefill and steps (grouped-query; float32 and float16 caches) and a module session equal causal
attention over the whole sequence computed in float64 here; a fork diverges without touching its
parent; ABORTED for a wrong expected_length; an expired session is recognised as lost;
extend_sessions and the stream; sessions routed over two server processes by their owner (and a
replica refusing another's id); attnserve-cli session and attnserve-bench --rpc=decode run
against a server. No timing windows: the expiry waits for more than the TTL, never less.

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py).
"""
import asyncio
import json
import os
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import attnserve
from attnserve import pb

from live_server import LiveServer


def causal64(q, k, v, scale=None, window=None, softcap=0.0, slopes=None):
    """q [Lq, Hq, D], k/v [Lk, Hkv, D*] token-major -> [Lq, Hq, Dv], bottom-right causal;
    window: keys before each query's position it may attend; softcap: s -> cap·tanh(s / cap);
    slopes: ALiBi, s - slope_h·(i' - j); in that order, as FlashAttention applies them."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lk, hkv, _ = k.shape
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k) * (scale or 1 / np.sqrt(d))
    pos = np.arange(lq)[:, None] + lk - lq  # each query's position i'
    key = np.arange(lk)[None, :]
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if slopes is not None:
        s = s - np.asarray(slopes, np.float64)[:, None, None] * np.abs(key - pos)[None]
    allowed = key <= pos
    if window is not None:
        allowed &= key >= pos - window
    s = np.where(allowed[None], s, -1e9)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", w, v)


def linear64(q, k, v, feature_map="elu_plus_one"):
    """Causal linear attention (attention.proto, AttentionOptions.kind) by its definition over
    token-major q [Lq, Hq, D], k/v [Lk, Hkv, D*] (the last Lq keys are the queries'), float64."""
    phi = {"elu_plus_one": lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))),
           "relu": lambda x: np.maximum(x, 0), "identity": lambda x: x}[feature_map]
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    w = np.einsum("ihd,jhd->hij", phi(q), phi(k))
    w = np.where(np.arange(lk)[None, None, :] <= (np.arange(lq) + lk - lq)[None, :, None], w, 0)
    return np.einsum("hij,jhd->ihd", w, v) / w.sum(-1).T[:, :, None]


def module64(t, num_heads, x):
    """The reference module's causal self-attention over x [L, d_model], float64."""
    def lin(a, n):
        return np.asarray(a, np.float64) @ np.asarray(t[n + ".weight"], np.float64).T + t[n + ".bias"]
    length, dm = x.shape
    dk = dm // num_heads
    heads = [lin(x, f"W_{p}").reshape(length, num_heads, dk) for p in "qkv"]
    out = causal64(*heads)
    return lin(out.reshape(length, dm), "W_o")


def tokens(rng, n, h, d, dtype=np.float32):
    return rng.standard_normal((n, h, d)).astype(dtype)


class LiveSessionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer("--backend=cpu")
        cls.client = attnserve.Client(cls.server.target)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_raw_prefill_and_steps_equal_causal_attention(self):
        rng = np.random.default_rng(1)
        for dtype, cache, tol in (("float32", "float32", 2e-5), ("float16", "float16", 2e-3)):
            np_dtype = np.float16 if dtype == "float16" else np.float32
            q, k, v = (tokens(rng, 21, h, 16, np_dtype) for h in (8, 2, 2))
            with self.client.create_session(layout=attnserve.layout(8, 16, 2),
                                            cache_dtype=cache) as s:
                for a, b in ((0, 17), (17, 18), (18, 19), (19, 21)):
                    r = s.extend(q[a:b], k[a:b], v[a:b])
                    self.assertEqual(r.length, b)
                    self.assertEqual(r.output.shape, (b - a, 8, 16))
                    want = causal64(q[a:b], k[:b], v[:b])
                    np.testing.assert_allclose(r.output, want, atol=tol, err_msg=f"{dtype} {a}")
                info = s.describe()
                self.assertEqual((info.length, info.layout.num_kv_heads), (21, 2))

    def test_window_softcap_and_alibi_sessions(self):
        # A sliding window of 7 keys, soft-capping and the standard ALiBi slopes of 8 heads
        # (2^-1 .. 2^-8, the paper's), over prefills and steps; against numpy in float64.
        rng = np.random.default_rng(5)
        q, k, v = (tokens(rng, 40, h, 16) for h in (8, 2, 2))
        slopes = [2.0 ** -h for h in range(1, 9)]
        with self.client.create_session(layout=attnserve.layout(8, 16, 2), window=6,
                                        softcap=2.0, alibi="standard") as s:
            info = s.describe()
            self.assertEqual((info.window_left, info.softcap), (6, 2.0))
            np.testing.assert_allclose(info.alibi_slopes, slopes)
            for a, b in ((0, 30), (30, 31), (31, 40)):
                r = s.extend(q[a:b], k[a:b], v[a:b])
                want = causal64(q[a:b], k[:b], v[:b], window=6, softcap=2.0, slopes=slopes)
                np.testing.assert_allclose(r.output, want, atol=2e-5, err_msg=f"{a}")
            plain = causal64(q[31:40], k, v)
            self.assertGreater(np.abs(r.output - plain).max(), 1e-2)

    def test_linear_session_equals_linear_attention_and_stays_its_size(self):
        # Prefills and steps of a linear-attention session against its definition in float64;
        # its pages stay ceil(D / page_tokens) however many tokens it holds.
        rng = np.random.default_rng(6)
        q, k, v = (tokens(rng, 300, h, 16) for h in (8, 2, 2))
        page_tokens = self.client.server_info().sessions.page_tokens
        for feature_map in ("elu_plus_one", "relu"):
            with self.client.create_session(layout=attnserve.layout(8, 16, 2), kind="linear",
                                            feature_map=feature_map) as s:
                info = s.describe()
                self.assertEqual(info.kind, attnserve.pb.ATTENTION_KIND_LINEAR)
                for a, b in ((0, 260), (260, 261), (261, 300)):
                    r = s.extend(q[a:b], k[a:b], v[a:b])
                    want = linear64(q[a:b], k[:b], v[:b], feature_map)
                    np.testing.assert_allclose(r.output, want, atol=2e-5, rtol=1e-4,
                                               err_msg=f"{feature_map} {a}")
                    self.assertEqual(s.describe().pages, -(-16 // page_tokens))
            with self.assertRaises(ValueError):
                self.client.create_session(layout=attnserve.layout(8, 16, 2), kind="lineaer")

    def test_module_session_equals_the_module_over_the_whole_sequence(self):
        rng = np.random.default_rng(2)
        dm, heads = 32, 4
        weights = {f"W_{p}.{k}": rng.standard_normal((dm, dm) if k == "weight" else dm)
                   .astype(np.float32) * 0.2 for p in "qkvo" for k in ("weight", "bias")}
        self.client.load_module("sess-live", weights, num_heads=heads, replace=True)
        x = rng.standard_normal((12, dm)).astype(np.float32)
        with self.client.create_session("sess-live") as s:
            outs = [s.extend(input=x[:9]).output] + [s.extend(input=x[i:i + 1]).output
                                                       for i in range(9, 12)]
        np.testing.assert_allclose(np.concatenate(outs), module64(weights, heads, x), atol=2e-5)

    def test_fork_diverges_and_lse_merges(self):
        rng = np.random.default_rng(3)
        q, k, v = (tokens(rng, 10, 4, 8) for _ in range(3))
        q2, k2, v2 = (tokens(rng, 1, 4, 8) for _ in range(3))
        with self.client.create_session(layout=attnserve.layout(4, 8)) as parent:
            parent.extend(q[:9], k[:9], v[:9])
            with parent.fork() as child:
                a = parent.extend(q[9:], k[9:], v[9:], return_lse=True)
                b = child.extend(q2, k2, v2)
                np.testing.assert_allclose(a.output, causal64(q[9:], k, v), atol=2e-5)
                np.testing.assert_allclose(
                    b.output, causal64(q2, np.concatenate([k[:9], k2]),
                                       np.concatenate([v[:9], v2])), atol=2e-5)
                s = np.einsum("hd,jhd->hj", q[9].astype(np.float64), k) / np.sqrt(8)
                np.testing.assert_allclose(a.lse[0], np.log(np.exp(s).sum(-1)), atol=2e-5)
                self.assertEqual((parent.length, child.length), (10, 10))
                self.assertEqual(child.describe().parent_id, parent.id)

    def test_codes(self):
        rng = np.random.default_rng(4)
        q = tokens(rng, 2, 2, 8)
        with self.client.create_session(layout=attnserve.layout(2, 8)) as s:
            s.extend(q, q, q)
            (r,) = self.client.extend_sessions([(s, s.request(q, q, q, expected_length=5))])
            self.assertEqual(r.code, grpc.StatusCode.ABORTED)
            self.assertIn("5", r.details)
            self.assertEqual(s.describe().length, 2)  # nothing appended
        with self.assertRaises(grpc.RpcError) as e:
            self.client.stub.GetSession(pb.GetSessionRequest(session_id=s.id))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(grpc.RpcError) as e:
            self.client.stub.GetSession(pb.GetSessionRequest(session_id="nonsense"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_an_expired_session_is_lost(self):
        s = self.client.create_session(layout=attnserve.layout(2, 8), idle_ttl_s=0.001)
        time.sleep(0.05)  # far beyond the TTL: it has expired, whatever the load
        q = np.ones((1, 2, 8), np.float32)
        with self.assertRaises(grpc.RpcError) as e:
            s.extend(q, q, q)
        self.assertTrue(attnserve.is_session_lost(e.exception), e.exception.details())
        self.assertEqual(attnserve.session_lost_reason(e.exception), "expired")

    def test_extend_sessions_and_the_stream(self):
        rng = np.random.default_rng(5)
        data = [[tokens(rng, 6, h, 8) for h in (4, 2, 2)] for _ in range(3)]
        sessions = [self.client.create_session(layout=attnserve.layout(4, 8, 2))
                    for _ in data]
        for s, (q, k, v) in zip(sessions, data):
            s.extend(q[:4], k[:4], v[:4])
        results = self.client.extend_sessions(
            [(s, (q[4:5], k[4:5], v[4:5])) for s, (q, k, v) in zip(sessions, data)])
        for r, (q, k, v) in zip(results, data):
            np.testing.assert_allclose(r.output, causal64(q[4:5], k[:5], v[:5]), atol=2e-5)
        requests = [(i, s.request(q[5:6], k[5:6], v[5:6]))
                    for i, (s, (q, k, v)) in enumerate(zip(sessions, data))]
        for response in self.client.stream(requests):
            self.assertEqual(response.code, 0, response.message)
            i = response.request_id
            q, k, v = data[i]
            out = attnserve.from_tensor(response.extend_session.output)
            np.testing.assert_allclose(out, causal64(q[5:6], k, v), atol=2e-5)
        for s in sessions:
            self.assertEqual(s.describe().length, 6)
            s.close()

    def test_asyncio(self):
        async def main():
            async with attnserve.AsyncClient(self.server.target) as client:
                rng = np.random.default_rng(6)
                q = tokens(rng, 3, 2, 8)
                async with await client.create_session(layout=attnserve.layout(2, 8)) as s:
                    await s.extend(q[:2], q[:2], q[:2])
                    r = await s.extend(q[2:], q[2:], q[2:])
                    np.testing.assert_allclose(r.output, causal64(q[2:], q, q), atol=2e-5)
                    return r.length
        self.assertEqual(asyncio.run(main()), 3)


class RoutingTest(unittest.TestCase):
    """Two server processes, one client given both addresses."""

    def test_sessions_are_routed_to_the_process_that_holds_them(self):
        a, b = LiveServer("--backend=cpu"), LiveServer("--backend=cpu")
        try:
            with attnserve.Client([a.target, b.target]) as client:
                rng = np.random.default_rng(7)
                data = [[tokens(rng, 5, 2, 8) for _ in range(3)] for _ in range(4)]
                sessions = [client.create_session(layout=attnserve.layout(2, 8))
                            for _ in data]
                owners = [attnserve.session_owner(s.id) for s in sessions]
                self.assertEqual(sorted(owners), sorted([a.target, b.target] * 2))
                for step in range(5):
                    for s, (q, k, v) in zip(sessions, data):
                        r = s.extend(q[step:step + 1], k[step:step + 1], v[step:step + 1])
                        np.testing.assert_allclose(
                            r.output, causal64(q[step:step + 1], k[:step + 1], v[:step + 1]),
                            atol=2e-5)
                for target in (a.target, b.target):
                    listed = client.list_sessions(replica=target)
                    self.assertEqual(len(listed.sessions), 2)
                    self.assertEqual(listed.usage.sessions, 2)
                # A replica answers another's id NOT_FOUND, naming the owner.
                other = next(s for s in sessions if attnserve.session_owner(s.id) == a.target)
                with attnserve.Client(b.target) as direct:
                    with self.assertRaises(grpc.RpcError) as e:
                        direct.stub.GetSession(pb.GetSessionRequest(session_id=other.id))
                    self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
                    self.assertIn(a.target, e.exception.details())
                results = client.extend_sessions(
                    [(s, (q[:1], k[:1], v[:1])) for s, (q, k, v) in zip(sessions, data)])
                self.assertTrue(all(r.length == 6 for r in results), results)
                for s in sessions:
                    s.close()
                for target in (a.target, b.target):
                    self.assertEqual(client.list_sessions(replica=target).usage.pages_used, 0)
        finally:
            a.stop()
            b.stop()


class RestartTest(unittest.TestCase):
    """--session_snapshot_dir through the real binary: SIGTERM, a new process, the same session."""

    def test_sessions_survive_sigterm_and_a_new_process_bit_for_bit(self):
        rng = np.random.default_rng(9)
        q, k, v = (tokens(rng, 40, h, 16) for h in (8, 2, 2))

        def steps(client, session):
            return [session.extend(q[i:i + 1], k[i:i + 1], v[i:i + 1]).output
                    for i in range(30, 40)]

        steady = LiveServer("--backend=cpu")  # the uninterrupted run
        try:
            with attnserve.Client(steady.target) as c:
                s = c.create_session(layout=attnserve.layout(8, 16, 2), cache_dtype="float16")
                s.extend(q[:30], k[:30], v[:30])
                want = steps(c, s)
        finally:
            self.assertEqual(steady.stop(), 0)
        with tempfile.TemporaryDirectory() as d:
            flags = ("--backend=cpu", f"--session_snapshot_dir={d}", "--session_owner=replica-r")
            first = LiveServer(*flags)
            try:
                with attnserve.Client(first.target) as c:
                    s = c.create_session(layout=attnserve.layout(8, 16, 2), cache_dtype="float16")
                    s.extend(q[:30], k[:30], v[:30])
                    session_id = s.id
            finally:
                self.assertEqual(first.stop(), 0)
            self.assertTrue(os.path.exists(os.path.join(d, "sessions.snapshot")))
            second = LiveServer(*flags)
            try:
                self.assertIn("restored 1 sessions", second.log())
                with attnserve.Client(second.target) as c:
                    info = c.stub.GetSession(attnserve.pb.GetSessionRequest(
                        session_id=session_id)).session
                    self.assertEqual(info.length, 30)
                    got = steps(c, attnserve.Session(c, info))
            finally:
                self.assertEqual(second.stop(), 0)
        for i, (a, b) in enumerate(zip(got, want)):
            self.assertTrue(np.array_equal(a, b), f"step {30 + i}")


@unittest.skipUnless(os.environ.get("ATTNSERVE_CLI") and os.environ.get("ATTNSERVE_BENCH"),
                     "ATTNSERVE_CLI and ATTNSERVE_BENCH not set")
class ToolsTest(unittest.TestCase):
    """attnserve-cli session and attnserve-bench --rpc=decode against a live server."""

    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer("--backend=cpu")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def run_tool(self, *args):
        r = subprocess.run(args, capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_cli_session(self):
        out = self.run_tool(os.environ["ATTNSERVE_CLI"], f"--target={self.server.target}",
                            "session", "--layout=4,2,16", "--prefill=40", "--steps=5")
        self.assertIn("prefill: 40 tokens", out)
        for i in range(5):
            self.assertIn(f"step {i}: length {41 + i}", out)
        self.assertIn("decode: 5 steps, p50", out)
        self.assertIn("output: DTYPE_FLOAT32 [1, 4, 16]", out)
        out = self.run_tool(os.environ["ATTNSERVE_CLI"], f"--target={self.server.target}",
                            "session", "--module=demo", "--prefill=8", "--steps=2")
        self.assertIn("step 1: length 10", out)
        self.assertIn("output: DTYPE_FLOAT32 [1, 64]", out)
        # The kinds of attention: a linear-attention session, a windowed soft-capped ALiBi one.
        for kinds in (["--kind=linear", "--feature_map=relu"],
                      ["--window=7,0", "--softcap=3", "--alibi"]):
            out = self.run_tool(os.environ["ATTNSERVE_CLI"], f"--target={self.server.target}",
                                "session", "--layout=4,2,16", "--prefill=20", "--steps=2", *kinds)
            self.assertIn("step 1: length 22", out, kinds)
        r = subprocess.run([os.environ["ATTNSERVE_CLI"], f"--target={self.server.target}",
                            "session", "--layout=4,2,16", "--kind=linear", "--window=7,0"],
                           capture_output=True, text=True, timeout=240)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("window does not apply to kind ATTENTION_KIND_LINEAR", r.stderr)
        with attnserve.Client(self.server.target) as client:
            self.assertEqual(client.list_sessions().usage.sessions, 0)  # closed

    def test_bench_decode_closed_and_open(self):
        with tempfile.TemporaryDirectory() as d:
            for mode in (["--mode=closed", "--concurrency=3"],
                         ["--mode=open", "--rate=200"]):
                path = os.path.join(d, "run.json")
                self.run_tool(os.environ["ATTNSERVE_BENCH"], f"--target={self.server.target}",
                              "--rpc=decode", "--sessions=3", "--prefill=64",
                              "--decode_steps=4", "--shapes=1,4,1,16", "--kv_heads=2",
                              "--warmup_s=0", "--progress=off", f"--json={path}",
                              f"--csv={os.path.join(d, 'run.csv')}",
                              f"--html={os.path.join(d, 'run.html')}", *mode)
                with open(path) as f:
                    report = json.load(f)
                (phase,) = report["phases"]
                self.assertEqual((phase["sent"], phase["ok"]), (12, 12), mode)
                self.assertGreater(phase["tokens_per_s"], 0)
                self.assertGreater(phase["latency_ms"]["p99"], 0)
                self.assertEqual((report["config"]["sessions"], report["config"]["prefill"]),
                                 (3, 64))
                with open(os.path.join(d, "run.csv")) as f:
                    self.assertEqual(len(f.read().strip().splitlines()), 2)
        with attnserve.Client(self.server.target) as client:
            self.assertEqual(client.list_sessions().usage.sessions, 0)  # closed

    def test_bench_decode_over_two_servers(self):
        other = LiveServer("--backend=cpu")
        try:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "run.json")
                self.run_tool(os.environ["ATTNSERVE_BENCH"],
                              f"--target=ipv4:{self.server.target},{other.target}",
                              "--rpc=decode", "--sessions=4", "--prefill=16",
                              "--decode_steps=3", "--shapes=1,2,1,8", "--warmup_s=0",
                              "--progress=off", f"--json={path}", "--concurrency=4")
                with open(path) as f:
                    (phase,) = json.load(f)["phases"]
                self.assertEqual((phase["sent"], phase["ok"]), (12, 12))  # none misrouted
        finally:
            other.stop()


if __name__ == "__main__":
    unittest.main()
