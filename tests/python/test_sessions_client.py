"""The installed package's session helpers against fake replicas that keep only each session's
length (in-process grpc servers): routing by the id's owner over a list of addresses,
expected_length on every extend, the answer to a repeated extend, close on leaving a `with`,
extend_sessions split per replica and merged in order, the stream's extend items, lost-session
recognition, a session being moved ("is moving": sent again after the pushback, within the
call's deadline); sync and asyncio. What a real server computes is checked in
test_sessions_live.py.

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py).
"""
import asyncio
import threading
import unittest
from concurrent import futures

import grpc
import numpy as np

import attnserve
from attnserve import pb, pb_grpc


class FakeSessions(pb_grpc.AttentionServiceServicer):
    """Sessions as lengths; the output echoes the query (or input). lose_first_response: the
    first extend is applied, then answered UNAVAILABLE (a response lost on the way back)."""

    def __init__(self):
        self.owner = ""
        self.owner_override = ""
        self.lengths = {}
        self.calls = {}
        self.expected = []
        self.lose_first_response = False
        self.moving = 0  # extends (and batch items) to answer "is moving" first
        self.next = 0
        self.lock = threading.Lock()

    def _count(self, rpc):
        self.calls[rpc] = self.calls.get(rpc, 0) + 1

    def CreateSession(self, request, context):
        with self.lock:
            self._count("CreateSession")
            self.last_create = request
            self.next += 1
            sid = f"{self.owner_override or self.owner}/inst/{self.next}"
            self.lengths[sid] = 0
            return pb.CreateSessionResponse(session=pb.SessionInfo(session_id=sid))

    def _extend(self, request):
        """(code, message, response)."""
        self.expected.append(request.expected_length if request.HasField("expected_length")
                             else None)
        if request.session_id not in self.lengths:
            return grpc.StatusCode.NOT_FOUND, f"no session {request.session_id}", None
        have = self.lengths[request.session_id]
        if request.HasField("expected_length") and request.expected_length != have:
            return (grpc.StatusCode.ABORTED,
                    f"expected_length {request.expected_length} but the session holds {have}",
                    None)
        t = request.input if request.HasField("input") else request.query
        self.lengths[request.session_id] = have + t.shape[0]
        return grpc.StatusCode.OK, "", pb.ExtendSessionResponse(
            output=t, length=have + t.shape[0])

    def _moving(self, session_id):
        """The "is moving" answer (a server's while it copies the session), or None."""
        if self.moving == 0:
            return None
        self.moving -= 1
        return (grpc.StatusCode.UNAVAILABLE, f"session '{session_id}' is moving to another "
                "replica: retry shortly", None)

    def ExtendSession(self, request, context):
        with self.lock:
            self._count("ExtendSession")
            moving = self._moving(request.session_id)
            code, message, response = moving or self._extend(request)
            if moving:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", "5"),))
            if code == grpc.StatusCode.OK and self.lose_first_response:
                self.lose_first_response = False
                code, message = grpc.StatusCode.UNAVAILABLE, "connection lost"
        if code != grpc.StatusCode.OK:
            context.abort(code, message)
        return response

    def ExtendSessions(self, request, context):
        with self.lock:
            self._count("ExtendSessions")
            out = pb.ExtendSessionsResponse()
            for step in request.steps:
                code, message, response = self._moving(step.session_id) or self._extend(step)
                r = out.results.add(code=code.value[0], message=message)
                if response is not None:
                    r.response.CopyFrom(response)
            return out

    def ForkSession(self, request, context):
        with self.lock:
            self._count("ForkSession")
            self.next += 1
            sid = f"{self.owner}/inst/{self.next}"
            self.lengths[sid] = self.lengths[request.session_id]
            return pb.ForkSessionResponse(session=pb.SessionInfo(
                session_id=sid, length=self.lengths[sid], parent_id=request.session_id))

    def CloseSession(self, request, context):
        with self.lock:
            self._count("CloseSession")
            if self.lengths.pop(request.session_id, None) is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "no session")
            return pb.CloseSessionResponse()

    def GetSession(self, request, context):
        with self.lock:
            self._count("GetSession")
            if request.session_id not in self.lengths:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "session lost (expired): create a new session and prefill it "
                              "again")
            return pb.GetSessionResponse(session=pb.SessionInfo(
                session_id=request.session_id, length=self.lengths[request.session_id]))

    def ListSessions(self, request, context):
        with self.lock:
            return pb.ListSessionsResponse(sessions=[
                pb.SessionInfo(session_id=s, length=n) for s, n in sorted(self.lengths.items())])

    def AttentionStream(self, request_iterator, context):
        for request in request_iterator:
            with self.lock:
                self._count("stream")
                code, message, response = self._extend(request.extend_session)
            r = pb.AttentionStreamResponse(request_id=request.request_id, code=code.value[0],
                                           message=message)
            if response is not None:
                r.extend_session.CopyFrom(response)
            yield r


