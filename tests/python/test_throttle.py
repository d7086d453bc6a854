"""The installed package's client-side adaptive throttling (attnserve.throttle), with no server:
the shared cases of tests/testing/throttle_cases.json (the Node.js client runs the same) on a
fake clock and fake random draws; the options' checks; the pushback trailer's parsing; and
Client / AsyncClient with fake stubs: answers UNAVAILABLE make them reject compute calls
locally (nothing sent), INVALID_ARGUMENT answers never do, control calls are never throttled
nor counted, throttle=None turns it off, extend_sessions turns a rejected replica call into
StepErrors. Then an in-process grpc server, so that the pushback trailer comes through real
gRPC: a refusal carrying grpc-retry-pushback-ms holds back the next calls, sync and asyncio.

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py);
ATTNSERVE_THROTTLE_CASES names the cases file (default: beside this file's folder, for a run
from the source tree).
"""
import asyncio
import json
import os
import threading
import unittest
from concurrent import futures

import grpc
import grpc.aio
import numpy as np

import attnserve
from attnserve import pb, pb_grpc
from attnserve.throttle import (Throttle, ThrottleOptions, ThrottledError, parse_pushback,
                                pushback_value, is_accept)

CASES = os.environ.get("ATTNSERVE_THROTTLE_CASES") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "testing", "throttle_cases.json")
ADVICE = "; retry later or disable with throttle=None"


class FakeClock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class FakeRand:
    """Hands out the draws queued; drawing with none queued fails the test."""

    def __init__(self):
        self.queue = []

    def __call__(self):
        if not self.queue:
            raise AssertionError("the throttle drew a random number where none was expected")
        return self.queue.pop(0)


class SharedCasesTest(unittest.TestCase):
    def test_cases(self):
        with open(CASES) as f:
            cases = json.load(f)["cases"]
        self.assertGreater(len(cases), 10)
        for case in cases:
            with self.subTest(case=case["name"]):
                self.run_case(case)

    def run_case(self, case):
        clock, rand = FakeClock(), FakeRand()
        options = ThrottleOptions(enabled=case.get("enabled", True), k=case.get("k", 2.0),
                                  window_seconds=case.get("window_seconds", 30),
                                  max_probability=case.get("max_probability", 0.95))
        throttle = Throttle(options, clock=clock, rand=rand)
        for i, event in enumerate(case["events"]):
            where = f"event {i} {event}"
            clock.t = event["t"]
            if "p" in event:
                self.assertAlmostEqual(throttle.probability(), event["p"], delta=1e-9, msg=where)
            if "requests" in event or "accepts" in event:
                self.assertEqual(throttle.counts(), (event["requests"], event["accepts"]), where)
            if "record" in event:
                for _ in range(event.get("times", 1)):
                    throttle.record(grpc.StatusCode[event["record"]], event.get("pushback"))
            if "check" in event:
                if "rand" in event:
                    rand.queue.append(event["rand"])
                reason = throttle.check()
                self.assertEqual(rand.queue, [], f"{where}: the draw was not made")
                if event["check"] == "send":
                    self.assertIsNone(reason, where)
                    continue
                self.assertIsNotNone(reason, where)
                if "message" in event:
                    self.assertEqual(reason, event["message"] + ADVICE, where)
                kind = "grpc-retry-pushback-ms" if event["check"] == "pushback" else "k="
                self.assertIn(kind, reason, where)


