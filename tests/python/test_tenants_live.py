"""Tenants on a live attnserve process: --tenants_file read again on SIGHUP (server/main.cc), a
bad file keeping the last good table, and a session invisible to another tenant, through raw
gRPC stubs with bearer tokens. Waits on the server's log lines (events), never on time."""
import os
import signal
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.environ["ATTNSERVE_STUBS"])
from attnserve.v1 import attention_pb2 as pb  # noqa: E402
from attnserve.v1 import attention_pb2_grpc as pb_grpc  # noqa: E402

from live_server import LiveServer  # noqa: E402


def await_log(server, text, count, timeout_s=120):
    """Returns once `text` stands `count` times in the server's log (a generous bound only
    against a hang: the line is the event)."""
    deadline = time.monotonic() + timeout_s
    while server.log().count(text) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {count}x {text!r} in the log: {server.log()}")
        time.sleep(0.02)


class TenantsLiveTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.file = os.path.join(self.dir.name, "tenants")
        self.write("alice token:a-token\n")
        self.server = LiveServer(f"--tenants_file={self.file}")
        self.channel = grpc.insecure_channel(self.server.target)
        self.stub = pb_grpc.AttentionServiceStub(self.channel)

    def tearDown(self):
        self.channel.close()
        self.server.stop()
        self.dir.cleanup()

    def write(self, text):
        with open(self.file + ".tmp", "w") as f:
            f.write(text)
        os.replace(self.file + ".tmp", self.file)

    def call(self, method, request, token):
        return getattr(self.stub, method)(request, timeout=60,
                                          metadata=[("authorization", f"Bearer {token}")])

    def create(self, token):
        layout = pb.HeadLayout(num_heads=1, num_kv_heads=1, head_dim=4, v_head_dim=4)
        return self.call("CreateSession", pb.CreateSessionRequest(
            layout=layout, cache_dtype=pb.DTYPE_FLOAT32), token).session.session_id

    def code(self, method, request, token):
        try:
            self.call(method, request, token)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    def test_sighup_reads_the_file_again_and_a_bad_file_keeps_the_last(self):
        alices = self.create("a-token")
        self.assertEqual(self.code("ListSessions", pb.ListSessionsRequest(), "b-token"),
                         grpc.StatusCode.UNAUTHENTICATED)
        self.write("alice token:a-token\nbob token:b-token\n")
        self.server.process.send_signal(signal.SIGHUP)
        await_log(self.server, "SIGHUP: tenants file read again", 1)
        self.assertEqual(self.code("ListSessions", pb.ListSessionsRequest(), "b-token"),
                         grpc.StatusCode.OK)
        # Bob is a tenant now, and alice's session is not his to see.
        self.assertEqual(
            self.code("GetSession", pb.GetSessionRequest(session_id=alices), "b-token"),
            grpc.StatusCode.NOT_FOUND)
        self.assertEqual(
            len(self.call("ListSessions", pb.ListSessionsRequest(), "b-token").sessions), 0)
        self.assertIn("GetSession by tenant 'bob' of another tenant's session refused",
                      self.server.log())
        self.assertNotIn("b-token", self.server.log())  # tokens are never logged

        self.write("alice token:a-token\nbob\n")  # does not parse
        self.server.process.send_signal(signal.SIGHUP)
        await_log(self.server, "tenants file kept as it was: --tenants_file", 1)
        self.assertIn("line 2", self.server.log())
        self.assertEqual(self.code("ListSessions", pb.ListSessionsRequest(), "b-token"),
                         grpc.StatusCode.OK)
        # A SIGHUP is not a drain: the server still serves, and stops on SIGTERM as usual.
        self.assertEqual(
            self.code("GetSession", pb.GetSessionRequest(session_id=alices), "a-token"),
            grpc.StatusCode.OK)
        self.assertEqual(self.server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