class FakeReplica:
    def __init__(self):
        self.service = FakeSessions()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_AttentionServiceServicer_to_server(self.service, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.service.owner = self.address

    def stop(self):
        self.server.stop(None)


def tokens(n, first=0.0):
    return np.arange(n * 2 * 4, dtype=np.float32).reshape(n, 2, 4) + first


LAYOUT = attnserve.layout(num_heads=2, head_dim=4)


class SessionClientTest(unittest.TestCase):
    def setUp(self):
        self.a, self.b = FakeReplica(), FakeReplica()

    def tearDown(self):
        self.a.stop()
        self.b.stop()

    def test_extends_carry_the_known_length_and_with_closes(self):
        with attnserve.Client(self.a.address) as client:
            with client.create_session(layout=LAYOUT) as s:
                self.assertEqual(s.length, 0)
                s.extend(tokens(5), tokens(5), tokens(5))
                step = s.extend(tokens(1, 100.0), tokens(1), tokens(1))
                self.assertEqual(step.length, 6)
                np.testing.assert_array_equal(step.output, tokens(1, 100.0))
                with s.fork() as child:
                    self.assertEqual(child.length, 6)
                    child.extend(tokens(1), tokens(1), tokens(1))
                    self.assertEqual(child.length, 7)
                self.assertEqual(s.describe().length, 6)
                self.assertEqual(len(self.a.service.lengths), 1)
            self.assertEqual(self.a.service.lengths, {})
            self.assertEqual(self.a.service.expected, [0, 5, 6])
            self.assertRaises(ValueError, s.extend, tokens(1), tokens(1), tokens(1))

    def test_score_modifications_reach_the_create_request(self):
        with attnserve.Client(self.a.address) as client:
            client.create_session(layout=LAYOUT, window=4095, softcap=30.0, alibi="standard")
            r = self.a.service.last_create
            self.assertTrue(r.HasField("window"))
            self.assertEqual((r.window.left, r.window.right), (4095, 0))
            self.assertEqual(r.softcap, 30.0)
            self.assertTrue(r.alibi.standard)
            client.create_session(layout=LAYOUT, alibi=[0.5, 0.25])
            r = self.a.service.last_create
            self.assertFalse(r.HasField("window"))
            self.assertEqual(list(r.alibi.slopes), [0.5, 0.25])
            self.assertRaises(ValueError, client.create_session, layout=LAYOUT, alibi="bloom")

    def test_a_retry_after_a_lost_response_is_reported(self):
        self.a.service.lose_first_response = True
        retry = attnserve.RetryPolicy(max_attempts=2, initial_backoff_s=0.001)
        with attnserve.Client(self.a.address, retry=retry) as client:
            s = client.create_session(layout=LAYOUT)
            with self.assertRaises(attnserve.ExtendAlreadyApplied) as e:
                s.extend(tokens(3), tokens(3), tokens(3))
            self.assertEqual(e.exception.length, 3)
            self.assertIn("now holds 3 tokens", str(e.exception))
            self.assertEqual(s.length, 3)
            self.assertEqual(self.a.service.expected, [0, 0])
            s.extend(tokens(1), tokens(1), tokens(1))
            self.assertEqual(s.length, 4)
            # A caller's own expected_length is kept, and a mismatch stays ABORTED.
            (r,) = client.extend_sessions(
                [(s, s.request(tokens(1), tokens(1), tokens(1), expected_length=9))])
            self.assertEqual(r.code, grpc.StatusCode.ABORTED)
            self.assertEqual(s.length, 4)

    def test_a_moving_session_is_sent_again(self):
        # "is moving" (UNAVAILABLE with a pushback): sent again after it. The throttle's part
        # is checked below.
        with attnserve.Client(self.a.address, throttle=None) as client:
            s = client.create_session(layout=LAYOUT)
            self.a.service.moving = 2
            self.assertEqual(s.extend(tokens(2), tokens(2), tokens(2)).length, 2)
            self.assertEqual(self.a.service.calls["ExtendSession"], 3)
            self.a.service.moving = 2
            (r,) = client.extend_sessions([(s, (tokens(1), tokens(1), tokens(1)))])
            self.assertEqual((r.length, s.length), (3, 3))
            self.assertEqual(self.a.service.calls["ExtendSessions"], 3)
            # A move that takes longer than 8 waits: waited out (within the call's deadline;
            # waits are not moves, of which a call follows at most 8).
            s3 = client.create_session(layout=LAYOUT)
            self.a.service.moving = 30
            self.assertEqual(s3.extend(tokens(1), tokens(1), tokens(1), timeout=600).length, 1)
            self.assertEqual(self.a.service.calls["ExtendSession"], 3 + 31)
            # One that outlasts the call's deadline: its last answer.
            self.a.service.moving = 10 ** 6
            with self.assertRaises(grpc.RpcError) as e:
                s3.extend(tokens(1), tokens(1), tokens(1), timeout=0.2)
            self.assertIn(e.exception.code(),
                          (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))
            self.assertEqual(attnserve.session_moved_to(e.exception), "")
            self.a.service.moving = 0

        # With the throttle on, "is moving" answers count as accepted (no overload) and leave
        # no pushback in force for the client's other calls.
        with attnserve.Client(self.a.address) as client:
            s2 = client.create_session(layout=LAYOUT)
            self.a.service.moving = 5
            self.assertEqual(s2.extend(tokens(1), tokens(1), tokens(1)).length, 1)
            self.assertEqual(client.throttle.counts(), (6, 6))
            self.assertIsNone(client.throttle.check())

        async def main():
            self.a.service.moving = 2
            async with attnserve.AsyncClient(self.a.address, throttle=None) as client:
                s = attnserve.AsyncSession(client, pb.SessionInfo(session_id=s_id, length=3))
                self.assertEqual((await s.extend(tokens(1), tokens(1), tokens(1))).length, 4)
                self.a.service.moving = 1
                (r,) = await client.extend_sessions([(s, (tokens(1), tokens(1), tokens(1)))])
                self.assertEqual(r.length, 5)
        s_id = s.id
        asyncio.run(main())
        self.assertEqual(self.a.service.moving, 0)
        self.assertEqual(self.a.service.lengths[s_id], 5)

    def test_session_moved_to(self):
        moved = attnserve.StepError(grpc.StatusCode.FAILED_PRECONDITION,
                                    "session moved to 'b:1/i/k': session 'a:1/i/k' was moved")
        self.assertEqual(attnserve.session_moved_to(moved), "b:1/i/k")
        lost = attnserve.StepError(grpc.StatusCode.FAILED_PRECONDITION, "session lost (expired)")
        self.assertEqual(attnserve.session_moved_to(lost), "")
        self.assertEqual(attnserve.session_moved_to(ValueError("session moved to 'b:1/i/k'")), "")

    def test_lost_sessions_are_recognised(self):
        with attnserve.Client(self.a.address) as client:
            s = client.create_session(layout=LAYOUT)
            self.a.service.lengths.clear()  # as an expiry would
            with self.assertRaises(grpc.RpcError) as e:
                s.describe()
            self.assertTrue(attnserve.is_session_lost(e.exception))
            self.assertEqual(attnserve.session_lost_reason(e.exception), "expired")
            self.assertFalse(attnserve.is_session_lost(ValueError("session lost (x)")))

    def test_sessions_are_routed_to_their_owner(self):
        with attnserve.Client([self.a.address, self.b.address]) as client:
            self.assertEqual(client.replicas, [self.a.address, self.b.address])
            sessions = [client.create_session(layout=LAYOUT) for _ in range(4)]
            self.assertEqual(self.a.service.calls["CreateSession"], 2)
            self.assertEqual(self.b.service.calls["CreateSession"], 2)
            for _ in range(3):
                for s in sessions:
                    s.extend(tokens(1), tokens(1), tokens(1))  # misrouted: NOT_FOUND
            self.assertEqual(self.a.service.calls["ExtendSession"], 6)
            self.assertEqual(self.b.service.calls["ExtendSession"], 6)
            self.assertEqual(len(client.list_sessions(replica=self.b.address).sessions), 2)
            with self.assertRaisesRegex(ValueError, "none of this client's addresses"):
                client.list_sessions(replica="10.9.9.9:1")
            for s in sessions:
                s.close()
            self.assertEqual(self.a.service.lengths, {})
            self.assertEqual(self.b.service.lengths, {})

    def test_an_unknown_owner_is_a_clear_error(self):
        with attnserve.Client([self.a.address, self.b.address]) as client:
            s = client.create_session(layout=LAYOUT)
            s.info.session_id = "10.1.2.3:50051/x/1"
            with self.assertRaisesRegex(ValueError, "names owner '10.1.2.3:50051'"):
                s.extend(tokens(1), tokens(1), tokens(1))
            s.info.session_id = "garbage"
            with self.assertRaisesRegex(ValueError, "<owner>/<instance>/<key>"):
                s.describe()
            self.a.service.owner_override = self.b.service.owner_override = "pod-0:50051"
            with self.assertRaisesRegex(ValueError, "whose owner is not that address"):
                client.create_session(layout=LAYOUT)
        with self.assertRaisesRegex(ValueError, "IPv4 or all IPv6"):
            attnserve.Client(["a.example:1", "b.example:1"])

    def test_extend_sessions_is_split_per_replica_and_merged_in_order(self):
        with attnserve.Client([self.a.address, self.b.address]) as client:
            sessions = [client.create_session(layout=LAYOUT) for _ in range(5)]
            steps = [(s, (tokens(i + 1, 10.0 * i), tokens(i + 1), tokens(i + 1)))
                     for i, s in enumerate(sessions)]
            results = client.extend_sessions(steps)
            for i, r in enumerate(results):
                self.assertEqual(r.length, i + 1)
                self.assertEqual(r.output[0, 0, 0], 10.0 * i)
                self.assertEqual(sessions[i].length, i + 1)
            self.assertEqual(self.a.service.calls["ExtendSessions"], 1)
            self.assertEqual(self.b.service.calls["ExtendSessions"], 1)
            steps[2] = (sessions[2], sessions[2].request(tokens(1), tokens(1), tokens(1),
                                                        expected_length=99))
            results = client.extend_sessions(steps)
            self.assertIsInstance(results[2], attnserve.StepError)
            self.assertEqual(results[2].code, grpc.StatusCode.ABORTED)
            self.assertEqual(results[3].length, 8)
            with self.assertRaisesRegex(ValueError, "a second time"):
                client.extend_sessions(steps + [steps[0]])

    def test_a_stream_for_a_session_reaches_its_replica(self):
        with attnserve.Client([self.a.address, self.b.address]) as client:
            for s in [client.create_session(layout=LAYOUT) for _ in range(2)]:
                request = s.request(tokens(2), tokens(2), tokens(2))
                (response,) = list(client.stream_for_session(s.id, [(7, request)]))
                self.assertEqual((response.request_id, response.code), (7, 0), response.message)
                s.applied(response.extend_session)
                self.assertEqual(s.length, 2)
        self.assertEqual(self.a.service.calls["stream"], 1)
        self.assertEqual(self.b.service.calls["stream"], 1)

    def test_asyncio(self):
        async def main():
            async with attnserve.AsyncClient([self.a.address, self.b.address]) as client:
                sessions = [await client.create_session(layout=LAYOUT) for _ in range(4)]
                await asyncio.gather(*(s.extend(tokens(3), tokens(3), tokens(3))
                                       for s in sessions))
                results = await client.extend_sessions(
                    [(s, (tokens(1), tokens(1), tokens(1))) for s in sessions])
                self.assertEqual([r.length for r in results], [4] * 4)
                async with await sessions[0].fork() as child:
                    self.assertEqual((await child.describe()).length, 4)
                for s in sessions:
                    await s.close()
        asyncio.run(main())
        self.assertEqual(self.a.service.lengths, {})
        self.assertEqual(self.b.service.lengths, {})
        self.assertEqual(self.a.service.expected[:2], [0, 0])


if __name__ == "__main__":
    unittest.main()
