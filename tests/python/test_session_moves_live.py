"""The installed package follows sessions moved between live attnserve processes: three servers
B, C and A (A started with --session_peers=<B>,<C>; each names itself in session ids by the
address it listens on) and clients of [A, B, C]. Sessions created on A are moved by
move_session, by an operator's other client (the client then learns of the move from the
answers: the trailing metadata attnserve-session-moved, ExtendSessionResult.moved_to), and by
A's drain on SIGTERM, after which A is gone and the client must find them on B or C, also
for the items of an extend_sessions batch. Every
extend's output equals causal attention over the session's whole sequence computed in float64
here, and each Session takes its new id. No timing windows: A's exit is waited for.

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py).
"""
import asyncio
import unittest

import grpc
import numpy as np

import attnserve
from attnserve import pb

from live_server import LiveServer

HQ, HKV, D, LENGTH = 4, 2, 8, 12
LAYOUT = attnserve.layout(HQ, D, HKV)
TOLERANCE = 2e-5


def causal64(q, k, v):
    """q [Lq, Hq, D], k/v [Lk, Hkv, D] token-major -> [Lq, Hq, D], bottom-right causal, in
    float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lk, hkv, _ = k.shape
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(d)
    allowed = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq
    s = np.where(allowed[None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", w, v)


def eager():
    """A client throttle that rejects every call it may (its draws are all 0)."""
    return attnserve.Throttle(rand=lambda: 0.0)


class Data:
    """One session's tokens q [LENGTH, Hq, D], k and v [LENGTH, Hkv, D]."""

    def __init__(self, rng):
        self.q, self.k, self.v = (rng.standard_normal((LENGTH, h, D)).astype(np.float32)
                                  for h in (HQ, HKV, HKV))

    def tokens(self, a, b):
        return self.q[a:b], self.k[a:b], self.v[a:b]

    def want(self, a, b):
        return causal64(self.q[a:b], self.k[:b], self.v[:b])