class OptionsTest(unittest.TestCase):
    def test_defaults(self):
        self.assertEqual(ThrottleOptions(), ThrottleOptions(enabled=True, k=2.0,
                                                            window_seconds=30,
                                                            max_probability=0.95))
        client = attnserve.Client("127.0.0.1:1")
        self.assertIsInstance(client.throttle, Throttle)
        self.assertEqual(client.throttle.options, ThrottleOptions())
        client.close()

    def test_off(self):
        for off in (None, False, ThrottleOptions(enabled=False)):
            with attnserve.Client("127.0.0.1:1", throttle=off) as client:
                self.assertIsNone(client.throttle, off)

    def test_bad_values_name_the_field(self):
        for options, message in [
                (ThrottleOptions(k=0.5), "throttle.k must be >= 1; was 0.5"),
                (ThrottleOptions(k=float("nan")), "throttle.k must be >= 1; was NaN"),
                (ThrottleOptions(k=float("inf")), "throttle.k must be finite; was Infinity"),
                (ThrottleOptions(k="2"), "throttle.k must be a number; was '2'"),
                (ThrottleOptions(enabled=False, k=0), "throttle.k must be >= 1; was 0"),
                (ThrottleOptions(window_seconds=0),
                 "throttle.window_seconds must be an integer >= 1; was 0"),
                (ThrottleOptions(window_seconds=1.5),
                 "throttle.window_seconds must be an integer >= 1; was 1.5"),
                (ThrottleOptions(max_probability=0),
                 "throttle.max_probability must be above 0 and at most 1; was 0"),
                (ThrottleOptions(max_probability=1.5),
                 "throttle.max_probability must be above 0 and at most 1; was 1.5"),
                (ThrottleOptions(max_probability=float("nan")),
                 "throttle.max_probability must be above 0 and at most 1; was NaN"),
                (ThrottleOptions(max_probability="1"),
                 "throttle.max_probability must be a number; was '1'")]:
            with self.subTest(options=options):
                with self.assertRaises(ValueError) as e:
                    attnserve.Client("127.0.0.1:1", throttle=options)
                self.assertEqual(str(e.exception), message)
        with self.assertRaisesRegex(TypeError, "throttle must be a ThrottleOptions"):
            attnserve.Client("127.0.0.1:1", throttle={"k": 2})

    def test_pushback_parsing(self):
        self.assertEqual(parse_pushback("250"), 250)
        self.assertEqual(parse_pushback(b"0"), 0)
        for bad in (None, "", "-1", "1.5", " 1", "\u0663", b"\xff", 250):
            self.assertIsNone(parse_pushback(bad), repr(bad))
        # grpc's _Metadatum (sync) and grpc.aio.Metadata (async) both iterate as pairs.
        self.assertEqual(pushback_value((("x", "1"), ("grpc-retry-pushback-ms", "5"),
                                         ("grpc-retry-pushback-ms", "9"))), "5")
        self.assertEqual(pushback_value(grpc.aio.Metadata(("grpc-retry-pushback-ms", "7"))),
                         "7")
        self.assertIsNone(pushback_value(None))
        self.assertIsNone(pushback_value((("x", "1"),)))

    def test_accepts(self):
        self.assertFalse(is_accept(grpc.StatusCode.UNAVAILABLE))
        self.assertFalse(is_accept(grpc.StatusCode.DEADLINE_EXCEEDED))
        for code in grpc.StatusCode:
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.assertTrue(is_accept(code), code)

    def test_error(self):
        e = ThrottledError("throttled by the client: why")
        self.assertIsInstance(e, grpc.RpcError)
        self.assertIsInstance(e, grpc.aio.AioRpcError)
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(e.details(), "throttled by the client: why")
        self.assertIn("throttled by the client: why", str(e))
        self.assertFalse(attnserve.is_session_lost(e))


