"""A process killed in the middle of a move (issue 33): the session stays whole on exactly one
replica, or is lost with the documented answer; never two copies, never a torn one. Live
attnserve processes A (the sender, --session_peers=<proxy>) and B (the receiver), and between
them a proxy in this test that forwards A's AcceptSessions stream to B chunk by chunk and
stops after the first chunk until the test has killed one of them (SIGKILL: no drain, no
goodbye), so the kill lands inside the transfer by construction, not by timing.

- B killed: A's move fails, the session stays on A untouched, and continues there bit for bit
  (its steps equal those of a session that never tried to move).
- A killed: B never commits the transfer it got a part of: it holds no session and no page;
  the session's caller gets UNAVAILABLE (its replica gone, no other knows it moved).

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py).
"""
import concurrent.futures
import threading
import time
import unittest

import grpc
import numpy as np

import attnserve
from attnserve import pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc

from live_server import LiveServer

HQ, HKV, D = 4, 2, 64
LAYOUT = attnserve.layout(HQ, D, HKV)
PREFILL = 4096  # 4 MiB of float32 keys and values: several chunks of 1 MiB
WAIT_S = 120


def tokens(a, b):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((PREFILL + 8, h, D)).astype(np.float32)
               for h in (HQ, HKV, HKV))
    return q[a:b], k[a:b], v[a:b]


class Proxy(pb_grpc.AttentionServiceServicer):
    """AcceptSessions forwarded to `target`, chunk by chunk; after the first chunk it waits for
    `go` (set once the test has killed a process)."""

    def __init__(self, target):
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.AttentionServiceStub(self.channel)
        self.first = threading.Event()
        self.go = threading.Event()

    def AcceptSessions(self, request_iterator, context):
        def forward():
            for n, chunk in enumerate(request_iterator):
                yield chunk
                if n == 0:
                    self.first.set()
                    self.go.wait(WAIT_S)
        try:
            return self.stub.AcceptSessions(forward(), timeout=WAIT_S)
        except grpc.RpcError as e:
            context.abort(e.code(), f"proxy: {e.details()}")


class MoveKillTest(unittest.TestCase):
    def start_proxy(self, target):
        proxy = Proxy(target)
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_AttentionServiceServicer_to_server(proxy, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.addCleanup(server.stop, None)
        self.addCleanup(proxy.channel.close)
        return proxy, f"127.0.0.1:{port}"

    def start_replicas(self):
        """B, the proxy to it, and A with the proxy as its one peer: (a, b, proxy, address)."""
        b = LiveServer("--backend=cpu")
        self.addCleanup(b.stop)
        proxy, proxy_address = self.start_proxy(b.target)
        a = LiveServer("--backend=cpu", f"--session_peers={proxy_address}")
        self.addCleanup(a.stop)
        return a, b, proxy, proxy_address

    def move_in_background(self, client, session_id, peer):
        """MoveSession on a thread: its outcome (the response or the error) once it ends."""
        outcome = {}

        def run():
            try:
                outcome["response"] = client.move_session(session_id, peer, timeout=WAIT_S)
            except grpc.RpcError as e:
                outcome["error"] = e
        thread = threading.Thread(target=run)
        thread.start()
        return thread, outcome

    def test_receiver_killed_mid_move_leaves_the_session_whole_on_the_sender(self):
        # The steps of a session that never tried to move.
        ref = LiveServer("--backend=cpu")
        try:
            with attnserve.Client(ref.target) as c, c.create_session(layout=LAYOUT) as s:
                s.extend(*tokens(0, PREFILL))
                want = [s.extend(*tokens(n, n + 1)).output for n in range(PREFILL, PREFILL + 4)]
        finally:
            ref.stop()

        a, b, proxy, proxy_address = self.start_replicas()
        with attnserve.Client(a.target) as client:
            s = client.create_session(layout=LAYOUT)
            s.extend(*tokens(0, PREFILL))
            old = s.id
            thread, outcome = self.move_in_background(client, s.id, proxy_address)
            self.assertTrue(proxy.first.wait(WAIT_S))  # A is inside the transfer
            b.process.kill()
            b.process.wait()
            proxy.go.set()
            thread.join(WAIT_S)
            self.assertIn("error", outcome, "the move cannot have succeeded")
            self.assertEqual(outcome["error"].code(), grpc.StatusCode.UNAVAILABLE,
                             outcome["error"].details())
            # Still on A, under its id, whole: it goes on as if no move had been tried.
            self.assertEqual(s.describe().length, PREFILL)
            self.assertEqual(s.id, old)
            got = [s.extend(*tokens(n, n + 1)).output for n in range(PREFILL, PREFILL + 4)]
            for g, w in zip(got, want):
                self.assertTrue(np.array_equal(g, w))
            s.close()

    def test_sender_killed_mid_move_leaves_nothing_on_the_receiver(self):
        a, b, proxy, proxy_address = self.start_replicas()
        client = attnserve.Client([a.target, b.target])
        self.addCleanup(client.close)
        with attnserve.Client(a.target) as on_a:
            s = attnserve.Session(client, on_a.create_session(layout=LAYOUT).info)
        s.extend(*tokens(0, PREFILL))
        with attnserve.Client(a.target) as operator:
            thread, outcome = self.move_in_background(operator, s.id, proxy_address)
            self.assertTrue(proxy.first.wait(WAIT_S))  # A is inside the transfer
            a.process.kill()
            a.process.wait()
            proxy.go.set()
            thread.join(WAIT_S)
            self.assertIn("error", outcome)
        # B took nothing: no session, ever; the pages its import held go back once it has
        # seen the transfer end (the proxy passes the cut on: polled, with a generous bound).
        with attnserve.Client(b.target) as on_b:
            deadline = time.monotonic() + WAIT_S
            while True:
                listed = on_b.list_sessions()
                self.assertEqual(len(listed.sessions), 0)
                if listed.usage.pages_used == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            self.assertEqual(listed.usage.pages_used, 0)
            with self.assertRaises(grpc.RpcError) as e:
                on_b.stub.GetSession(pb.GetSessionRequest(session_id=s.id))
            self.assertEqual(attnserve.session_moved_to(e.exception), "")
        # Its caller: its replica is gone and no other knows it moved.
        with self.assertRaises(grpc.RpcError) as e:
            s.extend(*tokens(PREFILL, PREFILL + 1), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