class SessionMovesTest(unittest.TestCase):
    def check(self, what, result, data, a, b):
        self.assertNotIsInstance(result, Exception, what)
        self.assertEqual(result.length, b, what)
        np.testing.assert_allclose(result.output, data.want(a, b), atol=TOLERANCE, err_msg=what)

    def moved_answer(self, client, old):
        """The new id a replica answers for `old` (FAILED_PRECONDITION "session moved to")."""
        with self.assertRaises(grpc.RpcError) as e:
            client.stub.GetSession(pb.GetSessionRequest(session_id=old))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        trailers = dict(e.exception.trailing_metadata() or ())
        to = attnserve.session_moved_to(e.exception)
        self.assertEqual(trailers.get("attnserve-session-moved"), to, e.exception.details())
        return to

    def test_sessions_follow_moves_and_a_drain(self):
        b = LiveServer("--backend=cpu")
        c = LiveServer("--backend=cpu")
        a = LiveServer("--backend=cpu", f"--session_peers={b.target},{c.target}")
        servers = [a, b, c]
        try:
            self.run_moves(a, b, c)
        finally:
            for s in servers:
                s.stop()

    def run_moves(self, a, b, c):
        replicas = [a.target, b.target, c.target]
        rng = np.random.default_rng(33)
        data = [Data(rng) for _ in range(5)]
        client = attnserve.Client(replicas)
        on_a = attnserve.Client(a.target)  # an operator's client: `client` knows of its moves
        try:
            # Five sessions on A, each prefilled with 5 tokens through `client`.
            sessions = [attnserve.Session(client, on_a.create_session(layout=LAYOUT).info)
                        for _ in data]
            for i, (s, d) in enumerate(zip(sessions, data)):
                self.assertEqual(attnserve.session_owner(s.id), a.target)
                self.check(f"prefill {i}", s.extend(*d.tokens(0, 5)), d, 0, 5)
            old = [s.id for s in sessions]

            # 0: moved by this client to B, then extended: the client remembers the move.
            moved = client.move_session(old[0], b.target)
            self.assertEqual(attnserve.session_owner(moved.session_id), b.target)
            self.assertGreater(moved.bytes, 0)
            self.check("extend after move_session", sessions[0].extend(*data[0].tokens(5, 6)),
                       data[0], 5, 6)
            self.assertEqual(sessions[0].id, moved.session_id)
            # A and B both answer the old id "moved", naming the new one.
            self.assertEqual(self.moved_answer(on_a, old[0]), moved.session_id)
            with attnserve.Client(b.target) as on_b:
                self.assertEqual(self.moved_answer(on_b, old[0]), moved.session_id)

            # 1: moved to C behind the client's back, then extended in a batch under its old id
            # beside 0 (on B) and 2 (on A): its item follows moved_to; all merged in place.
            to_c = on_a.move_session(old[1], c.target).session_id
            self.assertEqual(attnserve.session_owner(to_c), c.target)
            results = client.extend_sessions(
                [(sessions[i], data[i].tokens(n, n + 1)) for i, n in ((0, 6), (1, 5), (2, 5))])
            self.check("batch item 0 (on B)", results[0], data[0], 6, 7)
            self.check("batch item 1 (moved to C)", results[1], data[1], 5, 6)
            self.check("batch item 2 (on A)", results[2], data[2], 5, 6)
            self.assertEqual(sessions[1].id, to_c)
            self.assertEqual(sessions[2].id, old[2])

            # A fresh client (no memory of moves) extends 1 under its old id: A answers "moved",
            # and the call is sent again to C.
            with attnserve.Client(replicas) as fresh:
                stale = attnserve.Session(fresh, pb.SessionInfo(session_id=old[1], length=6))
                self.check("fresh client, old id", stale.extend(*data[1].tokens(6, 7)),
                           data[1], 6, 7)
                self.assertEqual(stale.id, to_c)
            sessions[1].info.length = 7

            # 3 (asyncio): moved to B by the operator; a fresh AsyncClient's batch under the old
            # id follows moved_to, and its extend then goes to B directly.
            to_b = on_a.move_session(old[3], b.target).session_id
            asyncio.run(self.async_follows(replicas, old[3], to_b, data[3]))
            sessions[3].info.length = 7

            # A drains on SIGTERM: it moves 2 and 4 to its peers and exits.
            a.process.terminate()
            self.assertEqual(a.process.wait(timeout=240), 0, a.log())
            # 2's extend (it carries expected_length) finds A gone, asks B and C, is sent again.
            self.check("extend after A's drain", sessions[2].extend(*data[2].tokens(6, 7)),
                       data[2], 6, 7)
            self.assertIn(attnserve.session_owner(sessions[2].id), (b.target, c.target))
            # 4 through fresh clients: a fork is not sent again (UNAVAILABLE, the move
            # remembered), its retry is; describe (GetSession) is sent again at once.
            with attnserve.Client(replicas) as fresh:
                stale = attnserve.Session(fresh, pb.SessionInfo(session_id=old[4], length=5))
                with self.assertRaises(grpc.RpcError) as e:
                    stale.fork()
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                with stale.fork() as child:
                    self.assertIn(attnserve.session_owner(child.id), (b.target, c.target))
                    self.assertEqual(child.length, 5)
            with attnserve.Client(replicas) as fresh:
                stale = attnserve.Session(fresh, pb.SessionInfo(session_id=old[4], length=5))
                info = stale.describe()
                self.assertEqual(info.length, 5)
                self.assertIn(attnserve.session_owner(stale.id), (b.target, c.target))
            self.check("session 4 after A's drain", sessions[4].extend(*data[4].tokens(5, 7)),
                       data[4], 5, 7)

            # A batch through a fresh client naming 3 and 4 by their ids on A (gone) and 0 by
            # its id on B: the call to A fails as a whole, its items are looked for on B and C
            # and sent again; every item answered in place. Then an asyncio client's batch of
            # 3 alone under its id on A (the one call fails; the item is found and sent again).
            # Fresh clients whose throttle rejects every call it may (rand() = 0): the attempt
            # that finds A gone counts as refused, and the ones sent again to where the
            # sessions went are the same call of the application's, never throttled.
            with attnserve.Client(replicas, throttle=eager()) as fresh:
                ids = {3: old[3], 4: old[4], 0: sessions[0].id}
                stale = {i: attnserve.Session(fresh, pb.SessionInfo(session_id=x, length=7))
                         for i, x in ids.items()}
                results = fresh.extend_sessions([(stale[i], data[i].tokens(7, 8)) for i in ids])
                for i, r in zip(ids, results):
                    self.check(f"batch after A's drain, item {i}", r, data[i], 7, 8)
                    self.assertIn(attnserve.session_owner(stale[i].id), (b.target, c.target))
                self.assertEqual(stale[0].id, sessions[0].id)
                self.assertEqual(stale[3].id, to_b)
            with attnserve.Client(replicas, throttle=eager()) as fresh:
                stale2 = attnserve.Session(fresh, pb.SessionInfo(session_id=old[2], length=7))
                self.check("fresh client's extend after A's drain",
                           stale2.extend(*data[2].tokens(7, 8)), data[2], 7, 8)
                self.assertEqual(stale2.id, sessions[2].id)
                self.assertEqual(fresh.throttle.counts(), (2, 1))
            asyncio.run(self.async_batch_after_drain(replicas, old[3], to_b, data[3]))
            sessions[0].info.length = sessions[2].info.length = sessions[4].info.length = 8
            sessions[3].info.length = 9

            # Every session now lives on B or C (describe finds 3, which `client` did not see
            # move, with A gone), and closes there.
            for s in sessions:
                s.describe()
            lengths = {s.id: s.length for s in sessions}
            self.assertEqual(lengths[to_b], 9)
            listed = [x for r in (b.target, c.target)
                      for x in client.list_sessions(replica=r).sessions]
            self.assertEqual({x.session_id: x.length for x in listed}, lengths)
            for s in sessions:
                s.close()
            for r in (b.target, c.target):
                self.assertEqual(client.list_sessions(replica=r).usage.sessions, 0)
        finally:
            client.close()
            on_a.close()

    async def async_follows(self, replicas, old, new, data):
        async with attnserve.AsyncClient(replicas) as client:
            s = attnserve.AsyncSession(client, pb.SessionInfo(session_id=old, length=5))
            (r,) = await client.extend_sessions([(s, data.tokens(5, 6))])
            self.check("asyncio batch, old id", r, data, 5, 6)
            self.assertEqual(s.id, new)
            self.check("asyncio extend", await s.extend(*data.tokens(6, 7)), data, 6, 7)

    async def async_batch_after_drain(self, replicas, old, new, data):
        async with attnserve.AsyncClient(replicas, throttle=eager()) as client:
            s = attnserve.AsyncSession(client, pb.SessionInfo(session_id=old, length=8))
            (r,) = await client.extend_sessions([(s, data.tokens(8, 9))])
            self.check("asyncio batch after A's drain", r, data, 8, 9)
            self.assertEqual(s.id, new)


if __name__ == "__main__":
    unittest.main()