class ThreadsTest(unittest.TestCase):
    def test_one_throttle_for_many_threads(self):
        # Client is thread-safe, so its throttle must be: no count is lost between threads.
        throttle = Throttle(clock=FakeClock(), rand=lambda: 0.0)
        codes = (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
        rejected = [0] * 8

        def work(i):
            for n in range(2000):
                throttle.record(codes[(i + n) % 3])
                rejected[i] += throttle.check() is not None
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        recorded_ok = sum(1 for i in range(8) for n in range(2000) if (i + n) % 3 == 0)
        self.assertGreater(sum(rejected), 0)
        self.assertEqual(throttle.counts(), (16000 + sum(rejected), recorded_ok))


class FakeError(grpc.RpcError):
    """What grpc raises for a failed call, as far as the client looks."""

    def __init__(self, code, details="", trailers=()):
        super().__init__(details)
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


def attend_response():
    return pb.AttendResponse(output=attnserve.to_tensor(np.zeros((1, 1, 1, 2), np.float32)))


def session_response(length):
    return pb.ExtendSessionResponse(
        output=attnserve.to_tensor(np.zeros((1, 1, 2), np.float32)), length=length)


class FakeStub:
    """Answers each rpc with `answers[rpc]` (a response, or an exception to raise) and counts
    the calls that reached it. Methods are coroutines with is_async."""

    def __init__(self, is_async=False):
        self.is_async = is_async
        self.calls = {}
        self.answers = {
            "Attend": attend_response(),
            "MultiHeadAttention": attend_response(),
            "GetServerInfo": pb.GetServerInfoResponse(version="fake"),
            "ListModules": pb.ListModulesResponse(),
            "CreateSession": pb.CreateSessionResponse(
                session=pb.SessionInfo(session_id="o/i/1")),
            "ExtendSession": session_response(1),
            "ExtendSessions": pb.ExtendSessionsResponse(results=[
                pb.ExtendSessionResult(code=0, response=session_response(1))]),
            "GetSession": pb.GetSessionResponse(session=pb.SessionInfo(session_id="o/i/1")),
            "CloseSession": pb.CloseSessionResponse(),
        }

    def __getattr__(self, rpc):
        if rpc not in self.answers:
            raise AttributeError(rpc)

        def answer():
            self.calls[rpc] = self.calls.get(rpc, 0) + 1
            a = self.answers[rpc]
            if isinstance(a, BaseException):
                raise a
            return a

        if self.is_async:
            async def call(request, **kw):
                return answer()
            return call
        return lambda request, **kw: answer()


def fake_client(cls=attnserve.Client, **kw):
    """(client, stub, clock, rand): `cls` with a FakeStub instead of its channel's."""
    clock, rand = FakeClock(100.0), FakeRand()
    throttle = Throttle(ThrottleOptions(**kw), clock=clock, rand=rand)
    client = cls("127.0.0.1:1", throttle=throttle)
    client.stub = FakeStub(is_async=cls is attnserve.AsyncClient)
    return client, client.stub, clock, rand


Q = np.zeros((1, 1, 1, 2), np.float32)
X = np.zeros((1, 1, 2), np.float32)
UNAVAILABLE = FakeError(grpc.StatusCode.UNAVAILABLE, "overloaded")


class FakeStubClientTest(unittest.TestCase):
    def test_refusals_make_it_reject_locally(self):
        client, stub, clock, rand = fake_client()
        stub.answers["Attend"] = UNAVAILABLE
        rand.queue += [0.99, 0.99]  # p = 0 (no draw), then 1/2 and 2/3: each goes through
        for _ in range(3):
            with self.assertRaises(grpc.RpcError) as e:
                client.attend(Q, Q, Q)
            self.assertEqual(e.exception.details(), "overloaded")
        self.assertEqual(rand.queue, [])
        self.assertEqual(stub.calls["Attend"], 3)
        self.assertEqual(client.throttle.counts(), (3, 0))
        self.assertAlmostEqual(client.throttle.probability(), 0.75)
        rand.queue.append(0.74)
        with self.assertRaises(ThrottledError) as e:
            client.attend(Q, Q, Q)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(e.exception.details(),
                         "throttled by the client: the server accepted 0 of the last 3 calls "
                         "in 30 s (adaptive throttling, k=2)" + ADVICE)
        self.assertEqual(stub.calls["Attend"], 3, "a rejected call reached the stub")
        self.assertEqual(client.throttle.counts(), (4, 0))
        # multi_head_attention and a session's extend share the throttle.
        rand.queue.append(0.0)
        with self.assertRaises(ThrottledError):
            client.multi_head_attention("demo", X)
        self.assertNotIn("MultiHeadAttention", stub.calls)
        session = client.create_session(layout=attnserve.layout(1, 2))
        rand.queue.append(0.0)
        with self.assertRaises(ThrottledError):
            session.extend(X, X, X)
        self.assertNotIn("ExtendSession", stub.calls)
        self.assertEqual(session.length, 0)
        # The control calls go through all along, uncounted.
        self.assertEqual(client.server_info().version, "fake")
        client.list_modules()
        session.describe()
        session.close()
        self.assertEqual(client.throttle.counts(), (6, 0))
        # A window later the refusals are forgotten.
        clock.t += 30
        self.assertEqual(client.throttle.probability(), 0)
        stub.answers["Attend"] = attend_response()
        client.attend(Q, Q, Q)
        self.assertEqual(client.throttle.counts(), (1, 1))

    def test_invalid_argument_never_throttles(self):
        client, stub, _, _ = fake_client()
        stub.answers["Attend"] = FakeError(grpc.StatusCode.INVALID_ARGUMENT, "query.shape")
        stub.answers["ExtendSession"] = FakeError(grpc.StatusCode.NOT_FOUND, "no session")
        session = client.create_session(layout=attnserve.layout(1, 2))
        for _ in range(200):  # FakeRand fails the test if the throttle as much as draws
            with self.assertRaises(grpc.RpcError) as e:
                client.attend(Q, Q, Q)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            with self.assertRaises(grpc.RpcError) as e:
                session.extend(X, X, X)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(stub.calls["Attend"], 200)
        self.assertEqual(client.throttle.counts(), (400, 400))

    def test_deadline_exceeded_counts_as_a_refusal(self):
        client, stub, _, _ = fake_client()
        stub.answers["Attend"] = FakeError(grpc.StatusCode.DEADLINE_EXCEEDED, "late")
        with self.assertRaises(grpc.RpcError):
            client.attend(Q, Q, Q)
        self.assertEqual(client.throttle.counts(), (1, 0))

    def test_off(self):
        client = attnserve.Client("127.0.0.1:1", throttle=None)
        client.stub = stub = FakeStub()
        stub.answers["Attend"] = UNAVAILABLE
        for _ in range(50):
            with self.assertRaises(grpc.RpcError) as e:
                client.attend(Q, Q, Q)
            self.assertNotIsInstance(e.exception, ThrottledError)
        self.assertEqual(stub.calls["Attend"], 50)

    def test_pushback_trailer(self):
        client, stub, clock, _ = fake_client()
        stub.answers["Attend"] = FakeError(grpc.StatusCode.UNAVAILABLE, "overloaded",
                                           [("grpc-retry-pushback-ms", "1500")])
        with self.assertRaises(grpc.RpcError):
            client.attend(Q, Q, Q)
        stub.answers["Attend"] = attend_response()
        clock.t += 1.25
        with self.assertRaises(ThrottledError) as e:
            client.attend(Q, Q, Q)
        self.assertEqual(e.exception.details(),
                         "throttled by the client: the server asked for no calls for 1500 ms "
                         "(grpc-retry-pushback-ms)" + ADVICE)
        self.assertEqual(stub.calls["Attend"], 1)
        clock.t += 0.25
        client.throttle._rand = lambda: 0.99  # p is 2/3 now
        client.attend(Q, Q, Q)
        self.assertEqual(stub.calls["Attend"], 2)

    def test_extend_sessions_over_replicas(self):
        # Two replicas: the throttle is the client's, one for both, and judges an
        # extend_sessions once, as one call of the application's: rejected, no replica's call
        # is sent and ThrottledError is raised; admitted, each replica's call is sent and its
        # answer counted.
        clock, rand = FakeClock(), FakeRand()
        client = attnserve.Client(["10.0.0.1:1", "10.0.0.2:1"],
                                  throttle=Throttle(clock=clock, rand=rand))
        stubs = [FakeStub(), FakeStub()]
        client._replica_stubs = stubs
        stubs[0].answers["CreateSession"] = pb.CreateSessionResponse(
            session=pb.SessionInfo(session_id="10.0.0.1:1/i/1"))
        stubs[1].answers["CreateSession"] = pb.CreateSessionResponse(
            session=pb.SessionInfo(session_id="10.0.0.2:1/i/1"))
        a = client.create_session(layout=attnserve.layout(1, 2))
        b = client.create_session(layout=attnserve.layout(1, 2))
        client.throttle.record(grpc.StatusCode.UNAVAILABLE)  # p = 1/2
        rand.queue.append(0.1)  # rejected
        with self.assertRaises(ThrottledError) as e:
            client.extend_sessions([(a, (X, X, X)), (b, (X, X, X))])
        self.assertTrue(e.exception.details().startswith("throttled by the client"))
        for stub in stubs:
            self.assertNotIn("ExtendSessions", stub.calls)
        self.assertEqual(client.throttle.counts(), (2, 0))  # p = 2/3
        rand.queue.append(0.9)  # admitted: both replicas' calls
        out = client.extend_sessions([(a, (X, X, X)), (b, (X, X, X))])
        self.assertIsInstance(out[0], attnserve.SessionResult)
        self.assertIsInstance(out[1], attnserve.SessionResult)
        for stub in stubs:
            self.assertEqual(stub.calls["ExtendSessions"], 1)
        self.assertEqual(client.throttle.counts(), (4, 2))
        self.assertEqual(rand.queue, [])


class FakeStubAsyncClientTest(unittest.TestCase):
    def test_refusals_make_it_reject_locally(self):
        async def main():
            client, stub, clock, rand = fake_client(attnserve.AsyncClient)
            stub.answers["Attend"] = UNAVAILABLE
            with self.assertRaises(grpc.RpcError):
                await client.attend(Q, Q, Q)
            rand.queue.append(0.4)  # p = 1/2
            with self.assertRaises(grpc.aio.AioRpcError) as e:
                await client.attend(Q, Q, Q)
            self.assertIsInstance(e.exception, ThrottledError)
            self.assertEqual(stub.calls["Attend"], 1)
            rand.queue.append(0.0)
            with self.assertRaises(ThrottledError):
                await client.multi_head_attention("demo", X)
            session = await client.create_session(layout=attnserve.layout(1, 2))
            rand.queue.append(0.0)
            with self.assertRaises(ThrottledError):
                await session.extend(X, X, X)
            rand.queue.append(0.0)
            with self.assertRaises(ThrottledError):
                await client.extend_sessions([(session, (X, X, X))])
            self.assertEqual(set(stub.calls), {"Attend", "CreateSession"})
            self.assertEqual((await client.server_info()).version, "fake")
            await session.close()
            self.assertEqual(client.throttle.counts(), (5, 0))
            # INVALID_ARGUMENT answers: accepts, however many.
            stub.answers["Attend"] = FakeError(grpc.StatusCode.INVALID_ARGUMENT, "bad")
            clock.t += 30
            for _ in range(100):
                with self.assertRaises(grpc.RpcError) as e:
                    await client.attend(Q, Q, Q)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(client.throttle.counts(), (100, 100))
            await client.close()
        asyncio.run(main())


class Refusing(pb_grpc.AttentionServiceServicer):
    """Answers Attend with `code`, and with the pushback trailer when `pushback` is set."""

    def __init__(self):
        self.code = grpc.StatusCode.UNAVAILABLE
        self.pushback = None
        self.calls = 0
        self.lock = threading.Lock()

    def Attend(self, request, context):
        with self.lock:
            self.calls += 1
        if self.pushback is not None:
            context.set_trailing_metadata((("grpc-retry-pushback-ms", self.pushback),))
        if self.code == grpc.StatusCode.OK:
            return attend_response()
        context.abort(self.code, "refused")


class InProcessServerTest(unittest.TestCase):
    """The trailer as real gRPC delivers it, to the sync and the asyncio client."""

    def setUp(self):
        self.servicer = Refusing()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_AttentionServiceServicer_to_server(self.servicer, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()
        self.clock, self.rand = FakeClock(), FakeRand()

    def tearDown(self):
        self.server.stop(None)

    def throttle(self):
        return Throttle(clock=self.clock, rand=self.rand)

    def test_sync_pushback(self):
        self.servicer.pushback = "20000"
        with attnserve.Client(self.address, throttle=self.throttle(), timeout=10) as client:
            with self.assertRaises(grpc.RpcError) as e:
                client.attend(Q, Q, Q)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertNotIsInstance(e.exception, ThrottledError)
            for _ in range(3):
                with self.assertRaises(ThrottledError) as e:
                    client.attend(Q, Q, Q)
                self.assertIn("20000 ms (grpc-retry-pushback-ms)", e.exception.details())
            self.assertEqual(self.servicer.calls, 1)
            self.clock.t = 20
            self.servicer.code = grpc.StatusCode.OK
            self.rand.queue.append(0.99)  # p = 1/2: the calls held back were not counted
            client.attend(Q, Q, Q)
            self.assertEqual(self.rand.queue, [])
            self.assertEqual(self.servicer.calls, 2)
            self.assertEqual(client.throttle.counts(), (2, 1))

    def test_sync_invalid_argument_and_ignored_pushback(self):
        # An unparseable value reaches the client as a negative one: ignored.
        self.servicer.code = grpc.StatusCode.INVALID_ARGUMENT
        self.servicer.pushback = "soon"
        with attnserve.Client(self.address, throttle=self.throttle(), timeout=10) as client:
            for _ in range(20):
                with self.assertRaises(grpc.RpcError) as e:
                    client.attend(Q, Q, Q)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(self.servicer.calls, 20)
            self.assertEqual(client.throttle.counts(), (20, 20))

    def test_async_pushback(self):
        self.servicer.pushback = "2500"

        async def main():
            async with attnserve.AsyncClient(self.address, throttle=self.throttle(),
                                             timeout=10) as client:
                with self.assertRaises(grpc.aio.AioRpcError) as e:
                    await client.attend(Q, Q, Q)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertNotIsInstance(e.exception, ThrottledError)
                self.clock.t = 2.4
                with self.assertRaises(ThrottledError) as e:
                    await client.attend(Q, Q, Q)
                self.assertIn("2500 ms", e.exception.details())
                self.assertEqual(self.servicer.calls, 1)
                self.clock.t = 2.5
                self.rand.queue.append(0.99)  # p = 2/3
                with self.assertRaises(grpc.aio.AioRpcError):
                    await client.attend(Q, Q, Q)
                self.assertEqual(self.servicer.calls, 2)
                self.assertEqual(self.rand.queue, [])
        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
